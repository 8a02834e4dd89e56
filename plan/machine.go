package plan

import (
	"fmt"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/memory"
)

// CheckMachine is a finetune.MemoryCheck: it plans the training step of the run's config on its loaded model (the way `finetune memory` does, from shapes)
// and refuses it, naming both figures, when its planned total -- the step's peak with the weights, gradients and
// the optimizer state -- is larger than the memory of this machine (memory.MachineBytes: physical memory or the
// cgroup limit, or $MEMFIT_MEMORY_LIMIT). It checks the pure-Go backend only, whose step runs in this process's
// memory and whose plan is exact (a simulation of its buffer pool); on XLA the device's memory is the limit and
// the plugin reports running out itself. The data gives the batch's sequence length when it is a Loader of text.
func CheckMachine(s finetune.Setup) error {
	backend, model, cfg, data := s.Backend, s.Model, s.Config, s.Data
	if backend.Name() == "xla" {
		return nil
	}
	limit, ok, err := memory.MachineBytes()
	if err != nil || !ok {
		return err
	}
	in := finetune.Shape{Batch: cfg.BatchSize}
	if l, isLoader := data.(*finetune.Loader); isLoader {
		in.Seq = sequenceLength(l.Data)
		_, in.Packed = l.Data["position_ids"] // packed sequences (--packing): their mask is per row
	}
	if _, known := finetune.FamilyOf(model); !known || hasSequence(model) && in.Seq == 0 {
		return nil // a model the planner does not know, or a LLaMA run whose sequence length is not known before its data is read
	}
	// A config the plan cannot be built for is left to finetune.New, which names the cause.
	if err := finetune.ApplyBlockPlan(model, cfg); err != nil {
		return nil
	}
	plan, err := Step(backend, model, finetune.ParamShapes(model, cfg), cfg, in)
	if err != nil {
		return nil
	}
	if plan.TotalBytes <= limit {
		return nil
	}
	what := fmt.Sprintf("batch %d", in.Batch)
	if in.Seq > 0 {
		what += fmt.Sprintf(" x %d tokens", in.Seq)
	}
	return fmt.Errorf("the training step needs %s (planned: the step's peak %s with the weights, plus %s of optimizer state; %s, method %s, %s) but this machine has %s: lower --batch-size or the sequence length, or use a lighter method or the memory-saving options (finetune memory compares them); $%s sets the limit",
		memory.FormatBytes(plan.TotalBytes), memory.FormatBytes(plan.PeakBytes), memory.FormatBytes(plan.OptimizerBytes),
		what, cfg.Method, cfg.ComputeDType, memory.FormatBytes(limit), memory.LimitEnv)
}
