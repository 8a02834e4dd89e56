package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/plan"
)

func newMemoryCommand(opts *Options) *cobra.Command {
	var model, configFile, variantList, budget string
	var seqLen, numLabels, maxBatch, maxSeq int
	var asJSON, compileTime, autoplan, packing bool
	var budgetMargin float64
	var budgetBatch bool
	var forBackend, beside string
	calibrate := true
	flagCfg := finetune.Defaults()
	cmd := &cobra.Command{
		Use:   "memory --model DIR|PRESET [flags]",
		Short: "Show what a training step keeps in memory, for each memory-saving variant side by side",
		Long: `Builds the training step of the given configuration (without running it and without reading any weights:
only config.json is read) in each memory-saving variant and prints, side by side:
  - saved activations: the forward tensors the backward pass reads, exact from the training graph, split by op
    kind (linear inputs, norms, activations, attention, other), the paper's Figure 2 breakdown;
  - the step's peak: on the pure-Go backend a liveness simulation of its executor (checked to the byte against a
    buffer-pool counter in tools/peakmem), on XLA the compiled program's sizes, with the pure-Go planner's peak
    of the same step beside them (--beside; what a plan made on another machine counts);
  - weights, gradients and optimizer state, and the total (peak + optimizer state);
  - ratios to the plain variant.
--model takes a Hugging Face folder or a preset name (vit: tiny, vit-b16; llama: tiny, llama-1b, llama-7b).
The flags are the training settings that shape the step (the rest of a training config changes no byte of it);
--config takes a train config file (YAML, keys as train's flags in snake_case), whose memory-saving options the
variants replace. --max-batch-size N / --max-seq-len N with --budget search, for each variant, the largest batch
or sequence length up to N whose total fits the budget (the paper's Table 9). --compile-time instead times building and compiling each
variant's step programs (the gradient computation alone, and the device-resident step's).
--budget B --plan runs the memory autopilot: the per-block plan (approx-act, Mesa, gradient checkpointing) that
fits B and runs fastest. Its step times come from the fast calibration (each mode timed on the real width cut to
one block, plain on two, random weights for that small model only: seconds, progress on stderr, cached), or from
the cost model (FLOPs recomputed, bytes moved; docs/autopilot.md) with --calibrate=false, with --for-backend
(a GPU run planned here), or when even the one-block model would take too much memory here.`,
		Example: `  finetune memory --model vit-b16 --num-labels 10 --lora-targets all-linear --batch-size 8
  finetune memory --model llama-1b --lora-targets all-linear --batch-size 1 --seq-len 256 --json
  finetune memory --model llama-7b --compute-dtype bfloat16 --batch-size 1 --max-seq-len 8192 --budget 24GiB
  finetune memory --model llama-1b --lora-targets all-linear --batch-size 2 --seq-len 512 --budget 7GiB --plan
  finetune memory --model llama-7b --method qlora --lora-targets all-linear --compute-dtype bfloat16 --batch-size 4 \
    --seq-len 512 --budget 16GiB --plan --for-backend xla:cuda
  finetune memory --model llama-7b --method qlora --lora-targets all-linear --compute-dtype bfloat16 --batch-size 4 \
    --seq-len 512 --variants plain,approx-act+ms-norm --compile-time`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if model == "" {
				return usagef("--model is required (a model folder or a preset such as vit-b16 or llama-1b)")
			}
			cfg, _, err := resolveConfig(cmd, flagCfg, configFile, opts, autoplan)
			if err != nil {
				return err
			}
			var variants []finetune.Variant
			for _, name := range strings.Split(variantList, ",") {
				v, err := finetune.VariantByName(strings.TrimSpace(name))
				if err != nil {
					return usageError{err}
				}
				variants = append(variants, v)
			}
			if maxBatch > 0 && maxSeq > 0 {
				return usagef("--max-batch-size and --max-seq-len search one axis at a time: give one of them")
			}
			var budgetBytes int64
			if budget != "" || cmd.Flags().Changed("budget") {
				if budgetBytes, err = parseBudget("--budget", budget); err != nil {
					return usageError{err}
				}
			}
			if autoplan && (maxBatch > 0 || maxSeq > 0) {
				return usagef("--plan chooses a per-block plan for --budget, without --max-batch-size / --max-seq-len")
			}
			if autoplan && budget == "" {
				return usagef("--plan needs --budget SIZE (e.g. --budget 24GiB): the memory its per-block plan must fit")
			}
			if !autoplan && (maxBatch > 0 || maxSeq > 0) != (budget != "") {
				return usagef("--max-batch-size / --max-seq-len and --budget go together (or --budget with --plan)")
			}
			for _, f := range []string{"budget-margin", "calibrate", "for-backend"} {
				if cmd.Flags().Changed(f) && !autoplan {
					return usagef("--%s is a setting of the memory autopilot: it goes with --budget SIZE --plan", f)
				}
			}
			if autoplan {
				if err := plan.CheckAutopilot(cfg, budgetMargin); err != nil {
					return usageError{err}
				}
				if forBackend != "" {
					if _, err := plan.ProfileFor(forBackend); err != nil {
						return usageError{err}
					}
				}
			}
			if model, _, err = hubModel(cmd, "--model", model, hubConfig); err != nil {
				return err
			}
			backend, err := opts.NewBackend()
			if err != nil {
				return err
			}
			defer backend.Finalize()
			in := finetune.Shape{Batch: cfg.BatchSize, Seq: seqLen, Packed: packing}
			if packing {
				m, _, err := plan.ShapeModel(model, cfg, numLabels)
				if err != nil {
					return err
				}
				if m.Task() != "CAUSAL_LM" {
					return usagef("--packing plans packed sequences of a LLaMA causal LM (train --packing); %s is not one", model)
				}
			}
			if autoplan {
				m, _, err := plan.ShapeModel(model, cfg, numLabels)
				if err != nil {
					return err
				}
				if fam, _ := finetune.FamilyOf(m); !fam.Sequence {
					in.Seq = 0 // a ViT's sequence is its image size
				}
				// The model stays weightless: the fast calibration makes weights for its one- and two-block cuts only.
				calib := plan.CalibrationFast
				if !calibrate {
					calib = plan.CalibrationNone
				}
				stderr := cmd.ErrOrStderr()
				o := plan.AutopilotOptions{Backend: backend, Model: m, Config: cfg, Shape: in, Budget: budgetBytes, Margin: budgetMargin,
					Calibration: calib, ForBackend: forBackend, CalibSteps: calibrationSteps, Cache: plan.DefaultCalibrationCache(),
					Progress: func(line string) { fmt.Fprintln(stderr, line) }}
				var p *plan.Autoplan
				if budgetBatch {
					p, err = plan.AutopilotBatch(o)
				} else {
					p, err = plan.Autopilot(o)
				}
				if err != nil {
					return err
				}
				if asJSON {
					target := backend.Name()
					if forBackend != "" {
						target = forBackend
					}
					return writeJSON(cmd.OutOrStdout(), map[string]any{"budget_bytes": budgetBytes, "margin": budgetMargin, "shape": in,
						"method": cfg.Method, "backend": backend.Name(), "for_backend": target, "autoplan": p,
						"bytes": "total_bytes = step peak + optimizer state (exact planner)"})
				}
				return printAutoplan(cmd.OutOrStdout(), p, blocksOf(p), budgetBytes, budgetMargin)
			}
			if budget != "" {
				limit, axis := maxBatch, "batch"
				if maxSeq > 0 {
					limit, axis = maxSeq, "seq"
				}
				b := budgetBytes
				fits, err := plan.Capacities(backend, plan.CapacityRequest{Model: model, Config: cfg, Labels: numLabels, Shape: in,
					Axis: axis, Budget: b, Limit: limit, Variants: variants})
				if err != nil {
					return err
				}
				if asJSON {
					return writeJSON(cmd.OutOrStdout(), map[string]any{"axis": axis, "budget_bytes": b, "limit": limit,
						"shape": in, "method": cfg.Method, "fits": fits, "bytes": "total_bytes = step peak + optimizer state"})
				}
				w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', tabwriter.AlignRight)
				fmt.Fprintf(w, "variant\tmax %s\ttotal at max\t\n", axis)
				for _, f := range fits {
					fmt.Fprintf(w, "%s\t%d\t%s\t\n", f.Variant, f.Max, memory.FormatBytes(f.Bytes))
				}
				if err := w.Flush(); err != nil {
					return err
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "budget %s; total = step peak (%s) + optimizer state; searched up to %d\n",
					memory.FormatBytes(b), peakMethod(backend.Name()), limit)
				return err
			}
			// Every variant's model first (config.json only), so that one the step cannot take (a grad-ckpt variant
			// of too many blocks) is refused before any variant is built and printed.
			for _, v := range variants {
				if _, _, err := plan.ShapeModel(model, v.Apply(cfg), numLabels); err != nil {
					if limit := (*finetune.CheckpointLimitError)(nil); errors.As(err, &limit) {
						return fmt.Errorf("variant %s: %w", v.Name, err)
					}
					return err
				}
			}
			if compileTime {
				for _, v := range variants {
					vc := v.Apply(cfg)
					m, shp, err := plan.ShapeModel(model, vc, numLabels)
					if err != nil {
						return err
					}
					ct, err := plan.TimeCompile(backend, m, shp, vc, in)
					if err != nil {
						return err
					}
					if asJSON {
						if err := writeJSON(cmd.OutOrStdout(), map[string]any{"variant": v.Name, "backend": backend.Name(), "compile": ct}); err != nil {
							return err
						}
						continue
					}
					fmt.Fprintf(cmd.OutOrStdout(), "%s: compile on %s: gradient step %.2f s; device-resident step %.2f s\n",
						v.Name, backend.Name(), ct.Gradient, ct.Device)
				}
				return nil
			}
			req := plan.MemoryRequest{Model: model, Config: cfg, Labels: numLabels, Shape: in, Variants: variants}
			if beside == "" && backend.Name() == "xla" {
				beside = "go" // XLA's compiled sizes beside the pure-Go planner's accounting
			}
			if beside != "" && beside != "none" {
				b, err := engine.NewBackend(beside)
				if err != nil {
					return usagef("--beside %s: %v", beside, err)
				}
				defer b.Finalize()
				req.Beside = b
			}
			stderr := cmd.ErrOrStderr()
			req.Progress = func(line string) { fmt.Fprintln(stderr, line) }
			rep, err := plan.Memory(backend, req)
			if err != nil {
				return err
			}
			if asJSON {
				return writeJSON(cmd.OutOrStdout(), rep)
			}
			return writeMemoryTable(cmd.OutOrStdout(), rep)
		},
	}
	f := cmd.Flags()
	f.StringVar(&model, "model", "", "model folder or Hub id ORG/NAME[@REVISION] (only config.json is read), or preset name")
	f.StringVar(&configFile, "config", "", "YAML training config (keys as train's flags, snake_case); its settings that do not shape the step are ignored")
	f.IntVar(&seqLen, "seq-len", 256, "tokens per sequence (LLaMA)")
	f.IntVar(&numLabels, "num-labels", 0, "classes of a preset's classification head (0: ViTModel / causal LM)")
	f.BoolVar(&packing, "packing", false, "plan packed sequences as train --packing trains them: position_ids and a per-row attention mask (LLaMA causal LM)")
	f.StringVar(&variantList, "variants", "plain,approx-act,ms-norm,approx-act+ms-norm,grad-ckpt,mesa",
		"variants to compare, plain first (also: approx-act+ms-norm+mesa-softmax)")
	f.BoolVar(&asJSON, "json", false, `print one JSON object {"variants": [...]} instead of the table`)
	f.IntVar(&maxBatch, "max-batch-size", 0, "search the largest batch size up to N that fits --budget")
	f.IntVar(&maxSeq, "max-seq-len", 0, "search the longest sequence up to N that fits --budget (LLaMA)")
	f.StringVar(&budget, "budget", "", "memory budget for --max-batch-size/--max-seq-len or --plan, e.g. 24GiB, 80GB, 1.5e9")
	f.BoolVar(&autoplan, "plan", false, "with --budget: the memory autopilot's per-block plan (approx-act, Mesa, gradient checkpointing) that fits and runs fastest, its modes timed on this backend (MS-norm on unless the --config file sets ms_norm: false)")
	f.Float64Var(&budgetMargin, "budget-margin", 0.05, "fraction of --budget kept free (with --plan)")
	f.BoolVar(&calibrate, "calibrate", true, "with --plan: time the modes on a one- and a two-block model of the real width (seconds, cached); false: predict them with the cost model (docs/autopilot.md)")
	f.StringVar(&forBackend, "for-backend", "", "with --plan: plan for a run on another backend (go, xla:cuda = H100-class GPU, xla:cuda:h200), its step times from the cost model's device profile")
	f.BoolVar(&budgetBatch, "budget-batch", false, "with --plan: also choose the micro-batch (a divisor of --batch-size, the effective batch, with accumulation making up the rest) that runs fastest")
	f.StringVar(&beside, "beside", "", `also plan each variant on this backend and print its step peak beside (default on XLA: go, the pure-Go planner's accounting beside XLA's compiled sizes; "none": off)`)
	f.BoolVar(&compileTime, "compile-time", false, "instead of the memory table, build and compile each variant's step programs (the gradient computation and the device-resident step) and print how long that took")
	bindSettings(f, &flagCfg, true, memorySettings...)
	alias(f, "seq-len", "seq")
	alias(f, "num-labels", "labels")
	alias(f, "max-batch-size", "max-batch")
	alias(f, "max-seq-len", "max-seq")
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error {
		for _, f := range []string{"--approx-act", "--ms-norm", "--grad-ckpt", "--mesa"} {
			if strings.Contains(err.Error(), "unknown flag: "+f) {
				return usagef("%v: memory compares the variants itself, choose them with --variants (e.g. plain,approx-act+ms-norm)", err)
			}
		}
		return usageError{err}
	})
	return cmd
}

func peakMethod(backend string) memory.Method {
	if backend == "xla" {
		return memory.MethodXLACompiled
	}
	return memory.MethodSimulation
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeMemoryTable writes the memory report as a table, one row per variant, fitted to the terminal's width when
// out is one (terminalColumns: the table is about 215 columns wide; on a narrower terminal it is split into
// tables of fewer columns, each starting with the variant), one line per row anywhere else.
func writeMemoryTable(out io.Writer, rep *plan.Report) error {
	cols := terminalColumns(out)
	shape := fmt.Sprintf("batch %d", rep.Shape.Batch)
	method := rep.Method
	if rep.Objective != "" {
		shape = fmt.Sprintf("batch %d pairs (chosen + rejected: %d sequences)", rep.Shape.Batch, 2*rep.Shape.Batch)
		method += ", objective " + rep.Objective
	}
	if rep.Shape.Seq > 0 {
		shape += fmt.Sprintf(", sequence %d", rep.Shape.Seq)
	}
	if rep.Shape.Packed {
		shape += " (packed)"
	}
	fmt.Fprintf(out, "%s\n\n", wrapText(fmt.Sprintf("%s (%s), method %s, %s, %s attention, %s, backend %s", rep.Model, rep.ModelType,
		method, rep.ComputeDType, rep.Attention, shape, rep.Backend), cols))
	header := []string{"variant", "saved act."}
	for _, k := range engine.Kinds {
		header = append(header, k.String())
	}
	beside := besideName(rep.Beside)
	header = append(header, "x plain", "step peak", "x plain")
	if beside != "" {
		header = append(header, beside+" peak", "x plain")
	}
	rows := [][]string{append(header, "weights", "grads", "optimizer", "total", "x plain", "trainable")}
	for _, v := range rep.Variants {
		row := []string{v.Name, memory.FormatBytes(v.SavedActivationBytes)}
		for _, k := range engine.Kinds {
			row = append(row, memory.FormatBytes(v.SavedByKind[k.String()]))
		}
		row = append(row, fmt.Sprintf("%.3f", v.SavedRatio), memory.FormatPeakCell(v.PeakBytes, v.PeakMethod, 3), fmt.Sprintf("%.3f", v.PeakRatio))
		if beside != "" {
			row = append(row, memory.FormatPeakCell(v.BesidePeakBytes, v.BesidePeakMethod, 3), fmt.Sprintf("%.3f", v.BesidePeakRatio))
		}
		rows = append(rows, append(row, memory.FormatBytes(v.WeightsBytes), memory.FormatBytes(v.GradientBytes),
			memory.FormatBytes(v.OptimizerBytes), memory.FormatBytes(v.TotalBytes), fmt.Sprintf("%.3f", v.TotalRatio), fmt.Sprint(v.TrainableParams)))
	}
	if err := writeTable(out, rows, cols); err != nil {
		return err
	}
	if len(rep.Variants) > 0 {
		line := func(format string, args ...any) { fmt.Fprintln(out, wrapText(fmt.Sprintf(format, args...), cols)) }
		fmt.Fprintln(out)
		line("saved act.: %s", rep.Variants[0].SavedMethod)
		line("step peak: %s", rep.Variants[0].PeakMethod)
		if beside != "" {
			line("%s peak: the same step planned on %s (%s)", beside, rep.Beside, rep.Variants[0].BesidePeakMethod)
		}
		ties := "on"
		if !rep.Ties {
			ties = "off (" + engine.TiesEnv + "=0)"
		}
		line("total = step peak + optimizer state; ordering ties (docs/memory-saving.md, \"Order is data\") %s", ties)
		if v := rep.Variants[0]; v.QuantizedParams > 0 {
			line("NF4 base: %d parameters in %s, %.3f bits per parameter (double-quantised scales)",
				v.QuantizedParams, memory.FormatBytes(v.QuantizedBytes), v.QuantizedBits)
		}
	}
	return nil
}

// besideName is the short name of a Beside backend for a column header ("go" for the pure-Go backend).
func besideName(backend string) string {
	switch {
	case backend == "":
		return ""
	case strings.HasPrefix(strings.ToLower(backend), "go"):
		return "go"
	}
	return backend
}

// Bounds of a memory budget (--budget, --seq-budget): below minBudget no training step fits (a number without a
// unit that meant one: --budget 0.5), above maxBudget the unit is surely wrong (--budget 1e30).
const (
	minBudget = 1 << 10 // 1 KiB
	maxBudget = 1 << 50 // 1 PiB
)

// parseBudget reads the memory budget given to flag: a size such as 24GiB, 80GB, 512MiB or a number of bytes
// (memory.ParseSize), rounded down to whole bytes (1.5e9, 0.3GiB), from 1 KiB to 1 PiB. 0, a negative size, a
// size under 1 KiB (--budget 0.5 is half a byte) and one over 1 PiB (--budget 1e30) are refused in one line.
func parseBudget(flag, s string) (int64, error) {
	v, err := memory.ParseSize(s)
	switch {
	case strings.TrimSpace(s) == "":
		return 0, fmt.Errorf("%s %q: give a size (examples: 24GiB, 80GB, 1.5e9)", flag, s)
	case err != nil:
		return 0, fmt.Errorf("%s %q is not a size (examples: 24GiB, 80GB, 1.5e9)", flag, s)
	case !(v > 0):
		return 0, fmt.Errorf("%s %s: a memory budget must be positive (examples: 24GiB, 80GB, 1.5e9)", flag, s)
	case v > maxBudget:
		return 0, fmt.Errorf("%s %s is %.3g bytes, more than memfit plans for (at most 1PiB): is the unit right?", flag, s, v)
	case v < minBudget:
		return 0, fmt.Errorf("%s %s is %g bytes, less than 1KiB, smaller than any training step: give a unit (e.g. %sMiB or %sGiB)", flag, s, v, strings.TrimSpace(s), strings.TrimSpace(s))
	}
	return int64(v), nil
}
