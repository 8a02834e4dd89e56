// Package demo is memfit's first command: it fine-tunes a small pretrained ViT that ships with memfit on
// classes it has never seen, twice (plain LoRA, and LoRA with ReGELU2 + MS-LN), on the CPU backend in a few
// minutes, and reports accuracy before and after, memory and throughput side by side, with a plot.
package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	_ "github.com/memfit/memfit/family/all" // the shipped model families register themselves
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/gomlx/compute"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/pretrained"
	"github.com/memfit/memfit/safetensors"
)

// Options configure the demo.
type Options struct {
	// Backend runs the training (the pure-Go one by default in the CLI).
	Backend compute.Backend
	// Out receives the plot (demo.png), one metrics file per run (<run>.jsonl) and summary.json; empty: none.
	Out string
	// Steps, BatchSize, LR and Seed set the fine-tuning (defaults: 150, 32, 2e-3, 1).
	Steps     int
	BatchSize int
	LR        float64
	Seed      uint64
	// Log receives progress lines (nil: none).
	Log io.Writer
}

func (o *Options) defaults() {
	if o.Steps == 0 {
		o.Steps = 150
	}
	if o.BatchSize == 0 {
		o.BatchSize = 32
	}
	if o.LR == 0 {
		o.LR = 2e-3
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
}

// Run is one fine-tuning run of the demo.
type Run struct {
	Name    string           `json:"name"`
	Variant finetune.Variant `json:"variant"`
	// AccuracyBefore is the pretrained model's test accuracy on the new classes (its head was trained on other
	// classes, so about chance); AccuracyAfter the fine-tuned one's.
	AccuracyBefore float64 `json:"accuracy_before"`
	AccuracyAfter  float64 `json:"accuracy_after"`
	// SavedActivationBytes (exact, training-graph walk) and PeakBytes (PeakMethod) of one training step; a peak
	// that could not be obtained is PeakBytes 0 with PeakMethod "unavailable: <reason>".
	SavedActivationBytes int64  `json:"saved_activation_bytes"`
	PeakBytes            int64  `json:"peak_bytes"`
	PeakMethod           string `json:"peak_method"`
	// ImagesPerSecond is the median training throughput over the steps after the first (which compiles).
	ImagesPerSecond float64              `json:"images_per_second"`
	Seconds         float64              `json:"seconds"`
	Steps           []finetune.StepStats `json:"-"`
}

// FineTune fine-tunes the model folder on train with LoRA (rank 8 on every encoder linear layer, the classifier
// trained too) in the given variant and measures test accuracy before and after.
func FineTune(ctx context.Context, modelDir string, train, test finetune.Examples, v finetune.Variant, opts Options) (Run, error) {
	opts.defaults()
	cfg := finetune.Defaults()
	cfg.LoRATarget = []string{"all-linear"}
	cfg.TrainModules = []string{"classifier"}
	cfg.LR, cfg.Steps, cfg.BatchSize, cfg.Seed = opts.LR, opts.Steps, opts.BatchSize, opts.Seed
	cfg.Schedule, cfg.WarmupSteps = "cosine", opts.Steps/10
	cfg.LogEvery = 10
	cfg = v.Apply(cfg)
	run := Run{Name: v.Name, Variant: v}
	model, err := finetune.LoadModel(modelDir, cfg)
	if err != nil {
		return run, err
	}
	before := func(b finetune.Batch) (*tensors.Tensor, error) {
		return finetune.Logits(opts.Backend, model, nil, nil, b)
	}
	if run.AccuracyBefore, err = finetune.Accuracy(before, test, 250); err != nil {
		return run, err
	}
	loader, err := finetune.NewLoader(train, cfg.BatchSize, cfg.Seed, true)
	if err != nil {
		return run, err
	}
	var metrics io.Writer
	var metricsFile *os.File
	var bw *bufio.Writer
	if opts.Out != "" {
		// Written beside its final name and renamed into place once complete (an interrupted demo leaves the
		// previous run's file whole).
		f, err := os.CreateTemp(opts.Out, "."+v.Name+".jsonl.tmp-")
		if err != nil {
			return run, err
		}
		defer os.Remove(f.Name())
		defer f.Close()
		metricsFile, bw = f, bufio.NewWriter(f)
		metrics = bw
	}
	hooks := finetune.Hooks{OnStep: func(s finetune.StepStats) {
		run.Steps = append(run.Steps, s)
		if opts.Log != nil && s.Synced && (s.Step%50 == 0 || s.Step == cfg.Steps) { // losses are read back every LogEvery steps
			fmt.Fprintf(opts.Log, "  %-18s step %4d/%d  loss %.4f  %.0f img/s  saved act. %s  step peak %s\n", v.Name, s.Step,
				cfg.Steps, s.Loss, s.ExamplesPerSecond, memory.FormatBytes(s.SavedActivationBytes), memory.FormatPeak(s.PeakBytes, s.PeakMethod))
		}
	}}
	// The library's recipe, without an output folder: the model loaded above, the examples in memory.
	res, err := finetune.Recipe{Spec: finetune.RunSpec{Model: modelDir, Config: cfg}, Model: model, Data: loader,
		Backend: opts.Backend, Metrics: metrics, Hooks: finetune.RunHooks{Hooks: hooks}}.Run(ctx)
	if err != nil {
		return run, err
	}
	trainer := res.Trainer
	if metricsFile != nil {
		if err := bw.Flush(); err != nil {
			return run, err
		}
		if err := metricsFile.Chmod(0o644); err != nil {
			return run, err
		}
		if err := metricsFile.Close(); err != nil {
			return run, err
		}
		if err := os.Rename(metricsFile.Name(), filepath.Join(opts.Out, v.Name+".jsonl")); err != nil {
			return run, err
		}
	}
	if run.AccuracyAfter, err = finetune.Accuracy(trainer.Logits, test, 250); err != nil {
		return run, err
	}
	// Free this run's buffers before the next run's step is measured (a pool counter counts the whole process).
	trainer.Release()
	var speeds []float64
	for i, s := range run.Steps {
		run.Seconds += s.Seconds
		run.SavedActivationBytes = max(run.SavedActivationBytes, s.SavedActivationBytes)
		run.PeakBytes, run.PeakMethod = memory.LargerPeak(run.PeakBytes, run.PeakMethod, s.PeakBytes, s.PeakMethod)
		if i > 0 {
			speeds = append(speeds, s.ExamplesPerSecond)
		}
	}
	if len(speeds) > 0 {
		sort.Float64s(speeds)
		run.ImagesPerSecond = speeds[len(speeds)/2]
	}
	return run, nil
}

// WriteTable prints the runs side by side with ratios to the first.
func WriteTable(w io.Writer, runs []Run) error {
	if len(runs) == 0 {
		return nil
	}
	base := runs[0]
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "run\taccuracy before\tafter\tsaved act. (exact)\tx plain\tstep peak\tx plain\timages/s\tx plain\t\n")
	methods := []string{base.PeakMethod}
	for _, r := range runs {
		peakRatio := "-"
		_, unavailable := memory.Method(r.PeakMethod).Unavailable()
		_, baseUnavailable := memory.Method(base.PeakMethod).Unavailable()
		if !unavailable && !baseUnavailable {
			peakRatio = fmt.Sprintf("%.3f", ratio(r.PeakBytes, base.PeakBytes))
		}
		if !slices.Contains(methods, r.PeakMethod) {
			methods = append(methods, r.PeakMethod)
		}
		fmt.Fprintf(tw, "%s\t%.1f%%\t%.1f%%\t%s\t%.3f\t%s\t%s\t%.0f\t%.3f\t\n", r.Name, 100*r.AccuracyBefore, 100*r.AccuracyAfter,
			memory.FormatBytes(r.SavedActivationBytes), ratio(r.SavedActivationBytes, base.SavedActivationBytes),
			memory.FormatPeakCell(r.PeakBytes, r.PeakMethod, 3), peakRatio, r.ImagesPerSecond, r.ImagesPerSecond/base.ImagesPerSecond)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "saved act.: %s\nstep peak: %s\n", memory.MethodSavedWalk, strings.Join(methods, "; "))
	return err
}

func ratio(a, b int64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// writeAtomic writes a file through a temporary file and a rename.
func writeAtomic(path string, write func(w interface{ Write([]byte) (int, error) }) error) error {
	return safetensors.WriteAtomic(path, func(w *bufio.Writer) error { return write(w) })
}

// Result is what Main produces.
type Result struct {
	Runs []Run `json:"runs"`
	// Plot is the PNG written (empty without Options.Out).
	Plot string `json:"plot,omitempty"`
}

// Main runs the demo: it extracts the shipped ViT (pretrained on Fashion-MNIST classes 0-4), fine-tunes it on the
// shipped classes 5-9 subset in the plain and the approx-act+ms-norm variants, and writes the plot and a summary
// into opts.Out.
func Main(ctx context.Context, opts Options) (*Result, error) {
	opts.defaults()
	tmp, err := os.MkdirTemp("", "memfit-demo-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	modelDir, err := pretrained.Extract("vit-fashion", filepath.Join(tmp, "vit-fashion"))
	if err != nil {
		return nil, err
	}
	trainIDX, testIDX, err := pretrained.DemoData()
	if err != nil {
		return nil, err
	}
	train, err := pretrained.FashionExamples(trainIDX["images"], trainIDX["labels"], 5)
	if err != nil {
		return nil, err
	}
	test, err := pretrained.FashionExamples(testIDX["images"], testIDX["labels"], 5)
	if err != nil {
		return nil, err
	}
	if opts.Out != "" {
		if err := os.MkdirAll(opts.Out, 0o755); err != nil {
			return nil, err
		}
	}
	if opts.Log != nil {
		fmt.Fprintf(opts.Log, "fine-tuning the shipped ViT (pretrained on Fashion-MNIST %v) on %v: %d training and %d test images, "+
			"LoRA r=8 on every encoder linear layer + the classifier, %d steps of %d\n", pretrained.FashionClasses[:5],
			pretrained.FashionClasses[5:], train.Len(), test.Len(), opts.Steps, opts.BatchSize)
	}
	res := &Result{}
	for _, name := range []string{"plain", "approx-act+ms-norm"} {
		v, err := finetune.VariantByName(name)
		if err != nil {
			return nil, err
		}
		run, err := FineTune(ctx, modelDir, train, test, v, opts)
		if err != nil {
			return nil, fmt.Errorf("%s run: %w", name, err)
		}
		res.Runs = append(res.Runs, run)
	}
	if opts.Out != "" {
		res.Plot = filepath.Join(opts.Out, "demo.png")
		if err := WritePlot(res.Plot, res.Runs); err != nil {
			return nil, err
		}
		summary, _ := json.MarshalIndent(res, "", "  ")
		if err := writeAtomic(filepath.Join(opts.Out, "summary.json"), func(w interface{ Write([]byte) (int, error) }) error {
			_, err := w.Write(append(summary, '\n'))
			return err
		}); err != nil {
			return nil, err
		}
	}
	return res, nil
}
