package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/memfit/memfit/bench"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/plan"
)

// autopilotCaseNames are bench autopilot's cases: the CPU grid's scaled models (run) and the full-size presets
// (planned).
var autopilotCaseNames = []string{"vit", "llama", "vit-b16", "llama-1b"}

func newBenchAutopilotCommand(opts *Options) *cobra.Command {
	var out, workDir, memfitBin, invocation, method string
	var caseList []string
	var fractions []float64
	var steps, rounds, calibSteps, vitBatch, llamaBatch, llamaSeq int
	var overwrite bool
	margin := 0.05
	cmd := &cobra.Command{
		Use:   "autopilot [--out DIR]",
		Short: "The memory autopilot against global options at 95/80/65/50% of plain's memory, one run",
		Long: `For each case and each budget (a fraction of plain's planned total), chooses the per-block plan as
"finetune train --budget" does (MS-norm on, the modes timed in this process on the case's random batch, the search
checked by the exact planner, --budget-margin kept free), then trains every global option (plain, uniform
gradient checkpointing, and each autopilot mode on every block with MS-norm) and every plan that is none of them,
each in its own process ("finetune bench step"), for its peak and its throughput, in --rounds rounds over all of
them (a configuration's step is the median of its rounds' medians); and says for each budget whether
the plan's peak fits and how its throughput compares with uniform gradient checkpointing and with the fastest
global option that fits.
Cases: vit and llama, the CPU grid's scaled models (run); vit-b16 (batch --vit-batch-size) and llama-1b
(--llama-batch-size x --llama-seq-len), bfloat16, planned only (exact memory; step times are the scaled
sibling's measured ratios). The peak is the process's own: the XLA device's peak bytes in use, the buffer-pool
counter in the tools/peakmem build, else the Go executor's liveness simulation (the output names which).
Writes DIR/autopilot.txt, DIR/autopilot.json and each process's JSON and log under DIR/processes.`,
		Example: `  cd tools/peakmem && ./setup.sh && GOTOOLCHAIN=go1.27.3 GOEXPERIMENT=simd GOFLAGS=-mod=mod go build -o /tmp/finetune-peak ./cmd/finetune-peak && cd ../..
  /tmp/finetune-peak bench autopilot --out docs/benchmarks/autopilot-cpu`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if steps < 1 || rounds < 1 || calibSteps < 1 {
				return usagef("--steps, --rounds and --calibration-steps must be at least 1")
			}
			if !(margin >= 0 && margin < 1) {
				return usagef("--budget-margin must be in [0, 1), got %g", margin)
			}
			for _, f := range fractions {
				if !(f > 0 && f <= 1) {
					return usagef("--budgets are fractions of plain's total in (0, 1], got %g", f)
				}
			}
			grid, err := bench.GridMethodByName(method)
			if err != nil {
				return usageError{err}
			}
			if grid.Name == "full" {
				return usagef("--method: the autopilot benchmark compares LoRA-family plans; use lora-qv, lora-all, lora-fa or qlora")
			}
			for _, k := range caseList {
				if !slices.Contains(autopilotCaseNames, k) {
					return usagef("unknown case %q: use %s", k, strings.Join(autopilotCaseNames, ", "))
				}
			}
			ins := inputs{}.add("--memfit-bin", memfitBin).add("--work-dir", workDir)
			if err := outputFolder("--out", out, []string{"autopilot.txt", "autopilot.json", "processes/"}, ins, overwrite, true); err != nil {
				return err
			}
			if memfitBin == "" {
				if memfitBin, err = os.Executable(); err != nil {
					return err
				}
			}
			if workDir == "" {
				d, err := os.MkdirTemp("", "memfit-autopilot-bench-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(d)
				workDir = d
			}
			procDir := filepath.Join(out, "processes")
			if err := os.MkdirAll(procDir, 0o755); err != nil {
				return err
			}
			cases, err := autopilotCases(workDir, caseList, grid, vitBatch, llamaBatch, llamaSeq)
			if err != nil {
				return err
			}
			backend, err := opts.NewBackend()
			if err != nil {
				return err
			}
			defer backend.Finalize()
			child := []string{memfitBin}
			if opts.Backend != "" {
				child = append(child, "--backend", opts.Backend)
			}
			env := os.Environ()
			if engine.FMAWorkaround() {
				env = engine.WithFMAWorkaround(env)
			}
			cacheDir, err := os.MkdirTemp("", "memfit-calibration-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(cacheDir)
			run, err := bench.RunAutopilot(bench.AutopilotOptions{Backend: backend, Cases: cases, Fractions: fractions, Margin: margin,
				CalibSteps: calibSteps, Steps: steps, Rounds: rounds, Runner: bench.StepProcess(child, env, procDir, steps),
				Cache: &plan.CalibrationCache{Path: filepath.Join(cacheDir, "calibration.json")}, Log: cmd.ErrOrStderr()})
			if err != nil {
				return err
			}
			if invocation == "" {
				invocation = "finetune " + strings.Join(os.Args[1:], " ")
			}
			run.Command = invocation
			return writeBenchRun(cmd, filepath.Join(out, "autopilot"), run, run.Problems, func(w io.Writer) error { return bench.WriteAutopilotRun(w, run) })
		},
	}
	f := cmd.Flags()
	f.StringVar(&out, "out", "bench-autopilot-out", "folder for autopilot.txt, autopilot.json and processes/")
	f.BoolVar(&overwrite, "overwrite", false, "replace the results of an earlier run in --out")
	f.StringSliceVar(&caseList, "cases", autopilotCaseNames, "cases: vit and llama (run, CPU-scaled), vit-b16 and llama-1b (planned; need their sibling)")
	f.Float64SliceVar(&fractions, "budgets", bench.AutopilotFractions, "budgets as fractions of plain's planned total")
	f.Float64Var(&margin, "budget-margin", margin, "fraction of each budget the autopilot keeps free")
	f.IntVar(&steps, "steps", 4, "timed steps of each configuration's process, after one warm-up step")
	f.IntVar(&rounds, "rounds", 3, "rounds over the configurations, each running every configuration's process once")
	f.IntVar(&calibSteps, "calibration-steps", calibrationSteps, "the autopilot's timed calibration steps per mode")
	f.StringVar(&method, "method", "lora-all", "lora-qv, lora-all, lora-fa or qlora")
	f.IntVar(&vitBatch, "vit-batch-size", 64, "vit-b16's examples per step (planned)")
	f.IntVar(&llamaBatch, "llama-batch-size", 4, "llama-1b's sequences per step (planned)")
	f.IntVar(&llamaSeq, "llama-seq-len", 512, "llama-1b's tokens per sequence (planned)")
	f.StringVar(&workDir, "work-dir", "", "folder for the scaled models' checkpoints (default: a temporary one, removed after)")
	f.StringVar(&memfitBin, "memfit-bin", "", "memfit binary for the measured processes (default: this one)")
	f.StringVar(&invocation, "invocation", "", "the command line to print")
	_ = f.MarkHidden("invocation")
	return cmd
}

// autopilotCases builds the cases named in names (run cases' scaled checkpoints written into dir), each planned
// case after its sibling.
func autopilotCases(dir string, names []string, method bench.GridMethod, vitBatch, llamaBatch, llamaSeq int) ([]bench.AutopilotCase, error) {
	tms, err := bench.ScaledModels(dir)
	if err != nil {
		return nil, err
	}
	full := finetune.Defaults()
	full.ComputeDType, full.Attention = "bfloat16", "memory-efficient"
	all := map[string]bench.AutopilotCase{}
	for _, tm := range tms {
		all[tm.Name] = bench.AutopilotCase{Name: tm.Name, Model: tm.Dir, Labels: 10, Shape: tm.Shape, Config: method.Apply(tm.Base),
			Method: method.Name, Describe: tm.Describe, Run: true}
	}
	all["vit-b16"] = bench.AutopilotCase{Name: "vit-b16", Model: "vit-b16", Labels: 10, Shape: finetune.Shape{Batch: vitBatch},
		Config: method.Apply(full), Method: method.Name, Sibling: "vit",
		Describe: fmt.Sprintf("ViT-B/16 (12 layers, hidden 768), 224x224, batch %d, bfloat16, memory-efficient attention, LoRA r=%d", vitBatch, full.LoRARank)}
	all["llama-1b"] = bench.AutopilotCase{Name: "llama-1b", Model: "llama-1b", Shape: finetune.Shape{Batch: llamaBatch, Seq: llamaSeq},
		Config: method.Apply(full), Method: method.Name, Sibling: "llama",
		Describe: fmt.Sprintf("llama-1b (TinyLlama shape: 22 layers, hidden 2048), batch %d x %d tokens, bfloat16, memory-efficient attention, LoRA r=%d", llamaBatch, llamaSeq, full.LoRARank)}
	var out []bench.AutopilotCase
	for _, name := range autopilotCaseNames { // the run cases first: planned ones take their siblings' ratios
		if !slices.Contains(names, name) {
			continue
		}
		c := all[name]
		if c.Sibling != "" && !slices.Contains(names, c.Sibling) {
			return nil, usagef("case %s takes its step times from %s: list both in --cases", name, c.Sibling)
		}
		out = append(out, c)
	}
	return out, nil
}
