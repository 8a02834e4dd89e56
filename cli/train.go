package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/generate"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/plan"
)

// usageError marks errors in how a command was called (exit code 2).
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

func newTrainCommand(opts *Options) *cobra.Command {
	var model, data, out, configFile, evalData, evalDataSplit string
	var dataOpts finetune.DataOptions
	var resume, overwrite, dryRun bool
	var budget string
	var budgetMargin float64
	var budgetBatch bool
	calibrate := true
	flagCfg := finetune.Defaults()
	cmd := &cobra.Command{
		Use:   "train --model DIR --data FILE --out DIR [flags]",
		Short: "Fine-tune a model (full, LoRA, LoRA-FA or QLoRA) with the memory-saving options",
		Long: `Trains a Hugging Face model folder on a dataset. --data is read by its format (--data-format, or from the path):
  safetensors  a .safetensors file, one tensor per model input, examples on the first axis
  images       a folder tree <class>/<image>.jpg|png (ViT; preprocessing from the model's preprocessor_config.json)
  image-tar    a .tar/.tar.gz of such a tree (--split picks a subfolder such as train)
  idx          "images.idx[.gz],labels.idx[.gz]" (MNIST, Fashion-MNIST)
  alpaca       Alpaca JSONL (.jsonl): prompt tokens masked from the loss (LLaMA causal LM)
  messages     conversation JSONL (.jsonl whose rows are {"messages": [{"role", "content"}, ...]}, or ShareGPT's
               "conversations"): the chat template (--chat-template), loss on the assistant turns only
  text         plain text (.txt) packed into --seq-len blocks (LLaMA causal LM)
  glue         a GLUE data root with --task cola|sst2|mrpc|stsb|rte, or one task's folder (LLaMA sequence
               classification)
  parquet      a Hugging Face dataset: a .parquet file, or a dataset folder in the hub layout
               (data/train-00000-of-00002.parquet, train/*.parquet, or a config's folder CONFIG/train-*.parquet;
               --split train|validation|test, default train); its columns say what it holds:
               instruction/input/output (Alpaca), text, GLUE's columns with --task (sequence classification),
               image + label (ViT), prompt/chosen/rejected (preference pairs); --columns text=content renames
  preference   preference pairs for --objective dpo or orpo: JSONL (.jsonl whose rows are {"prompt", "chosen",
               "rejected"}, strings or message lists with the chat template; the prompt may be implicit) or
               parquet with those columns; truncated as TRL does (--max-prompt-len keeps a prompt's end,
               --seq-len cuts the completion's end) (docs/preference.md)
Hugging Face Hub ids work for both (docs/hub.md): --model ORG/NAME[@REVISION] (also --init-adapter), --data and
--eval-data hf://datasets/ORG/NAME[@REVISION][/PATH], its config chosen by --data-config (the card's configs, its
default when not given) and its split by --split; a dataset without parquet files is read from the Hub's parquet
conversion. Files go to the huggingface_hub cache Python's tools share (HF_HUB_CACHE, HF_HOME/hub,
~/.cache/huggingface/hub); HF_ENDPOINT, HF_TOKEN and HF_HUB_OFFLINE=1 are read as huggingface_hub reads them.
Text formats use --tokenizer (default: the model folder). Settings come from the defaults, then --config (YAML
with the same keys as the flags, snake_case: --lora-r is lora_r), then the flags given; the whole config is
validated before anything is printed, and printed before any compute. The output folder receives run.yaml,
metrics.jsonl (one line per logging step), checkpoints (checkpoint-N, "latest") and, for LoRA runs, the PEFT
adapter in adapter/. --resume continues the run in --out
from its latest checkpoint exactly (weights, optimizer, schedule, step, RNG and data position); --steps may change
the step count of a constant schedule, not of a decaying one (linear, cosine), whose rates depend on it.

Validation: --eval-data PATH (any format above) or --eval-split FRACTION (a seeded hold-out of the training data,
never trained on) is evaluated whole every --eval-every N steps and at the end: loss and perplexity for a language
model, loss and accuracy for a classifier, as "eval" lines in metrics.jsonl and on the progress output. The
checkpoint of the lowest validation loss is kept in best/ (never pruned); --early-stopping-patience K stops after
K evaluations in a row without a lower validation loss. Every in-memory dataset is checked against the model
(token ids, labels, masks, lengths) before anything is printed; a bad example is named by its index.

On --backend xla:cuda (a GPU) the defaults are what GPU fine-tuning runs: --compute-dtype bfloat16 (float32 master
weights and optimizer state) and --attention flash (cuDNN's fused flash attention with its fused backward); a
value given as a flag or in --config wins. Each optimizer step runs on the device without copying weights or
gradients to the host; the loss is read back every --log-every steps.`,
		Example: `  finetune init --arch vit --preset tiny --num-labels 10 --out /tmp/vit-tiny
  finetune train --model /tmp/vit-tiny --data ../shared/data/cifar10/cifar10-subset-jpg.tar --split train --augment \
    --out runs/vit --method lora --lora-targets q,v --train-modules classifier --approx-act --ms-norm --steps 200
  finetune train --model runs/llama-sst2-init --data ../shared/data/glue/SST-2 --data-format glue \
    --out runs/sst2 --method full --steps 300 --seq-len 64
  finetune train --model pretrained/llama-tiny --data chats.jsonl --seq-len 512 --packing --out runs/chat --steps 200
  finetune train --model pretrained/llama-tiny --data my-hub-dataset --split train --columns output=response \
    --out runs/alpaca --steps 100
  finetune train --model HuggingFaceTB/SmolLM2-135M --data hf://datasets/tatsu-lab/alpaca --seq-len 512 --out runs/smol --steps 200
  finetune train --model pretrained/llama-tiny --data pairs.jsonl --objective dpo --dpo-beta 0.1 --lora-targets all-linear \
    --eval-split 0.1 --eval-every 20 --out runs/dpo --steps 100
  finetune train --out runs/vit --resume --steps 400`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return usagef("--out is required")
			}
			var spec finetune.RunSpec
			if resume {
				var err error
				if spec, err = finetune.ReadRunSpec(out); err != nil {
					return err
				}
				if err := finetune.CheckResumable(out); err != nil {
					return usageError{err}
				}
				changed := 0
				cmd.Flags().Visit(func(f *pflag.Flag) {
					switch f.Name {
					case "out", "resume", "backend", "debug":
					case "steps":
						spec.Config.Steps = flagCfg.Steps
					default:
						changed++
					}
				})
				if changed > 0 || model != "" || data != "" || configFile != "" || evalData != "" || dataOpts != (finetune.DataOptions{}) {
					return usagef("--resume continues the saved run: only --steps may change")
				}
				if err := restoreHub(cmd, &spec); err != nil {
					return err
				}
			} else {
				if model == "" || data == "" {
					return usagef("--model and --data are required (or --resume)")
				}
				if finetune.IsGGUF(model) {
					return usagef("--model %s is a GGUF file: training starts from a Hugging Face model folder (GGUF files are for generate, logits and eval)", model)
				}
				if t := dataOpts.ChatTemplate; t != "" && !slices.Contains(generate.Templates, t) {
					return usagef("--chat-template %q: use one of %s", t, strings.Join(generate.Templates, ", "))
				}
				cfg, initHub, err := resolveConfig(cmd, flagCfg, configFile, opts, budget != "")
				if err != nil {
					return err
				}
				if err := cfg.Validate(); err != nil { // before a download
					return usageError{err}
				}
				// Hub ids (ORG/NAME, hf://datasets/...) become folders of the huggingface_hub cache here.
				wants := hubFiles
				if dryRun {
					wants = hubResolve
				}
				hub := hubSources{initAdapter: initHub} // resolveConfig fetched a Hub init adapter: its settings come from it
				if model, hub.model, err = hubModel(cmd, "--model", model, wants); err != nil {
					return err
				}
				if data, hub.data, err = hubData(cmd, "--data", data, dataOpts); err != nil {
					return err
				}
				if finetune.DataFormat(data, dataOpts) == finetune.FormatGLUE {
					if data, dataOpts.Task, err = glueData(data, dataOpts.Task); err != nil {
						return err
					}
				}
				if cfg.InitAdapter != "" {
					cfg.InitAdapter = abs(cfg.InitAdapter)
				}
				evalOpts := finetune.RunSpec{DataOptions: dataOpts, EvalData: evalData, EvalDataSplit: evalDataSplit}.EvalDataOptions()
				if evalData, hub.evalData, err = hubData(cmd, "--eval-data", evalData, evalOpts); err != nil {
					return err
				}
				if evalData != "" && finetune.DataFormat(evalData, dataOpts) == finetune.FormatGLUE {
					var task string
					if evalData, task, err = glueData(evalData, dataOpts.Task); err != nil {
						return err
					}
					if task != dataOpts.Task {
						return usagef("--eval-data %s is GLUE task %s but --data is %s: validate on the task you train", evalData, task, dataOpts.Task)
					}
				}
				spec = finetune.RunSpec{Model: model, ModelGiven: model, Data: data, DataOptions: dataOpts, EvalData: evalData, EvalDataSplit: evalDataSplit, Config: cfg,
					ModelHub: hub.model, DataHub: hub.data, EvalDataHub: hub.evalData, InitAdapterHub: hub.initAdapter}.AbsPaths()
			}
			if err := spec.Config.Validate(); err != nil {
				return usageError{err}
			}
			if err := spec.CheckValidation(); err != nil {
				return usageError{err}
			}
			if !resume {
				ins := inputs{}.add("--model", spec.Model, modelReads...).add("--tokenizer", spec.DataOptions.Tokenizer, tokenizerReads...).
					add("--config", configFile).add("--init-adapter", spec.Config.InitAdapter, adapterReads...)
				for _, d := range append(strings.Split(spec.Data, ","), evalPaths(spec.EvalData)...) { // an IDX pair is two paths
					ins = ins.add("--data", d)
					if st, err := os.Stat(d); err == nil && st.IsDir() && under(realPath(out), realPath(d)) {
						return usagef("--out %s lies in --data %s: the run's files would become part of the data (an image folder would take checkpoint-1 for a class); choose a folder outside it", out, d)
					}
				}
				// The run's own files: --overwrite deletes and rewrites them (CheckFreshRun), never an input.
				if err := outputFolder("--out", out, trainWrites, ins, true, false); err != nil {
					return err
				}
			}
			if _, err := os.Stat(filepath.Join(spec.Model, "config.json")); err == nil && dryRun && !resume {
				// Nothing is loaded, but a model memfit cannot train (its config.json's model_type) is refused, as
				// the run would refuse it (a Hub model is resolved, not downloaded, by a dry run: no config.json yet).
				if _, err := finetune.FamilyOfFolder(spec.Model); err != nil {
					return err
				}
			}
			if dryRun {
				resolved, _ := yaml.Marshal(spec)
				_, err := cmd.OutOrStdout().Write(resolved)
				return err
			}
			// The budget flags with the whole config, before anything is loaded, calibrated or printed.
			var ap *autopilotRequest
			if budget != "" || cmd.Flags().Changed("budget") {
				b, err := parseBudget("--budget", budget)
				if err != nil {
					return usageError{err}
				}
				if err := plan.CheckAutopilot(spec.Config, budgetMargin); err != nil {
					return usageError{err}
				}
				ap = &autopilotRequest{budget: b, margin: budgetMargin, batch: budgetBatch, calibration: plan.CalibrationFast}
				if !calibrate {
					ap.calibration = plan.CalibrationNone
				}
			} else if budgetBatch || cmd.Flags().Changed("budget-margin") || cmd.Flags().Changed("calibrate") {
				return usagef("--budget-batch, --budget-margin and --calibrate go with --budget")
			}
			if dryRun {
				resolved, _ := yaml.Marshal(spec)
				_, err := cmd.OutOrStdout().Write(resolved)
				return err
			}
			return runTraining(cmd, opts, spec, out, resume, overwrite, ap)
		},
	}
	f := cmd.Flags()
	f.StringVar(&model, "model", "", "base model: a folder (config.json + safetensors) or a Hub id ORG/NAME[@REVISION] (docs/hub.md)")
	f.StringVar(&data, "data", "", "training data: a file or folder in any format below, or hf://datasets/ORG/NAME[@REVISION][/PATH]")
	f.StringVar(&out, "out", "", "output folder")
	f.StringVar(&configFile, "config", "", "YAML config file (keys as the flags, snake_case)")
	f.BoolVar(&resume, "resume", false, "continue the run in --out from its latest checkpoint")
	f.StringVar(&budget, "budget", "", "memory budget (e.g. 24GiB): the memory autopilot chooses a per-block plan of approx-act, Mesa and gradient checkpointing that fits it and runs fastest (saved as block_plan), with MS-norm on unless --ms-norm=false")
	f.Float64Var(&budgetMargin, "budget-margin", 0.05, "fraction of --budget kept free")
	f.BoolVar(&calibrate, "calibrate", true, "with --budget: time the modes on a one- and a two-block model of the real width (seconds, cached); false: predict them with the cost model")
	f.BoolVar(&budgetBatch, "budget-batch", false, "with --budget: also choose the micro-batch (a divisor of --batch-size x --accum-steps, with accumulation keeping that effective batch) that runs fastest")
	f.BoolVar(&dryRun, "dry-run", false, "print the resolved run (run.yaml: flags over --config over defaults) and exit without loading the model or data (its config.json's model_type is checked)")
	f.BoolVar(&overwrite, "overwrite", false, "start a new run in an --out that holds one, deleting its checkpoints, metrics and adapter")
	f.StringVar(&dataOpts.Format, "data-format", "", "safetensors, images, image-tar, idx, alpaca, messages, text, glue, parquet or preference (default: from the path)")
	f.StringVar(&dataOpts.Split, "split", "", "subfolder of an image folder or tar (e.g. train), GLUE split (train, dev), or split of a parquet dataset folder (train, validation, test; default train)")
	f.StringVar(&dataOpts.Config, "data-config", "", "config of a parquet dataset: one of its card's (README.md configs), or a config folder (default: the card's default, or the folder itself)")
	f.StringVar(&dataOpts.Columns, "columns", "", "parquet columns to read under memfit's names, NAME=COLUMN,... (e.g. text=content,label=fine_label)")
	f.StringVar(&dataOpts.Task, "task", "", "GLUE task: cola, sst2, mrpc, stsb, rte (with --data-format glue)")
	f.StringVar(&dataOpts.Tokenizer, "tokenizer", "", "tokenizer of text data (default: the model folder)")
	f.IntVar(&dataOpts.SeqLen, "seq-len", 0, "tokens per text example (default 256); of preference pairs, the most tokens of prompt + completion")
	f.IntVar(&dataOpts.MaxPromptLen, "max-prompt-len", 0, "preference pairs: the most tokens a prompt keeps, its last ones (default: no limit; a pair whose prompt fills --seq-len is left out)")
	f.BoolVar(&dataOpts.Augment, "augment", false, "random crop and horizontal flip of training images")
	f.StringVar(&evalData, "eval-data", "", "validation set, read as --data is (any format train takes): evaluated every --eval-every steps and at the end")
	f.StringVar(&evalDataSplit, "eval-data-split", "", "the split of --eval-data (default: a hub folder's validation split (validation, valid, val, dev, test), GLUE's dev, an image folder's or tar's --split)")
	f.StringVar(&dataOpts.ChatTemplate, "chat-template", "", "template of messages data: auto (the model's own Jinja chat template, else alpaca), model, llama3, chatml or alpaca")
	f.BoolVar(&dataOpts.Packing, "packing", false, "pack several alpaca/messages examples into each --seq-len sequence (positions restart and attention stays within each example)")
	bindSettings(f, &flagCfg, true)
	checksOwnRange(f, "seq-len") // the loader names the model's positions
	alias(f, "warmup-steps", "warmup")
	alias(f, "accum-steps", "accum")
	return cmd
}

// trainWrites are the files and folders train writes in its output folder.
var trainWrites = []string{finetune.RunFile, finetune.MetricsFile, finetune.LatestFile, "checkpoint-*/", finetune.BestDir + "/", "adapter/",
	finetune.ReferenceFile, finetune.LockFile}

// evalPaths are the paths of a validation set (none for ""; an IDX pair is two).
func evalPaths(evalData string) []string {
	if evalData == "" {
		return nil
	}
	return strings.Split(evalData, ",")
}

func abs(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// autopilotRequest is train --budget: the budget in bytes and the fraction of it kept free.
type autopilotRequest struct {
	budget int64
	margin float64
	batch  bool // --budget-batch: the micro-batch is the autopilot's to choose too
	// calibration is how the modes are timed (--calibrate=false: the cost model).
	calibration plan.Calibration
}

// runTraining runs the resolved run through the library's recipe (finetune.Recipe), with the memory autopilot
// (plan.Budget) when --budget asked for it and the machine check (plan.CheckMachine), and prints its progress.
func runTraining(cmd *cobra.Command, opts *Options, spec finetune.RunSpec, out string, resume, overwrite bool, ap *autopilotRequest) error {
	stderr := cmd.ErrOrStderr()
	metricsPath := filepath.Join(out, finetune.MetricsFile)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sig func() os.Signal
	var progress func(finetune.StepStats)
	skipped, warned := 0, false
	warnSkipped := func() {
		if skipped > 0 && !warned {
			fmt.Fprintf(stderr, "\nwarning: %d batch(es) without a target token were skipped (see skipped_batches in %s)\n", skipped, metricsPath)
		}
		warned = true
	}
	r := finetune.Recipe{Spec: spec, Out: out, Resume: resume, Overwrite: overwrite, BackendSpec: opts.Backend,
		Check: plan.CheckMachine, Export: finetune.Export{Adapter: true},
		Hooks: finetune.RunHooks{
			OnDataNote: func(n string) { fmt.Fprintf(stderr, "note: %s\n", n) },
			OnNote:     func(n string) { fmt.Fprintf(stderr, "note: %s\n", n) },
			// Printed once the model, data and config are known to be good: a bad input is one line, not this block.
			OnResolved: func(spec finetune.RunSpec) {
				resolved, _ := yaml.Marshal(spec)
				fmt.Fprintf(stderr, "# resolved run\n%s", resolved)
			},
			OnMetricsTrimmed: func(path string, n, step int) {
				fmt.Fprintf(stderr, "%s: dropped %d line(s) written after the checkpoint of step %d (or cut short)\n", path, n, step)
			},
			OnReference: func(done, total int) {
				if done == total || done%max(1, total/10) < spec.Config.BatchSize {
					fmt.Fprintf(stderr, "reference log-likelihoods (once, cached in %s): %d/%d pairs\n", finetune.ReferenceFile, done, total)
				}
			},
			OnStart: func(tr *finetune.Trainer) error {
				fmt.Fprintf(stderr, "training %d trainable parameters, step %d -> %d\n", tr.TrainableCount(), tr.Step, tr.Config.Steps)
				sig = notifyCancel(cancel)
				progress = newProgress(stderr, tr.Config.Steps, tr.Step)
				return nil
			},
			Hooks: finetune.Hooks{
				OnStep: func(s finetune.StepStats) { progress(s) },
				OnEval: func(e finetune.EvalStats) { fmt.Fprintf(stderr, "%s\n", describeEval(e, stderr)) },
				OnSkip: func(step, n int) {
					if skipped = n; n <= 3 {
						fmt.Fprintf(stderr, "\nwarning: a batch drawn for step %d has no target token (every label is -100): skipped%s\n",
							step, map[bool]string{true: " (later ones are counted, not shown)", false: ""}[n == 3])
					}
				},
			},
			OnTrained: func(*finetune.Trainer) {
				warnSkipped()
				fmt.Fprintln(stderr)
			},
		}}
	if ap != nil {
		r.Plan = plan.Budget{Bytes: ap.budget, Margin: ap.margin, ChooseBatch: ap.batch, CalibSteps: calibrationSteps,
			Calibration: ap.calibration, Cache: plan.DefaultCalibrationCache(), Progress: func(line string) { fmt.Fprintln(stderr, line) },
			OnStart: func() {
				fmt.Fprintf(stderr, "memory autopilot: planning %d modes and timing them (%s, cached)\n", len(plan.AutopilotModes), calibrationName(ap.calibration))
			},
			OnChoice: func(p *plan.Autoplan) error { return printAutoplan(stderr, p, blocksOf(p), ap.budget, ap.margin) },
		}.Plan
	}
	res, err := r.Run(ctx)
	warnSkipped()
	var request *finetune.RequestError
	switch {
	case errors.Is(err, context.Canceled) && res.Trainer != nil:
		s := sig()
		tr := res.Trainer
		fmt.Fprintln(stderr)
		return exitError{code: signalExitCode(s), err: fmt.Errorf("interrupted by %s at step %d of %d: checkpoint written; continue with --resume", signalName(s), tr.Step, tr.Config.Steps)}
	case errors.As(err, &request):
		return usageError{request.Err}
	case err != nil:
		return err
	}
	if st := res.Trainer.EvalState; st.Stopped {
		fmt.Fprintf(cmd.OutOrStdout(), "early stopping at step %d: the validation loss has not gone below %.4f (step %d) for %d evaluations\n",
			res.Trainer.Step, st.BestLoss, st.BestStep, st.BadEvals)
	}
	if st := res.Trainer.EvalState; st.BestStep > 0 && finetune.BestStep(out) == st.BestStep {
		fmt.Fprintf(cmd.OutOrStdout(), "best checkpoint (validation loss %.4f at step %d) in %s: finetune export --run %s --checkpoint best\n",
			st.BestLoss, st.BestStep, filepath.Join(out, finetune.BestDir), out)
	} else if st.BestStep > 0 {
		fmt.Fprintf(cmd.OutOrStdout(), "best evaluation: validation loss %.4f at step %d, whose checkpoint is gone (a kill before it was copied to %s)\n",
			st.BestLoss, st.BestStep, filepath.Join(out, finetune.BestDir))
	}
	if res.AdapterDir != "" {
		fmt.Fprintf(cmd.OutOrStdout(), "adapter written to %s\n", res.AdapterDir)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "run finished at step %d in %s\n", res.Trainer.Step, out)
	return nil
}

// newProgress returns a step hook that draws a progress bar on a terminal, or prints a line per step otherwise.
func newProgress(w io.Writer, steps, start int) func(finetune.StepStats) {
	if cols := terminalColumns(w); cols > 0 {
		// The line fits the terminal: a line wider than it wraps, and each redraw then adds a line.
		width, desc := barLayout(cols, steps, false)
		bar := progressbar.NewOptions(steps, progressbar.OptionSetWriter(w), progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(width), progressbar.OptionThrottle(0))
		_ = bar.Set(start)
		return func(s finetune.StepStats) {
			if s.Synced || s.CompileSeconds > 0 {
				bar.Describe(fitLine(describeParts(s), desc))
			}
			_ = bar.Set(s.Step)
		}
	}
	return func(s finetune.StepStats) {
		if s.Synced || s.CompileSeconds > 0 {
			fmt.Fprintf(w, "step %d/%d %s\n", s.Step, steps, describe(s))
		}
	}
}

// describe is the progress line of a step: its loss and gradient norm when they were read back (Synced; Fit
// does every LogEvery steps), throughput, memory, and the compile time on a step that compiled.
func describe(s finetune.StepStats) string { return strings.Join(describeParts(s), " ") }

// describeParts are describe's parts, the most useful first (a narrow terminal shows the first that fit).
func describeParts(s finetune.StepStats) []string {
	rate := fmt.Sprintf("%.1f ex/s", float64(s.Examples)/s.Seconds)
	if s.Tokens > 0 {
		rate = fmt.Sprintf("%.0f tok/s", float64(s.Tokens)/s.Seconds)
	}
	var parts []string
	if s.Synced {
		parts = append(parts, fmt.Sprintf("loss %.4f", s.Loss))
	}
	parts = append(parts, fmt.Sprintf("lr %.2e", s.LR))
	if s.Synced {
		parts = append(parts, fmt.Sprintf("|g| %.3g", s.GradNorm))
		parts = append(parts, preferenceFigures(s.Metrics)...)
	}
	parts = append(parts, rate, "saved "+memory.FormatBytes(s.SavedActivationBytes), "peak "+memory.FormatPeak(s.PeakBytes, s.PeakMethod))
	if s.CompileSeconds > 0 {
		parts = append(parts, fmt.Sprintf("compile %.2fs", s.CompileSeconds))
	}
	return parts
}

// describeEval is the progress line of an evaluation: its loss and perplexity (language models) or accuracy
// (classifiers), and the best so far. On a terminal it starts on a fresh line (the progress bar's is in use).
func describeEval(e finetune.EvalStats, w io.Writer) string {
	line := fmt.Sprintf("eval step %d: loss %.4f", e.Step, e.Loss)
	if e.Perplexity > 0 {
		line += fmt.Sprintf(" ppl %.3f", e.Perplexity)
	}
	if e.Accuracy != nil {
		line += fmt.Sprintf(" acc %.4f", *e.Accuracy)
	}
	for _, f := range preferenceFigures(e.Metrics) {
		line += " " + f
	}
	line += fmt.Sprintf(" (%d examples, %.1fs)", e.Examples, e.Seconds)
	if e.Best {
		line += ", best so far"
	} else {
		line += fmt.Sprintf(", best %.4f at step %d, %d evaluation(s) without improvement", e.BestLoss, e.BestStep, e.BadEvals)
	}
	if e.EarlyStop {
		line += ": early stopping"
	}
	if cols := terminalColumns(w); cols > 0 {
		line = "\n" + wrapText(line, cols)
	}
	return line
}

// notifyCancel calls cancel on the first SIGINT or SIGTERM and returns a function that tells which signal it was
// (nil before one arrived). A second signal is left to its default action (the process ends).
func notifyCancel(cancel func()) func() os.Signal {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	var got atomic.Value
	go func() {
		s := <-ch
		got.Store(s)
		signal.Stop(ch) // a second Ctrl-C ends the process at once
		cancel()
	}()
	return func() os.Signal {
		s, _ := got.Load().(os.Signal)
		return s
	}
}

// signalExitCode is the shell's convention for a process ended by signal s: 128 + its number (SIGINT 130,
// SIGTERM 143).
func signalExitCode(s os.Signal) int {
	if n, ok := s.(syscall.Signal); ok {
		return 128 + int(n)
	}
	return ExitFailure
}

func signalName(s os.Signal) string {
	switch s {
	case os.Interrupt:
		return "SIGINT (Ctrl-C)"
	case syscall.SIGTERM:
		return "SIGTERM"
	case nil:
		return "cancellation"
	}
	return s.String()
}

// preferenceFigures are the progress line's figures of a preference objective's metrics (none without): the
// reward accuracy and margin, and the chosen and rejected rewards (TRL's rewards/*).
func preferenceFigures(m map[string]float64) []string {
	if len(m) == 0 {
		return nil
	}
	return []string{fmt.Sprintf("rewards: acc %.3f margin %.4f chosen %.4f rejected %.4f", m["rewards/accuracies"],
		m["rewards/margins"], m["rewards/chosen"], m["rewards/rejected"])}
}
