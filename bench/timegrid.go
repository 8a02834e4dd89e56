package bench

import (
	"bytes"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/vit"
	"github.com/memfit/memfit/plan"
)

// TimedModel is a model of the timed grid: a checkpoint folder (random weights are fine), its input shape and
// the base config each method starts from.
type TimedModel struct {
	Name  string
	Dir   string
	Shape finetune.Shape
	Base  finetune.Config
	// Describe says how the model is scaled, for the output.
	Describe string
	// SeqBudget, for a LLaMA, is the memory budget of the longest-sequence search (0: no search): each cell
	// also reports the longest sequence, at the model's batch size, whose step total (peak + optimizer state)
	// fits it, as the paper's Table 9 does.
	SeqBudget int64
}

// TimedCell is one model x method x variant: memory from the trainer's own step and timed training steps.
type TimedCell struct {
	Model   string `json:"model"`
	Method  string `json:"method"`
	Variant string `json:"variant"`
	// SavedActivationBytes (exact) and PeakBytes (PeakMethod) of the gradient step.
	SavedActivationBytes int64  `json:"saved_activation_bytes"`
	PeakBytes            int64  `json:"peak_bytes"`
	PeakMethod           string `json:"peak_method"`
	// StepSeconds is the median of the timed optimizer steps (StepMin, StepMax their range); PerSecond the
	// examples (ViT) or tokens (LLaMA) per second at the median.
	StepSeconds float64 `json:"step_seconds"`
	StepMin     float64 `json:"step_seconds_min"`
	StepMax     float64 `json:"step_seconds_max"`
	PerSecond   float64 `json:"per_second"`
	Unit        string  `json:"unit"`
	// MatmulGFLOP is the gradient step's matrix-product work (memory.MatmulFLOPs); GFLOPS that work per second
	// of the median step.
	MatmulGFLOP float64 `json:"matmul_gflop"`
	// CompileSeconds is the time the warm-up step spent building and compiling the step (not in StepSeconds).
	CompileSeconds float64 `json:"compile_seconds"`
	GFLOPS         float64 `json:"gflops"`
	// MatmulOnlySeconds is the time the step's products take each alone (MatmulOpSeconds x count), OwnGFLOPS the
	// backend's speed on them (MatmulGFLOP / MatmulOnlySeconds) and MatmulShare = GFLOPS / OwnGFLOPS, the share
	// of the step that is matrix products at the backend's own speed.
	MatmulOnlySeconds float64 `json:"matmul_only_seconds"`
	OwnGFLOPS         float64 `json:"own_gflops"`
	MatmulShare       float64 `json:"matmul_share"`
	// MaxSeq is the longest sequence whose step fits MaxSeqBudget bytes (LLaMA models with a SeqBudget only).
	MaxSeq       int   `json:"max_seq,omitempty"`
	MaxSeqBudget int64 `json:"max_seq_budget_bytes,omitempty"`
	// Ratios to the plain variant of the same model and method.
	SavedRatio float64 `json:"saved_ratio"`
	PeakRatio  float64 `json:"peak_ratio"`
	TimeRatio  float64 `json:"time_ratio"`
}

// TimeGrid trains every model x method x variant for steps timed optimizer steps after one warm-up step, the
// variants of one model and method interleaved round by round (the order rotated each round) so that machine
// drift hits them alike, and reports memory, median step time, throughput and matmul GFLOP/s.
func TimeGrid(backend compute.Backend, tms []TimedModel, methods []GridMethod, variants []finetune.Variant, steps int, log io.Writer) ([]TimedCell, error) {
	if steps <= 0 {
		return nil, fmt.Errorf("steps must be positive")
	}
	var out []TimedCell
	opSeconds := map[string]float64{} // one product's median time, by its shapes and axes (Count excluded)
	for _, tm := range tms {
		for _, method := range methods {
			type run struct {
				tr    *finetune.Trainer
				batch finetune.Batch
				times []float64
				cell  TimedCell
			}
			runs := make([]*run, len(variants))
			isLlama := false
			for i, v := range variants {
				cfg := v.Apply(method.Apply(tm.Base))
				cfg.Steps = steps + 1
				model, err := finetune.LoadModel(tm.Dir, cfg)
				if err != nil {
					return nil, fmt.Errorf("%s %s %s: %w", tm.Name, method.Name, v.Name, err)
				}
				tr, err := finetune.New(model, cfg, backend)
				if err != nil {
					return nil, fmt.Errorf("%s %s %s: %w", tm.Name, method.Name, v.Name, err)
				}
				b := finetune.RandomBatch(model, tm.Shape, 1)
				st, err := tr.TrainStep([]finetune.Batch{b}) // warm-up: builds and compiles the step
				if err != nil {
					return nil, fmt.Errorf("%s %s %s: %w", tm.Name, method.Name, v.Name, err)
				}
				g, err := tr.StepGraph(b)
				if err != nil {
					return nil, err
				}
				ops, err := memory.MatmulOps(g)
				if err != nil {
					ops = nil // not the pure-Go backend (XLA): no matmul figures
				}
				var flops int64
				mmSeconds := 0.0
				for _, op := range ops {
					flops += int64(op.Count) * op.FLOPs
					sec, ok := opSeconds[opKey(op)]
					if !ok {
						if sec, err = MatmulOpSeconds(backend, op, 3); err != nil {
							return nil, err
						}
						opSeconds[opKey(op)] = sec
					}
					mmSeconds += float64(op.Count) * sec
				}
				unit := "images/s"
				if fam, _ := finetune.FamilyOf(model); fam.Sequence {
					unit, isLlama = "tokens/s", true
				}
				runs[i] = &run{tr: tr, batch: b, cell: TimedCell{Model: tm.Name, Method: method.Name, Variant: v.Name,
					SavedActivationBytes: st.SavedActivationBytes, PeakBytes: st.PeakBytes, PeakMethod: st.PeakMethod, CompileSeconds: st.CompileSeconds,
					MatmulGFLOP: float64(flops) / 1e9, MatmulOnlySeconds: mmSeconds, Unit: unit}}
			}
			for round := 0; round < steps; round++ {
				for k := range runs {
					r := runs[(k+round)%len(runs)]
					st, err := r.tr.TrainStep([]finetune.Batch{r.batch})
					if err != nil {
						return nil, err
					}
					r.times = append(r.times, st.Seconds)
				}
			}
			var fits []plan.Capacity
			if isLlama && tm.SeqBudget > 0 {
				var err error
				if fits, err = plan.Capacities(backend, plan.CapacityRequest{Model: tm.Dir, Config: method.Apply(tm.Base), Shape: tm.Shape,
					Axis: "seq", Budget: tm.SeqBudget, Limit: 1 << 14, Variants: variants}); err != nil {
					return nil, fmt.Errorf("%s %s: longest sequence: %w", tm.Name, method.Name, err)
				}
			}
			for i, r := range runs {
				if fits != nil {
					r.cell.MaxSeq, r.cell.MaxSeqBudget = fits[i].Max, tm.SeqBudget
				}
				sort.Float64s(r.times)
				c := &r.cell
				c.StepSeconds, c.StepMin, c.StepMax = r.times[len(r.times)/2], r.times[0], r.times[len(r.times)-1]
				n := float64(tm.Shape.Batch)
				if c.Unit == "tokens/s" {
					n *= float64(tm.Shape.Seq)
				}
				c.PerSecond = n / c.StepSeconds
				c.GFLOPS = c.MatmulGFLOP / c.StepSeconds
				if c.MatmulOnlySeconds > 0 {
					c.OwnGFLOPS = c.MatmulGFLOP / c.MatmulOnlySeconds
					c.MatmulShare = c.MatmulOnlySeconds / c.StepSeconds
				}
				base := runs[0].cell
				c.SavedRatio = ratio(c.SavedActivationBytes, base.SavedActivationBytes)
				c.PeakRatio = 0 // "-" when either peak is unavailable
				if _, ua := memory.Method(c.PeakMethod).Unavailable(); !ua {
					if _, ub := memory.Method(base.PeakMethod).Unavailable(); !ub {
						c.PeakRatio = ratio(c.PeakBytes, base.PeakBytes)
					}
				}
				c.TimeRatio = c.StepSeconds / runs[0].cell.StepSeconds
				out = append(out, *c)
			}
			if log != nil {
				fmt.Fprintf(log, "%s %s: %d variants timed\n", tm.Name, method.Name, len(runs))
			}
		}
	}
	return out, nil
}

// MatmulGFLOPS measures the backend's float32 matrix-product speed on an n x n x n product (median of reps).
func MatmulGFLOPS(backend compute.Backend, n, reps int) (float64, error) {
	sq := shapes.Make(dtypes.Float32, n, n)
	sec, err := MatmulOpSeconds(backend, memory.MatmulOp{LHS: sq, RHS: sq, LHSContracting: []int{1}, RHSContracting: []int{0}}, reps)
	if err != nil {
		return 0, err
	}
	return 2 * float64(n) * float64(n) * float64(n) / sec / 1e9, nil
}

// MatmulOpSeconds times one matrix product (a memory.MatmulOp, its Count ignored) alone on backend, in its own
// compiled graph: the median of reps timed runs after one warm-up run. Summed over a step's products times their
// counts and divided by the step's time, it is the step's matmul share: the step's GFLOP/s over the backend's own
// GFLOP/s on the very same products.
func MatmulOpSeconds(backend compute.Backend, op memory.MatmulOp, reps int) (float64, error) {
	if reps <= 0 {
		return 0, fmt.Errorf("reps must be positive")
	}
	var times []float64
	err := engine.Try(func() {
		g := graph.NewGraph(backend, "matmul-op")
		a := graph.Parameter(g, "a", op.LHS)
		b := graph.Parameter(g, "b", op.RHS)
		defer g.Finalize()
		if err := g.Compile(graph.DotGeneral(a, op.LHSContracting, op.LHSBatch, b, op.RHSContracting, op.RHSBatch)); err != nil {
			panic(err) // engine.Try returns it
		}
		at, bt := filledTensor(op.LHS), filledTensor(op.RHS)
		for i := 0; i < reps+1; i++ {
			start := time.Now()
			outs := g.Run(at, bt)
			d := time.Since(start).Seconds()
			outs[0].MustFinalizeAll()
			if i > 0 {
				times = append(times, d)
			}
		}
	})
	if err != nil {
		return 0, fmt.Errorf("timing %v: %w", op, err)
	}
	sort.Float64s(times)
	return times[len(times)/2], nil
}

// opKey identifies a product by its shapes and dimension numbers (not its count).
func opKey(op memory.MatmulOp) string {
	return fmt.Sprint(op.LHS, op.RHS, op.LHSContracting, op.LHSBatch, op.RHSContracting, op.RHSBatch)
}

// filledTensor returns a tensor of shape s, float32 ones filled with a non-zero pattern (other dtypes zeros).
func filledTensor(s shapes.Shape) *tensors.Tensor {
	t := tensors.FromShape(s)
	if s.DType == dtypes.Float32 {
		_ = tensors.MutableFlatData(t, func(flat []float32) {
			for i := range flat {
				flat[i] = float32(i%7)*0.1 - 0.3
			}
		})
	}
	return t
}

// WriteTimedGrid prints the timed grid, one block per model, with the backend's matmul speed for reference. The
// table is kept under 150 columns; the JSON has every figure (the step time's min-max among them).
func WriteTimedGrid(w io.Writer, tms []TimedModel, cells []TimedCell, matmulGFLOPS float64) error {
	for _, tm := range tms {
		fmt.Fprintln(w, wrap(tm.Name+": "+tm.Describe, 118, "  "))
	}
	fmt.Fprintf(w, "backend matmul speed: %.1f GFLOP/s (float32 1024^3 product)\n\n", matmulGFLOPS)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "model\tmethod\tvariant\tsaved\tx\tstep peak\tx\tstep\tx\tthroughput\tGFLOP/s step/alone\tshare\tvs 1024^3\tmax seq\t\n")
	budget := int64(0)
	for _, c := range cells {
		seq := "-"
		if c.MaxSeqBudget > 0 {
			seq, budget = fmt.Sprint(c.MaxSeq), c.MaxSeqBudget
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.3f\t%s\t%s\t%.2fs\t%.3f\t%.1f %s\t%.1f / %.1f\t%.0f%%\t%.0f%%\t%s\t\n", c.Model, c.Method, c.Variant,
			memory.FormatBytesPrec(c.SavedActivationBytes, 1), c.SavedRatio, memory.FormatPeakCell(c.PeakBytes, c.PeakMethod, 1), fmtRatio(c.PeakRatio),
			c.StepSeconds, c.TimeRatio, c.PerSecond, c.Unit, c.GFLOPS, c.OwnGFLOPS,
			100*c.MatmulShare, 100*c.GFLOPS/matmulGFLOPS, seq)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(cells) == 0 {
		return nil
	}
	_, err := fmt.Fprintf(w, "x: ratio to the plain variant of the same model and method\n"+
		"saved: activations kept for the backward, %s\n"+
		"step peak: %s\n"+
		"step: median of the timed optimizer steps (gradient step + update), variants interleaved round by round\n"+
		"GFLOP/s step/alone: the step's matrix-product FLOPs over the median step time / the backend's GFLOP/s on those very\n"+
		"  products, each timed alone (median of 3); share: their ratio, the matmul-bound share of the step; vs 1024^3: the\n"+
		"  step's GFLOP/s over the backend's speed on one large square product\n",
		memory.MethodSavedWalk, cells[0].PeakMethod)
	if err == nil && budget > 0 {
		_, err = fmt.Fprintf(w, "max seq: the longest sequence (same batch) whose step peak + optimizer state fits %s, planned with the same\n"+
			"  peak estimate (LLaMA only; the paper's Table 9)\n", memory.FormatBytes(budget))
	}
	return err
}

// wrap breaks text into lines of at most width characters at spaces, indenting the continuation lines.
func wrap(text string, width int, indent string) string {
	var out, line []byte
	for _, word := range bytes.Fields([]byte(text)) {
		if len(line) > 0 && len(line)+1+len(word) > width {
			out = append(append(out, line...), '\n')
			line = append([]byte(indent), word...)
			continue
		}
		if len(line) > 0 {
			line = append(line, ' ')
		}
		line = append(line, word...)
	}
	return string(append(out, line...))
}

// GridRun is the JSON `finetune bench grid --json` writes.
type GridRun struct {
	Models       map[string]string `json:"models"`
	Backend      string            `json:"backend"`
	Steps        int               `json:"steps"`
	MatmulGFLOPS float64           `json:"matmul_gflops"`
	Cells        []TimedCell       `json:"cells"`
}

// WriteGridRun prints an earlier run's table from its JSON, the models in the order of their first cell.
func WriteGridRun(w io.Writer, run GridRun) error {
	var tms []TimedModel
	seen := map[string]bool{}
	for _, c := range run.Cells {
		if !seen[c.Model] {
			seen[c.Model] = true
			tms = append(tms, TimedModel{Name: c.Model, Describe: run.Models[c.Model]})
		}
	}
	return WriteTimedGrid(w, tms, run.Cells, run.MatmulGFLOPS)
}

// ScaledModels writes the CPU grid's models into dir (random weights), scaled so that a step takes seconds on two
// cores while activations outweigh weights as they do at the paper's GPU sizes: a ViT-Ti-shaped encoder (hidden
// 192, 3 heads, MLP 768, 4 layers, 224x224 images in 16x16 patches, 10 classes) at batch 16, whose per-layer
// activations:weights proportion (about 21:1 under LoRA) is vit-b16's at batch 64; and a LLaMA with llama-1b's
// head and layer proportions scaled down (hidden 256, 4 heads of 64, 2 key/value heads, MLP 688, 4 layers,
// vocabulary 1024 so the loss's logits stay a small share, as a 32k vocabulary is beside 16-32 real layers) at
// batch 4, sequence 256.
func ScaledModels(dir string) ([]TimedModel, error) {
	vc, _ := vit.Preset("vit-b16", 10)
	vc.HiddenSize, vc.NumAttentionHeads, vc.IntermediateSize, vc.NumHiddenLayers = 192, 3, 768, 4
	lc, _ := llama.Preset("llama-1b", 0)
	lc.VocabSize, lc.HiddenSize, lc.NumAttentionHeads, lc.NumKeyValueHeads, lc.HeadDim, lc.IntermediateSize, lc.NumHiddenLayers = 1024, 256, 4, 2, 64, 688, 4
	vj, err := vc.JSON()
	if err != nil {
		return nil, err
	}
	lj, err := llama.JSON(lc)
	if err != nil {
		return nil, err
	}
	vdir, ldir := filepath.Join(dir, "vit"), filepath.Join(dir, "llama")
	if err := models.SaveCheckpoint(vdir, vj, vit.RandomParams(vc, 1), 0); err != nil {
		return nil, err
	}
	if err := models.SaveCheckpoint(ldir, lj, decoder.RandomParams(lc, 2), 0); err != nil {
		return nil, err
	}
	base := finetune.Defaults()
	base.Attention = "memory-efficient"
	return []TimedModel{
		{Name: "vit", Dir: vdir, Shape: finetune.Shape{Batch: 16}, Base: base,
			Describe: "ViT-Ti-shaped (hidden 192, 3 heads, MLP 768), 4 layers, 224x224 / 16 = 197 tokens, batch 16 (activations:weights per layer as vit-b16 at batch 64), float32, memory-efficient attention, LoRA r=8"},
		{Name: "llama", Dir: ldir, Shape: finetune.Shape{Batch: 4, Seq: 256}, Base: base, SeqBudget: 256 << 20,
			Describe: "LLaMA scaled down (hidden 256, 4 heads / 2 kv heads of 64, MLP 688, vocab 1024), 4 layers, batch 4 x 256 tokens, float32, memory-efficient attention, LoRA r=8"},
	}, nil
}
