// Package bench measures what memfit's memory-saving options buy on transformer training steps: saved
// activation bytes, peak memory and step time for each combination of activation and norm.
package bench

import (
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/vit"
)

// StackConfig shapes a stack of ViT encoder layers trained on random data with every weight trainable.
type StackConfig struct {
	Layers, Batch, Tokens, Hidden, MLP, Heads int
	// Steps is the number of timed steps per variant (after one untimed warm-up step).
	Steps int
	Seed  uint64
}

// ViTB returns the ViT-B/16 shape at 224x224 (197 tokens, hidden 768, MLP 3072, 12 heads).
func ViTB(layers, batch int) StackConfig {
	return StackConfig{Layers: layers, Batch: batch, Tokens: 197, Hidden: 768, MLP: 3072, Heads: 12, Steps: 2, Seed: 1}
}

// Validate checks the configuration.
func (c StackConfig) Validate() error {
	if c.Layers <= 0 || c.Batch <= 0 || c.Tokens <= 0 || c.Hidden <= 0 || c.MLP <= 0 || c.Heads <= 0 || c.Steps <= 0 {
		return fmt.Errorf("bench: every size must be positive, got %+v", c)
	}
	if c.Hidden%c.Heads != 0 {
		return fmt.Errorf("bench: hidden size %d is not a multiple of %d heads", c.Hidden, c.Heads)
	}
	return nil
}

// Variant is one combination of the memory-saving options.
type Variant struct {
	Name             string
	ApproxActivation bool // ReGELU2 instead of GELU
	MSNorm           bool // MS-LN instead of LayerNorm
}

// Variants are the four combinations, the baseline first.
var Variants = []Variant{
	{Name: "GELU+LN"},
	{Name: "ReGELU2+LN", ApproxActivation: true},
	{Name: "GELU+MS-LN", MSNorm: true},
	{Name: "ReGELU2+MS-LN", ApproxActivation: true, MSNorm: true},
}

// Step is a compiled training step: loss = sum(stack(x) * target), gradients for every weight.
type Step struct {
	Graph   *graph.Graph
	Outputs []*graph.Node
	Inputs  []*tensors.Tensor
}

// BuildStep builds and compiles the training step of cfg in variant v on backend.
func BuildStep(backend compute.Backend, cfg StackConfig, v Variant) (*Step, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	layers := make([]vit.LayerParams, cfg.Layers)
	for l := range layers {
		layers[l] = vit.RandomLayer(cfg.Seed*1000+uint64(l), cfg.Hidden, cfg.MLP)
		if v.MSNorm {
			folded, err := vit.FoldLayer(layers[l])
			if err != nil {
				return nil, err
			}
			layers[l] = folded
		}
	}
	r := rand.New(rand.NewPCG(cfg.Seed, 7))
	act := shapes.Make(dtypes.Float32, cfg.Batch, cfg.Tokens, cfg.Hidden)
	x := randomTensor(r, act, 1)
	target := randomTensor(r, act, 1)

	step := &Step{}
	err := engine.Try(func() {
		g := graph.NewGraph(backend, "blockstack-"+v.Name)
		xNode := graph.Parameter(g, "x", act)
		targetNode := graph.Parameter(g, "target", act)
		step.Inputs = []*tensors.Tensor{x, target}
		var weights []*graph.Node
		h := xNode
		for l, params := range layers {
			nodes := map[string]*graph.Node{}
			for _, name := range params.Names() {
				n := graph.Parameter(g, fmt.Sprintf("layer%d.%s", l, name), params[name].Shape())
				nodes[name] = n
				weights = append(weights, n)
				step.Inputs = append(step.Inputs, params[name])
			}
			h = vit.Block(h, models.Bound{Nodes: nodes}, "", vit.BlockOptions{Heads: cfg.Heads, Eps: 1e-12,
				ApproxActivation: v.ApproxActivation, MSNorm: v.MSNorm})
		}
		loss := graph.ReduceAllSum(graph.Mul(h, targetNode))
		grads := engine.Gradient(loss, weights...)
		step.Outputs = append([]*graph.Node{loss}, grads...)
		if err := g.Compile(step.Outputs...); err != nil {
			panic(err) // engine.Try returns it
		}
		step.Graph = g
	})
	if err != nil {
		return nil, fmt.Errorf("bench: building %s: %w", v.Name, err)
	}
	return step, nil
}

// Execute runs the step once and returns its outputs (the loss, then one gradient per weight); the caller
// frees them.
func (s *Step) Execute() (outputs []*tensors.Tensor, err error) {
	err = engine.Try(func() {
		args := make([]any, len(s.Inputs))
		for i, t := range s.Inputs {
			args[i] = t
		}
		outputs = s.Graph.Run(args...)
	})
	return outputs, err
}

// Run executes the step once and frees its outputs.
func (s *Step) Run() error {
	outputs, err := s.Execute()
	freeAll(outputs)
	return err
}

// Release frees the step's inputs (on the host and the backend) and its compiled graph.
func (s *Step) Release() {
	freeAll(s.Inputs)
	s.Graph.Finalize()
}

func freeAll(ts []*tensors.Tensor) {
	for _, t := range ts {
		if t != nil {
			_ = t.FinalizeAll()
		}
	}
}

func randomTensor(r *rand.Rand, s shapes.Shape, std float64) *tensors.Tensor {
	data := make([]float32, s.Size())
	for i := range data {
		data[i] = float32(std * r.NormFloat64())
	}
	return tensors.FromFlatDataAndDimensions(data, s.Dimensions...)
}

// Result is what one variant measured.
type Result struct {
	Variant  Variant
	Saved    *memory.SavedReport
	Analytic int64
	Peak     memory.Peak
	// StepTimes are the timed steps' wall times.
	StepTimes []time.Duration
}

// StepTime returns the median timed step.
func (r Result) StepTime() time.Duration { return r.sortedTimes()[len(r.StepTimes)/2] }

// StepRange returns the fastest and slowest timed steps.
func (r Result) StepRange() (time.Duration, time.Duration) {
	ts := r.sortedTimes()
	return ts[0], ts[len(ts)-1]
}

func (r Result) sortedTimes() []time.Duration {
	ts := append([]time.Duration(nil), r.StepTimes...)
	sort.Slice(ts, func(i, j int) bool { return ts[i] < ts[j] })
	return ts
}

// Measure measures each variant in two phases. First, one at a time: build the step, list its saved
// activations, run it once and measure that execution's peak, then free everything, so no other variant's
// buffers are alive during a peak measurement. Then the timing: all variants are built again and their steps run
// round-robin (one step of each variant in turn, in an order rotated every round, cfg.Steps rounds after one
// warm-up round), so that background load on the machine spreads over the variants instead of skewing their
// ratios. progress, if not nil, receives
// a line per phase and step.
func Measure(backend compute.Backend, cfg StackConfig, variants []Variant, progress io.Writer) ([]Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(variants) == 0 {
		return nil, fmt.Errorf("bench: no variants to measure")
	}
	results := make([]Result, len(variants))
	for i, v := range variants {
		logf(progress, "%s: building %d layers, batch %d; measuring saved activations and peak", v.Name, cfg.Layers, cfg.Batch)
		step, err := BuildStep(backend, cfg, v)
		if err != nil {
			return nil, err
		}
		saved, err := memory.Saved(step.Graph, step.Outputs...)
		if err != nil {
			return nil, err
		}
		results[i] = Result{Variant: v, Saved: saved, Analytic: AnalyticSavedBytes(cfg, v)}
		var outputs []*tensors.Tensor
		var runErr error
		results[i].Peak, err = memory.MeasurePeak(step.Graph, func() error {
			outputs, runErr = step.Execute()
			return runErr
		})
		freeAll(outputs)
		step.Release()
		if runErr != nil {
			return nil, runErr
		}
		if err != nil { // the step ran; only its peak is unknown: report it as unavailable, never as 0 B
			results[i].Peak = memory.UnavailablePeak(err)
		}
	}

	steps := make([]*Step, len(variants))
	defer func() {
		for _, s := range steps {
			if s != nil {
				s.Release()
			}
		}
	}()
	for i, v := range variants {
		var err error
		if steps[i], err = BuildStep(backend, cfg, v); err != nil {
			return nil, err
		}
	}
	for round := 0; round <= cfg.Steps; round++ {
		// Rotate the order every round, so no variant always runs in the same position (right after the same
		// other variant, say).
		for k := range variants {
			i := (k + round) % len(variants)
			v := variants[i]
			// Start every step from the same state: collect the previous step's garbage outside the timing (as
			// testing.B does before a benchmark).
			runtime.GC()
			start := time.Now()
			if err := steps[i].Run(); err != nil {
				return nil, err
			}
			elapsed := time.Since(start)
			if round == 0 {
				logf(progress, "%s: warm-up step %.2fs", v.Name, elapsed.Seconds())
				continue
			}
			results[i].StepTimes = append(results[i].StepTimes, elapsed)
			logf(progress, "%s: step %d/%d %.2fs", v.Name, round, cfg.Steps, elapsed.Seconds())
		}
	}
	return results, nil
}

func logf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format+"\n", args...)
	}
}

// AnalyticSavedBytes counts, from the shapes alone, what each variant must keep per layer (float32, T = batch x
// tokens rows):
//
//	LayerNorm (plain, before attention and before the MLP): z [T, D] and rstd [T]; the affine output [T, D] is
//	    the next linear layers' input. MS-LN: z and rstd only, z being that input too.
//	q (scaled), k, v as [T, D] and the attention probabilities [B, H, N, N]; the attention output [T, D] (the
//	    output projection's input).
//	GELU: its input [T, 4D]; ReGELU2: 2-bit codes, ceil(T*MLP/4) bytes. The MLP down projection's input [T, MLP].
func AnalyticSavedBytes(cfg StackConfig, v Variant) int64 {
	T := int64(cfg.Batch * cfg.Tokens)
	D := int64(cfg.Hidden)
	M := int64(cfg.MLP)
	const f32 = 4
	norm := T*D*f32 + T*f32 // z and rstd
	if !v.MSNorm {
		norm += T * D * f32 // affine output, kept by the next linear layers
	}
	attn := 3*T*D*f32 + int64(cfg.Batch*cfg.Heads*cfg.Tokens*cfg.Tokens)*f32 + T*D*f32
	act := T * M * f32
	if v.ApproxActivation {
		act = (T*M + 3) / 4
	}
	mlpDown := T * M * f32
	return int64(cfg.Layers)*(2*norm+attn+act+mlpDown) - T*f32
}

// WriteTable prints one row per variant with each figure's ratio to the first (baseline) variant.
func WriteTable(w io.Writer, cfg StackConfig, results []Result) error {
	if len(results) == 0 {
		return nil
	}
	base := results[0]
	fmt.Fprintf(w, "ViT block stack: %d layers, batch %d, %d tokens, hidden %d, MLP %d, %d heads, float32, all weights trainable, standard attention\n",
		cfg.Layers, cfg.Batch, cfg.Tokens, cfg.Hidden, cfg.MLP, cfg.Heads)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "variant\tsaved\tx base\tanalytic\tsaved/analytic\tpeak\tx base\tstep\t(min-max)\tx base\t\n")
	for _, r := range results {
		lo, hi := r.StepRange()
		fmt.Fprintf(tw, "%s\t%s\t%.3f\t%s\t%.4f\t%s\t%s\t%.3fs\t(%.3f-%.3f)\t%.3f\t\n", r.Variant.Name,
			memory.FormatBytes(r.Saved.Total), ratio(r.Saved.Total, base.Saved.Total),
			memory.FormatBytes(r.Analytic), ratio(r.Saved.Total, r.Analytic),
			memory.FormatPeakCell(r.Peak.Bytes, string(r.Peak.Method), 3),
			peakRatio(r.Peak.Bytes, string(r.Peak.Method), base.Peak.Bytes, string(base.Peak.Method)),
			r.StepTime().Seconds(), lo.Seconds(), hi.Seconds(), r.StepTime().Seconds()/base.StepTime().Seconds())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if _, unavailable := base.Peak.Method.Unavailable(); unavailable {
		fmt.Fprintf(w, "saved: %s\npeak: %s\n", memory.MethodSavedWalk, base.Peak.Method)
	} else {
		fmt.Fprintf(w, "saved: %s\npeak: %s (includes the %s of resident weights and inputs)\n", memory.MethodSavedWalk, base.Peak.Method,
			memory.FormatBytes(base.Peak.Resident))
	}
	_, err := fmt.Fprintf(w, "step: median of %d steps per variant, run round-robin (order rotated every round) after one warm-up round\n", cfg.Steps)
	return err
}

// peakRatio formats the ratio of peak a (method am) to peak b (method bm), or "-" when either is unavailable.
func peakRatio(a int64, am string, b int64, bm string) string {
	_, ua := memory.Method(am).Unavailable()
	_, ub := memory.Method(bm).Unavailable()
	if ua || ub || b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", float64(a)/float64(b))
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
