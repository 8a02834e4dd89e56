package bench

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/gomlx/compute"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/plan"
)

// GridMethod is one fine-tuning method of the grid: a name and the config changes that make it.
type GridMethod struct {
	Name  string
	Apply func(c finetune.Config) finetune.Config
}

// GridMethods are the paper's methods: LoRA on q,v; LoRA on every linear layer; LoRA-FA; full fine-tuning;
// QLoRA (NF4 base, LoRA on every linear layer).
var GridMethods = []GridMethod{
	{"lora-qv", func(c finetune.Config) finetune.Config {
		c.Method, c.LoRATarget = finetune.MethodLoRA, []string{"q", "v"}
		return c
	}},
	{"lora-all", func(c finetune.Config) finetune.Config {
		c.Method, c.LoRATarget = finetune.MethodLoRA, []string{"all-linear"}
		return c
	}},
	{"lora-fa", func(c finetune.Config) finetune.Config {
		c.Method, c.LoRATarget = finetune.MethodLoRAFA, []string{"all-linear"}
		return c
	}},
	{"full", func(c finetune.Config) finetune.Config {
		c.Method, c.LoRARank, c.LoRATarget = finetune.MethodFull, 0, nil
		return c
	}},
	{"qlora", func(c finetune.Config) finetune.Config {
		c.Method, c.LoRATarget = finetune.MethodQLoRA, []string{"all-linear"}
		return c
	}},
}

// GridModel is one model row group: a folder or preset, classifier labels, and the input shape.
type GridModel struct {
	Model  string
	Labels int
	Shape  finetune.Shape
	// Base is applied before each method (compute dtype, attention kind, LoRA rank, ...).
	Base finetune.Config
}

// GridCell is one model x method x variant measurement.
type GridCell struct {
	Model   string         `json:"model"`
	Method  string         `json:"method"`
	Variant string         `json:"variant"`
	Shape   finetune.Shape `json:"shape"`
	plan.StepMemory
}

// MemoryGrid plans every model x method x variant step (no weights read, nothing run): exact saved activations
// and the step peak (simulated on the pure-Go backend, compiled sizes on XLA), with ratios to the plain variant
// of the same model and method.
func MemoryGrid(backend compute.Backend, gridModels []GridModel, methods []GridMethod, variants []finetune.Variant, progress func(string)) ([]GridCell, error) {
	var out []GridCell
	for _, gm := range gridModels {
		for _, m := range methods {
			cfg := m.Apply(gm.Base)
			rep, err := plan.Memory(backend, plan.MemoryRequest{Model: gm.Model, Config: cfg, Labels: gm.Labels, Shape: gm.Shape, Variants: variants})
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", gm.Model, m.Name, err)
			}
			for _, v := range rep.Variants {
				out = append(out, GridCell{Model: gm.Model, Method: m.Name, Variant: v.Name, Shape: rep.Shape, StepMemory: v})
			}
			if progress != nil {
				progress(fmt.Sprintf("%s %s: %d variants planned", gm.Model, m.Name, len(rep.Variants)))
			}
		}
	}
	return out, nil
}

// WriteGrid prints the grid as a table, one block per model.
func WriteGrid(w io.Writer, cells []GridCell) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	last := ""
	for _, c := range cells {
		if key := fmt.Sprintf("%s %+v", c.Model, c.Shape); key != last {
			if last != "" {
				fmt.Fprintln(tw, "\t\t\t\t\t\t\t\t")
			}
			last = key
			fmt.Fprintf(tw, "%s, batch %d, seq %d\t\t\t\t\t\t\t\t\n", c.Model, c.Shape.Batch, c.Shape.Seq)
			fmt.Fprintf(tw, "method\tvariant\tsaved act.\tx plain\tstep peak\tx plain\ttotal\tx plain\t\n")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.3f\t%s\t%.3f\t%s\t%.3f\t\n", c.Method, c.Variant, memory.FormatBytes(c.SavedActivationBytes),
			c.SavedRatio, memory.FormatBytes(c.PeakBytes), c.PeakRatio, memory.FormatBytes(c.TotalBytes), c.TotalRatio)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(cells) > 0 {
		_, err := fmt.Fprintf(w, "saved act.: %s\nstep peak: %s\ntotal = step peak + optimizer state\n", cells[0].SavedMethod, cells[0].PeakMethod)
		return err
	}
	return nil
}
