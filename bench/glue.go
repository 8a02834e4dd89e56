package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gomlx/compute"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/evals"
	"github.com/memfit/memfit/family/bert"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/readfile"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/runner"
	"github.com/memfit/memfit/tokenizer"
)

// GLUEVariants are the four rows of the Approx-BP paper's GLUE table (Table 4): GELU or ReGELU2 in the MLP, and
// LayerNorm or MS-LN.
var GLUEVariants = []finetune.Variant{
	{Name: "GELU / LN"},
	{Name: "ReGELU2 / LN", ApproxAct: true},
	{Name: "GELU / MS-LN", MSNorm: true},
	{Name: "ReGELU2 / MS-LN", ApproxAct: true, MSNorm: true},
}

// GLUETasks are the paper's five tasks, in its table's order.
var GLUETasks = []string{data.CoLA, data.SST2, data.MRPC, data.STSB, data.RTE}

// GLUEOptions configure RunGLUE: the paper's recipe (AdamW, weight decay 0.01, linear schedule with 10% warm-up,
// batch 32, LoRA r=64 alpha 16 on query and key, the classification head trained beside them as PEFT's
// modules_to_save, float32) by default, with the number of epochs (and a cap on steps) to fit a machine.
type GLUEOptions struct {
	// Model is a pretrained encoder folder (a masked LM or a bare encoder: each task gets a new head from it,
	// the same for every variant).
	Model string
	// Data is the GLUE root (../shared/data/glue's layout).
	Data     string
	Tasks    []string
	Variants []finetune.Variant
	// Epochs over each task's training set, capped at MaxSteps optimizer steps (0: no cap).
	Epochs   float64
	MaxSteps int
	// BatchSize and SeqLen shape every step (sequences are padded to SeqLen; the paper's run_glue pads to the
	// maximum length too).
	BatchSize, SeqLen int
	LR                float64
	LoRARank          int
	LoRAAlpha         float64
	Targets           []string
	WarmupRatio       float64
	WeightDecay       float64
	Seed              uint64
	// EvalBatch is the batch of dev-set prediction.
	EvalBatch int
	Backend   compute.Backend
	// Work is a folder for the per-task classifiers made from Model.
	Work string
	// Log receives a line per task and variant when the task is scored (nil: none).
	Log io.Writer
	// Progress, when set, is called after every training step of a task (all its variants side by side) with
	// the steps done and the task's total.
	Progress func(task string, done, total int)
}

// DefaultGLUEOptions are the paper's recipe with 3 epochs capped at 200 steps per task: what the 2-core CPU
// finishes within an hour on the shipped roberta-tiny.
func DefaultGLUEOptions() GLUEOptions {
	return GLUEOptions{Tasks: GLUETasks, Variants: GLUEVariants, Epochs: 3, MaxSteps: 200, BatchSize: 32, SeqLen: 128,
		LR: 5e-4, LoRARank: 64, LoRAAlpha: 16, Targets: []string{"query", "key"}, WarmupRatio: 0.1, WeightDecay: 0.01,
		Seed: 1, EvalBatch: 64}
}

// GLUECell is one task trained and scored in one variant.
type GLUECell struct {
	Task    string `json:"task"`
	Variant string `json:"variant"`
	// Metric names Score: matthews_correlation (CoLA), pearson (STS-B) or accuracy; Score is it x100.
	Metric  string             `json:"metric"`
	Score   float64            `json:"score"`
	Metrics map[string]float64 `json:"metrics"`
	// Steps of BatchSize sequences trained; FinalLoss is the mean loss of the last tenth of them.
	Steps     int     `json:"steps"`
	FinalLoss float64 `json:"final_loss"`
	// TrainSeconds is the steps' wall time without compilation; SamplesPerSecond the sequences trained per
	// second of it.
	TrainSeconds     float64 `json:"train_seconds"`
	SamplesPerSecond float64 `json:"samples_per_second"`
	// SavedActivationBytes is exact (the training graph's saved tensors); PeakBytes is the step's peak as
	// PeakMethod obtained it.
	SavedActivationBytes int64  `json:"saved_activation_bytes"`
	PeakBytes            int64  `json:"peak_bytes"`
	PeakMethod           string `json:"peak_method"`
	DevExamples          int    `json:"dev_examples"`
}

// GLUEReport is a whole table.
type GLUEReport struct {
	Model   string      `json:"model"`
	Backend string      `json:"backend"`
	Options GLUEOptions `json:"-"`
	Cells   []GLUECell  `json:"cells"`
	Seconds float64     `json:"seconds"`
}

// taskSteps returns the steps of o for a training set of n examples.
func (o GLUEOptions) taskSteps(n int) int {
	steps := int(math.Ceil(o.Epochs * float64(n) / float64(o.BatchSize)))
	if o.MaxSteps > 0 {
		steps = min(steps, o.MaxSteps)
	}
	return max(steps, 1)
}

// config returns the run config of variant v for steps steps.
func (o GLUEOptions) config(v finetune.Variant, steps int) finetune.Config {
	cfg := finetune.Defaults()
	cfg.Method, cfg.LoRARank, cfg.LoRAAlpha, cfg.LoRATarget = finetune.MethodLoRA, o.LoRARank, o.LoRAAlpha, o.Targets
	cfg.TrainModules = []string{"classifier"}
	cfg.Optimizer, cfg.LR, cfg.WeightDecay, cfg.Schedule = "adamw", o.LR, o.WeightDecay, "linear"
	cfg.Steps, cfg.BatchSize, cfg.Seed = steps, o.BatchSize, o.Seed
	cfg.WarmupSteps = int(math.Round(o.WarmupRatio * float64(steps)))
	cfg.LogEvery = max(1, steps/10)
	return v.Apply(cfg)
}

// RunGLUE trains and scores every task in every variant: a classifier head per task made from Model
// (bert.NewHead, seeded), LoRA training on the task's train split with the variants side by side (runTask), then
// the dev split scored (CoLA's Matthews correlation, STS-B's Pearson correlation, accuracy for the others).
func RunGLUE(ctx context.Context, o GLUEOptions) (*GLUEReport, error) {
	start := time.Now()
	rep := &GLUEReport{Model: o.Model, Backend: o.Backend.Name(), Options: o}
	fam, err := finetune.FamilyOfFolder(o.Model)
	if err != nil {
		return nil, err
	}
	base, err := fam.Load(o.Model, finetune.ModelOptions{})
	if err != nil {
		return nil, err
	}
	tok, err := tokenizer.Load(o.Model)
	if err != nil {
		return nil, fmt.Errorf("%s: the GLUE benchmark needs the model's tokenizer: %w", o.Model, err)
	}
	for _, task := range o.Tasks {
		info, err := data.GLUETask(task)
		if err != nil {
			return nil, err
		}
		labels := info.Classes
		if info.Regression {
			labels = []string{"score"}
		}
		head := filepath.Join(o.Work, "head-"+task)
		cj, params, err := bert.NewHead(base, labels, o.Seed)
		if err != nil {
			return nil, err
		}
		if err := models.SaveCheckpoint(head, cj, params, 0); err != nil {
			return nil, err
		}
		for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
			if b, err := readfile.Read(filepath.Join(o.Model, f), readfile.Tokenizer); err == nil {
				if err := os.WriteFile(filepath.Join(head, f), b, 0o644); err != nil {
					return nil, err
				}
			}
		}
		train, err := data.ReadGLUE(o.Data, task, "train")
		if err != nil {
			return nil, err
		}
		dev, err := data.ReadGLUE(o.Data, task, "dev")
		if err != nil {
			return nil, err
		}
		cells, err := o.runTask(ctx, head, task, o.taskSteps(len(train)), tok, dev)
		if err != nil {
			return nil, err
		}
		for _, cell := range cells {
			rep.Cells = append(rep.Cells, cell)
			if o.Log != nil {
				fmt.Fprintf(o.Log, "%-6s %-16s %s %.2f  loss %.4f  %d steps  %.1f samples/s  saved %s  peak %s\n", task, cell.Variant, cell.Metric,
					cell.Score, cell.FinalLoss, cell.Steps, cell.SamplesPerSecond, memory.FormatBytes(cell.SavedActivationBytes), memory.FormatBytes(cell.PeakBytes))
			}
		}
	}
	rep.Seconds = time.Since(start).Seconds()
	return rep, nil
}

// runTask trains task in every variant side by side, a step of each in turn (so every variant sees the same
// machine load: the throughput ratios are fair), each with the same batches (same seed), and scores each on the
// dev split.
func (o GLUEOptions) runTask(ctx context.Context, head, task string, steps int, tok *tokenizer.Tokenizer, dev []data.GLUEExample) ([]GLUECell, error) {
	type side struct {
		cell   GLUECell
		tr     *finetune.Trainer
		it     finetune.Iterator
		losses []float64
	}
	var sides []*side
	defer func() {
		for _, sd := range sides {
			sd.tr.Release()
		}
	}()
	opts := finetune.DataOptions{Format: finetune.FormatGLUE, Task: task, SeqLen: o.SeqLen}
	for _, v := range o.Variants {
		cfg := o.config(v, steps)
		m, err := finetune.LoadModel(head, cfg)
		if err != nil {
			return nil, err
		}
		it, err := finetune.OpenData(o.Data, opts, m, head, cfg.BatchSize, cfg.Seed)
		if err != nil {
			return nil, err
		}
		tr, err := finetune.New(m, cfg, o.Backend)
		if err != nil {
			return nil, fmt.Errorf("%s, %s: %w", task, v.Name, err)
		}
		sides = append(sides, &side{cell: GLUECell{Task: task, Variant: v.Name, Steps: steps}, tr: tr, it: it})
	}
	for step := 0; step < steps; step++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		for _, sd := range sides {
			b, err := sd.it.Next()
			if err != nil {
				return nil, err
			}
			st, err := sd.tr.TrainStep([]finetune.Batch{b})
			if err != nil {
				return nil, fmt.Errorf("%s, %s: %w", task, sd.cell.Variant, err)
			}
			sd.cell.TrainSeconds += st.Seconds
			sd.cell.SavedActivationBytes, sd.cell.PeakBytes, sd.cell.PeakMethod = st.SavedActivationBytes, st.PeakBytes, st.PeakMethod
			sd.losses = append(sd.losses, st.Loss)
		}
		if o.Progress != nil {
			o.Progress(task, step+1, steps)
		}
	}
	var cells []GLUECell
	for _, sd := range sides {
		cell := sd.cell
		if cell.TrainSeconds > 0 {
			cell.SamplesPerSecond = float64(steps*o.BatchSize) / cell.TrainSeconds
		}
		tail := sd.losses[len(sd.losses)-max(1, len(sd.losses)/10):]
		for _, l := range tail {
			cell.FinalLoss += l / float64(len(tail))
		}
		params, set := sd.tr.Current()
		preds, err := evals.PredictGLUE(runner.NewLogitsRunner(o.Backend, sd.tr.Model, params, set), tok, dev, o.SeqLen, o.EvalBatch, nil)
		if err != nil {
			return nil, fmt.Errorf("%s, %s: %w", task, cell.Variant, err)
		}
		score, err := evals.ScoreGLUE(task, dev, preds)
		if err != nil {
			return nil, err
		}
		cell.Metrics, cell.DevExamples = score.Metrics, score.Examples
		cell.Metric = map[string]string{data.CoLA: "matthews_correlation", data.STSB: "pearson"}[task]
		if cell.Metric == "" {
			cell.Metric = "accuracy"
		}
		cell.Score = 100 * score.Metrics[cell.Metric]
		cells = append(cells, cell)
	}
	return cells, nil
}

// cell returns the report's cell of task and variant.
func (r *GLUEReport) cell(task, variant string) (GLUECell, bool) {
	for _, c := range r.Cells {
		if c.Task == task && c.Variant == variant {
			return c, true
		}
	}
	return GLUECell{}, false
}

// WriteGLUETable writes the report in the paper's layout (Table 4): one row per variant, the tasks' scores (CoLA
// Matthews correlation, STS-B Pearson, accuracy otherwise, x100), their mean, the step's saved activations
// (exact) and peak (as measured, the method named), and the training throughput, each with its ratio to the
// first variant's.
func WriteGLUETable(w io.Writer, r *GLUEReport) error {
	tasks := r.Options.Tasks
	var variants []string
	for _, c := range r.Cells {
		if !containsString(variants, c.Variant) {
			variants = append(variants, c.Variant)
		}
	}
	names := map[string]string{data.CoLA: "CoLA (MCC)", data.SST2: "SST-2 (acc)", data.MRPC: "MRPC (acc)", data.STSB: "STS-B (Pearson)", data.RTE: "RTE (acc)"}
	var head []string
	head = append(head, "method")
	for _, t := range tasks {
		head = append(head, names[t])
	}
	head = append(head, "mean", "saved act. (exact)", "step peak", "samples/s")
	var sb strings.Builder
	sb.WriteString("| " + strings.Join(head, " | ") + " |\n|" + strings.Repeat("---|", len(head)) + "\n")
	var base struct {
		saved, peak float64
		speed       float64
	}
	method := ""
	for i, v := range variants {
		row := []string{v}
		var sum, saved, peak, speed float64
		var n int
		for _, t := range tasks {
			c, ok := r.cell(t, v)
			if !ok {
				row = append(row, "-")
				continue
			}
			row = append(row, fmt.Sprintf("%.2f", c.Score))
			sum += c.Score
			saved += float64(c.SavedActivationBytes)
			peak += float64(c.PeakBytes)
			speed += c.SamplesPerSecond
			n++
			method = c.PeakMethod
		}
		if n == 0 {
			continue
		}
		saved, peak, speed = saved/float64(n), peak/float64(n), speed/float64(n)
		if i == 0 {
			base.saved, base.peak, base.speed = saved, peak, speed
		}
		row = append(row, fmt.Sprintf("%.2f", sum/float64(n)),
			fmt.Sprintf("%s (x%.2f)", memory.FormatBytes(int64(saved)), saved/base.saved),
			fmt.Sprintf("%s (x%.2f)", memory.FormatBytes(int64(peak)), peak/base.peak),
			fmt.Sprintf("%.1f (x%.2f)", speed, speed/base.speed))
		sb.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
	fmt.Fprintf(&sb, "\nsaved act.: exact, the forward tensors the backward pass reads (training-graph walk), per step of %d x %d tokens.\n",
		r.Options.BatchSize, r.Options.SeqLen)
	fmt.Fprintf(&sb, "step peak: %s.\nsamples/s: sequences trained per second of step time (compilation excluded), mean over the tasks; backend: %s.\n", method, r.Backend)
	_, err := io.WriteString(w, sb.String())
	return err
}

func containsString(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
