package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"
	"sigs.k8s.io/yaml"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/memory"
)

// usageError marks errors in how a command was called (exit code 2).
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// trainFlags binds the training config's fields to flags; only flags the user set override the config file.
func trainFlags(f *pflag.FlagSet, c *finetune.Config) {
	f.StringVar(&c.Method, "method", c.Method, "full, lora, lora-fa or qlora (LoRA over an NF4 base)")
	f.IntVar(&c.LoRARank, "lora-r", c.LoRARank, "LoRA rank")
	f.Float64Var(&c.LoRAAlpha, "lora-alpha", c.LoRAAlpha, "LoRA alpha (scale alpha/r)")
	f.BoolVar(&c.RSLoRA, "rslora", c.RSLoRA, "rank-stabilised scale alpha/sqrt(r)")
	f.Float64Var(&c.LoRADropout, "lora-dropout", c.LoRADropout, "dropout on the adapter branch's input")
	f.StringSliceVar(&c.LoRATarget, "lora-targets", c.LoRATarget, "layers to adapt: q,k,v,o,gate,up,down,attn,mlp, all-linear or module names")
	f.StringSliceVar(&c.TrainModules, "train-modules", c.TrainModules, "base modules that train next to the adapters (e.g. classifier, score)")
	f.StringVar(&c.InitAdapter, "init-adapter", c.InitAdapter, "start from this PEFT LoRA adapter folder")
	f.BoolVar(&c.ApproxAct, "approx-act", c.ApproxAct, "ReGELU2/ReSiLU2: exact activation forward, 2-bit backward")
	f.BoolVar(&c.MSNorm, "ms-norm", c.MSNorm, "MS-LN/MS-RMSNorm: fold norm affines into the next linear layers")
	f.BoolVar(&c.GradCkpt, "grad-ckpt", c.GradCkpt, "gradient checkpointing per block (recompute in backward)")
	f.StringSliceVar(&c.Mesa, "mesa", c.Mesa, "store these saved activations as int8 (Mesa): act, norm, softmax, attn, linear or all")
	f.StringVar(&c.Attention, "attention", c.Attention, "standard, memory-efficient or flash (the backend's fused attention; memory-efficient where it has none) (default on --backend xla:cuda: flash)")
	f.StringVar(&c.Optimizer, "optimizer", c.Optimizer, "adamw or sgd")
	f.Float64Var(&c.LR, "lr", c.LR, "learning rate")
	f.Float64Var(&c.WeightDecay, "weight-decay", c.WeightDecay, "weight decay (decoupled for adamw)")
	f.StringVar(&c.Schedule, "schedule", c.Schedule, "constant, linear or cosine")
	f.IntVar(&c.WarmupSteps, "warmup", c.WarmupSteps, "linear warm-up steps")
	f.Float64Var(&c.ClipNorm, "clip-norm", c.ClipNorm, "clip the gradients' global norm (0: off)")
	f.IntVar(&c.Steps, "steps", c.Steps, "optimizer steps")
	f.IntVar(&c.BatchSize, "batch-size", c.BatchSize, "examples per micro-batch")
	f.IntVar(&c.AccumSteps, "accum", c.AccumSteps, "micro-batches per optimizer step (gradient accumulation)")
	f.Uint64Var(&c.Seed, "seed", c.Seed, "random seed (adapter init, data order)")
	f.StringVar(&c.ComputeDType, "compute-dtype", c.ComputeDType, "float32 or bfloat16 (float32 master weights) (default on --backend xla:cuda: bfloat16)")
	f.IntVar(&c.LogEvery, "log-every", c.LogEvery, "write a metrics line every N steps")
	f.IntVar(&c.CheckpointEvery, "checkpoint-every", c.CheckpointEvery, "checkpoint every N steps (0: at the end)")
	f.IntVar(&c.KeepCheckpoints, "keep-checkpoints", c.KeepCheckpoints, "keep only the newest N checkpoints (0: all)")
	f.Float64Var(&c.DivergenceFactor, "divergence-factor", c.DivergenceFactor, "stop when a logged loss exceeds this many times its lowest and 3 times its first (0: never)")
}

func newTrainCommand(opts *Options) *cobra.Command {
	var model, data, out, configFile string
	var dataOpts finetune.DataOptions
	var resume, overwrite, dryRun bool
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
  text         plain text (.txt) packed into --seq-len blocks (LLaMA causal LM)
  glue         a GLUE data root with --task cola|sst2|mrpc|stsb|rte (LLaMA sequence classification)
Text formats use --tokenizer (default: the model folder). Settings come from the defaults, then --config (YAML
with the same keys as the flags, snake_case), then the flags given; the whole config is validated and printed
before any compute. The output folder receives run.yaml, metrics.jsonl (one line per logging step), checkpoints
(checkpoint-N, "latest") and, for LoRA runs, the PEFT adapter in adapter/. --resume continues the run in --out
from its latest checkpoint exactly (weights, optimizer, schedule, step, RNG and data position).

On --backend xla:cuda (a GPU) the defaults are what GPU fine-tuning runs: --compute-dtype bfloat16 (float32 master
weights and optimizer state) and --attention flash (cuDNN's fused flash attention with its fused backward); a
value given as a flag or in --config wins. Each optimizer step runs on the device without copying weights or
gradients to the host; the loss is read back every --log-every steps.`,
		Example: `  finetune init --arch vit --preset tiny --num-labels 10 --out /tmp/vit-tiny
  finetune train --model /tmp/vit-tiny --data ../shared/data/cifar10/cifar10-subset-jpg.tar --split train --augment \
    --out runs/vit --method lora --lora-targets q,v --train-modules classifier --approx-act --ms-norm --steps 200
  finetune train --model runs/llama-sst2-init --data ../shared/data/glue --data-format glue --task sst2 \
    --out runs/sst2 --method full --steps 300 --seq-len 64
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
				changed := 0
				cmd.Flags().Visit(func(f *pflag.Flag) {
					switch f.Name {
					case "out", "resume", "backend":
					case "steps":
						spec.Config.Steps = flagCfg.Steps
					default:
						changed++
					}
				})
				if changed > 0 || model != "" || data != "" || configFile != "" || dataOpts != (finetune.DataOptions{}) {
					return usagef("--resume continues the saved run: only --steps may change")
				}
			} else {
				if model == "" || data == "" {
					return usagef("--model and --data are required (or --resume)")
				}
				cfg := finetune.Defaults()
				if configFile != "" {
					var err error
					if cfg, err = finetune.ReadConfigFile(configFile, cfg); err != nil {
						return usageError{err}
					}
				}
				cmd.Flags().Visit(func(f *pflag.Flag) { applyFlag(&cfg, &flagCfg, f.Name) })
				var err error
				if cfg, err = gpuDefaults(cmd, cfg, configFile, opts); err != nil {
					return usageError{err}
				}
				if cfg.Method == finetune.MethodFull && !cmd.Flags().Changed("lora-r") && !cmd.Flags().Changed("lora-targets") {
					cfg.LoRARank, cfg.LoRATarget = 0, nil // the LoRA defaults do not apply to full fine-tuning
				}
				spec = finetune.RunSpec{Model: model, Data: data, DataOptions: dataOpts, Config: cfg}.AbsPaths()
			}
			if err := spec.Config.Validate(); err != nil {
				return usageError{err}
			}
			if dryRun {
				resolved, _ := yaml.Marshal(spec)
				_, err := cmd.OutOrStdout().Write(resolved)
				return err
			}
			return runTraining(cmd, opts, spec, out, resume, overwrite)
		},
	}
	f := cmd.Flags()
	f.StringVar(&model, "model", "", "base model folder (config.json + safetensors)")
	f.StringVar(&data, "data", "", "training examples (safetensors)")
	f.StringVar(&out, "out", "", "output folder")
	f.StringVar(&configFile, "config", "", "YAML config file (keys as the flags, snake_case)")
	f.BoolVar(&resume, "resume", false, "continue the run in --out from its latest checkpoint")
	f.BoolVar(&dryRun, "dry-run", false, "print the resolved run (run.yaml: flags over --config over defaults) and exit without loading anything")
	f.BoolVar(&overwrite, "overwrite", false, "start a new run in an --out that holds one, deleting its checkpoints, metrics and adapter")
	f.StringVar(&dataOpts.Format, "data-format", "", "safetensors, images, image-tar, idx, alpaca, text or glue (default: from the path)")
	f.StringVar(&dataOpts.Split, "split", "", "subfolder of an image folder or tar (e.g. train), or GLUE split (train, dev)")
	f.StringVar(&dataOpts.Task, "task", "", "GLUE task: cola, sst2, mrpc, stsb, rte (with --data-format glue)")
	f.StringVar(&dataOpts.Tokenizer, "tokenizer", "", "tokenizer of text data (default: the model folder)")
	f.IntVar(&dataOpts.SeqLen, "seq-len", 0, "tokens per text example (default 256)")
	f.BoolVar(&dataOpts.Augment, "augment", false, "random crop and horizontal flip of training images")
	trainFlags(f, &flagCfg)
	return cmd
}

// applyFlag copies the flag's field from the flag-bound config into cfg.
func applyFlag(cfg, flags *finetune.Config, name string) {
	switch name {
	case "method":
		cfg.Method = flags.Method
	case "lora-r":
		cfg.LoRARank = flags.LoRARank
	case "lora-alpha":
		cfg.LoRAAlpha = flags.LoRAAlpha
	case "rslora":
		cfg.RSLoRA = flags.RSLoRA
	case "lora-dropout":
		cfg.LoRADropout = flags.LoRADropout
	case "lora-targets":
		cfg.LoRATarget = flags.LoRATarget
	case "train-modules":
		cfg.TrainModules = flags.TrainModules
	case "init-adapter":
		cfg.InitAdapter = abs(flags.InitAdapter)
	case "approx-act":
		cfg.ApproxAct = flags.ApproxAct
	case "ms-norm":
		cfg.MSNorm = flags.MSNorm
	case "grad-ckpt":
		cfg.GradCkpt = flags.GradCkpt
	case "mesa":
		cfg.Mesa = flags.Mesa
	case "attention":
		cfg.Attention = flags.Attention
	case "optimizer":
		cfg.Optimizer = flags.Optimizer
	case "lr":
		cfg.LR = flags.LR
	case "weight-decay":
		cfg.WeightDecay = flags.WeightDecay
	case "schedule":
		cfg.Schedule = flags.Schedule
	case "warmup":
		cfg.WarmupSteps = flags.WarmupSteps
	case "clip-norm":
		cfg.ClipNorm = flags.ClipNorm
	case "steps":
		cfg.Steps = flags.Steps
	case "batch-size":
		cfg.BatchSize = flags.BatchSize
	case "accum":
		cfg.AccumSteps = flags.AccumSteps
	case "seed":
		cfg.Seed = flags.Seed
	case "compute-dtype":
		cfg.ComputeDType = flags.ComputeDType
	case "log-every":
		cfg.LogEvery = flags.LogEvery
	case "checkpoint-every":
		cfg.CheckpointEvery = flags.CheckpointEvery
	case "keep-checkpoints":
		cfg.KeepCheckpoints = flags.KeepCheckpoints
	case "divergence-factor":
		cfg.DivergenceFactor = flags.DivergenceFactor
	}
}

func abs(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

func runTraining(cmd *cobra.Command, opts *Options, spec finetune.RunSpec, out string, resume, overwrite bool) error {
	unlock, err := finetune.LockRun(out)
	if err != nil {
		return err
	}
	defer unlock()
	if err := finetune.CleanStale(out); err != nil {
		return err
	}
	if !resume {
		inputs := []string{spec.Model, spec.DataOptions.Tokenizer, spec.Config.InitAdapter}
		inputs = append(inputs, strings.Split(spec.Data, ",")...) // an IDX pair is two paths
		if err := finetune.CheckFreshRun(out, overwrite, inputs...); err != nil {
			return usageError{err}
		}
	}
	model, loader, err := spec.Open()
	if err != nil {
		return err
	}
	if l, ok := loader.(*finetune.Loader); ok {
		for _, n := range l.Notes {
			fmt.Fprintf(cmd.ErrOrStderr(), "note: %s\n", n)
		}
	}
	backend, err := opts.NewBackend()
	if err != nil {
		return err
	}
	if err := finetune.CheckFitsMachine(backend, spec, loader); err != nil {
		return err
	}
	var tr *finetune.Trainer
	if resume {
		if tr, err = finetune.Resume(out, model, backend, loader); err != nil {
			if errors.Is(err, finetune.ErrDataChanged) {
				return fmt.Errorf("--data %s: %w", spec.Data, err)
			}
			return err
		}
		if diff := finetune.ConfigDiff(spec.Config, tr.Config); len(diff) > 0 {
			return fmt.Errorf("%s does not match the checkpoint it resumes (here = run.yaml, there = the checkpoint): %s",
				filepath.Join(out, finetune.RunFile), strings.Join(diff, "; "))
		}
		if spec.Config.Steps < tr.Step {
			return usagef("--steps %d is below the step the checkpoint reached (%d): give more steps to continue; the run's adapter is in %s", spec.Config.Steps, tr.Step, filepath.Join(out, "adapter"))
		}
		tr.Config.Steps = spec.Config.Steps
		if err := tr.Config.Validate(); err != nil {
			return usageError{err}
		}
	} else {
		if tr, err = finetune.New(model, spec.Config, backend); err != nil {
			return usageError{err}
		}
	}
	// Printed once the model, data and config are known to be good: a bad input is one line, not this block.
	resolved, _ := yaml.Marshal(spec)
	fmt.Fprintf(cmd.ErrOrStderr(), "# resolved run\n%s", resolved)
	if err := finetune.WriteRunSpec(out, spec); err != nil {
		return err
	}
	metricsPath := filepath.Join(out, finetune.MetricsFile)
	if resume {
		if n, err := finetune.TrimMetrics(metricsPath, tr.Step); err != nil {
			return err
		} else if n > 0 {
			fmt.Fprintf(cmd.ErrOrStderr(), "%s: dropped %d line(s) written after the checkpoint of step %d (or cut short)\n", metricsPath, n, tr.Step)
		}
	}
	metrics, err := finetune.OpenMetrics(metricsPath)
	if err != nil {
		return err
	}
	defer metrics.Close()
	stderr := cmd.ErrOrStderr()
	fmt.Fprintf(stderr, "training %d trainable parameters, step %d -> %d\n", tr.TrainableCount(), tr.Step, tr.Config.Steps)
	ctx, sig := signalContext()
	progress := newProgress(stderr, tr.Config.Steps, tr.Step)
	skipped := 0
	onSkip := func(step, n int) {
		if skipped = n; n <= 3 {
			fmt.Fprintf(stderr, "\nwarning: a batch drawn for step %d has no target token (every label is -100): skipped%s\n",
				step, map[bool]string{true: " (later ones are counted, not shown)", false: ""}[n == 3])
		}
	}
	err = tr.Fit(ctx, loader, out, metrics, finetune.Hooks{OnStep: progress, OnSkip: onSkip})
	if skipped > 0 {
		fmt.Fprintf(stderr, "\nwarning: %d batch(es) without a target token were skipped (see skipped_batches in %s)\n", skipped, metricsPath)
	}
	if errors.Is(err, context.Canceled) {
		s := sig()
		fmt.Fprintln(stderr)
		return exitError{code: signalExitCode(s), err: fmt.Errorf("interrupted by %s at step %d of %d: checkpoint written; continue with --resume", signalName(s), tr.Step, tr.Config.Steps)}
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(stderr)
	if tr.Adapters != nil {
		dir := filepath.Join(out, "adapter")
		if err := tr.ExportAdapter(dir, spec.Model); err != nil {
			return err
		}
		fmt.Fprintf(cmd.OutOrStdout(), "adapter written to %s\n", dir)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "run finished at step %d in %s\n", tr.Step, out)
	return nil
}

// newProgress returns a step hook that draws a progress bar on a terminal, or prints a line per step otherwise.
func newProgress(w io.Writer, steps, start int) func(finetune.StepStats) {
	f, isFile := w.(*os.File)
	if isFile && term.IsTerminal(int(f.Fd())) {
		bar := progressbar.NewOptions(steps, progressbar.OptionSetWriter(w), progressbar.OptionShowCount(),
			progressbar.OptionSetWidth(30), progressbar.OptionThrottle(0))
		_ = bar.Set(start)
		return func(s finetune.StepStats) {
			if s.Synced || s.CompileSeconds > 0 {
				bar.Describe(describe(s))
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
func describe(s finetune.StepStats) string {
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
	}
	parts = append(parts, rate, "saved "+memory.FormatBytes(s.SavedActivationBytes), "peak "+memory.FormatBytes(s.PeakBytes))
	if s.CompileSeconds > 0 {
		parts = append(parts, fmt.Sprintf("compile %.2fs", s.CompileSeconds))
	}
	return strings.Join(parts, " ")
}

// gpuDefaults applies finetune.GPUDefaults for the command's backend: a setting given as a flag or as a key of
// the --config file is the user's and stays.
func gpuDefaults(cmd *cobra.Command, cfg finetune.Config, configFile string, opts *Options) (finetune.Config, error) {
	inFile := map[string]any{}
	if configFile != "" {
		b, err := os.ReadFile(configFile)
		if err != nil {
			return cfg, err
		}
		if err := yaml.Unmarshal(b, &inFile); err != nil {
			return cfg, fmt.Errorf("%s: %w", configFile, err)
		}
	}
	explicit := func(key string) bool {
		_, ok := inFile[key]
		return ok || cmd.Flags().Changed(strings.ReplaceAll(key, "_", "-"))
	}
	return finetune.GPUDefaults(cfg, engine.ChooseSpec(opts.Backend), explicit), nil
}

// signalContext returns a context cancelled by the first SIGINT or SIGTERM, and a function that tells which
// signal it was (nil before one arrived). A second signal is left to its default action (the process ends).
func signalContext() (context.Context, func() os.Signal) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	var got atomic.Value
	go func() {
		s := <-ch
		got.Store(s)
		signal.Stop(ch) // a second Ctrl-C ends the process at once
		cancel()
	}()
	return ctx, func() os.Signal {
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
