package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/memfit/memfit/bench"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/readfile"
)

func newBenchCommand(opts *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure memory and speed of the memory-saving options",
	}
	cfg := bench.ViTB(1, 2)
	var variants string
	blocks := &cobra.Command{
		Use:   "blocks",
		Short: "Saved activations, peak memory and step time of a ViT block stack in the four activation/norm modes",
		Long: `Builds a stack of ViT encoder layers (ViT-B shape by default: 197 tokens, hidden 768, MLP 3072, 12 heads),
every weight trainable, float32, standard attention, and trains it one step at a time on random data in each of
GELU+LN, ReGELU2+LN, GELU+MS-LN and ReGELU2+MS-LN. It prints the saved-activation bytes (exact, from the training
graph), the analytic count each variant must keep, the peak memory (measured by the buffer-pool counter in builds
that carry it, otherwise estimated by a liveness simulation; the output says which) and the step time, each with
its ratio to GELU+LN.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			chosen, err := pickVariants(variants)
			if err != nil {
				return err
			}
			backend, err := opts.NewBackend()
			if err != nil {
				return err
			}
			results, err := bench.Measure(backend, cfg, chosen, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			return bench.WriteTable(cmd.OutOrStdout(), cfg, results)
		},
	}
	f := blocks.Flags()
	f.IntVar(&cfg.Layers, "layers", cfg.Layers, "encoder layers")
	f.IntVar(&cfg.Batch, "batch-size", cfg.Batch, "examples per step")
	f.IntVar(&cfg.Tokens, "seq-len", cfg.Tokens, "tokens per example (197 = 224x224 images in 16x16 patches + CLS)")
	f.IntVar(&cfg.Hidden, "hidden", cfg.Hidden, "hidden size")
	f.IntVar(&cfg.MLP, "mlp", cfg.MLP, "MLP size")
	f.IntVar(&cfg.Heads, "heads", cfg.Heads, "attention heads")
	f.IntVar(&cfg.Steps, "steps", cfg.Steps, "timed steps per variant, after one warm-up step")
	f.StringVar(&variants, "variants", "", "comma-separated subset of "+variantNames()+" (default all; the first is the baseline for ratios)")
	alias(f, "batch-size", "batch")
	alias(f, "seq-len", "tokens")
	cmd.AddCommand(blocks, newBenchMemoryCommand(opts), newBenchGridCommand(opts), newBenchStepCommand(opts), newBenchCompareCommand(), newBenchCPUCommand(opts), newBenchAutopilotCommand(opts), newBenchGenerateCommand(opts), newBenchPackingCommand(opts),
		newBenchMemoryModesCommand(), newBenchXLADigestCommand(), newBenchGlueCommand(opts))
	return cmd
}

func newBenchMemoryCommand(opts *Options) *cobra.Command {
	var jsonOut string
	var overwrite bool
	var vitBatch, llamaBatch, llamaSeq int
	var llamaModels []string
	base := finetune.Defaults()
	base.ComputeDType, base.Attention = "bfloat16", "memory-efficient"
	cmd := &cobra.Command{
		Use:   "memory [--json FILE]",
		Short: "The paper's memory tables in one run: models x methods x variants, planned without running",
		Long: `Plans (builds and compiles, without running or reading weights) the training step of every model x method x
variant and prints saved activations (exact), the step peak (simulated on the pure-Go backend, compiled sizes on
XLA) and the total with the optimizer state, each with its ratio to the plain variant of the same model and method.
Models: vit-b16 (10 classes) and the LLaMA presets of --llama; methods: lora-qv, lora-all, lora-fa, full, qlora
(LoRA alpha = 2 --lora-r); variants: plain, approx-act, ms-norm, approx-act+ms-norm, grad-ckpt, mesa. --json
writes every cell.`,
		Example: `  finetune bench memory --json docs/benchmarks/memory-grid.json`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			base.LoRAAlpha = float64(2 * base.LoRARank)
			if err := base.Validate(); err != nil {
				return usageError{err}
			}
			var ins inputs
			for _, m := range llamaModels {
				ins = ins.add("--llama", m, modelReads...)
			}
			if err := outputFile("--json", jsonOut, ins, overwrite, true); err != nil {
				return err
			}
			backend, err := opts.NewBackend()
			if err != nil {
				return err
			}
			defer backend.Finalize()
			rank, dtype, attention := base.LoRARank, base.ComputeDType, base.Attention
			gm := []bench.GridModel{{Model: "vit-b16", Labels: 10, Shape: finetune.Shape{Batch: vitBatch}, Base: base}}
			for _, m := range llamaModels {
				gm = append(gm, bench.GridModel{Model: m, Shape: finetune.Shape{Batch: llamaBatch, Seq: llamaSeq}, Base: base})
			}
			stderr := cmd.ErrOrStderr()
			cells, err := bench.MemoryGrid(backend, gm, bench.GridMethods, finetune.Variants[:6], func(s string) { fmt.Fprintln(stderr, s) })
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "LoRA r=%d alpha=%d, %s compute, %s attention, backend %s\n\n", rank, 2*rank, dtype, attention, backend.Name())
			if err := bench.WriteGrid(cmd.OutOrStdout(), cells); err != nil {
				return err
			}
			if jsonOut != "" {
				return writeResult(jsonOut, map[string]any{"lora_r": rank, "compute_dtype": dtype, "attention": attention,
					"backend": backend.Name(), "cells": cells})
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&jsonOut, "json", "", "write every cell to this JSON file")
	f.BoolVar(&overwrite, "overwrite", false, "replace an existing --json file")
	f.IntVar(&vitBatch, "vit-batch-size", 64, "ViT examples per step")
	f.IntVar(&llamaBatch, "llama-batch-size", 4, "LLaMA sequences per step")
	f.IntVar(&llamaSeq, "llama-seq-len", 512, "LLaMA tokens per sequence")
	f.StringSliceVar(&llamaModels, "llama", []string{"llama-1b", "llama-7b"}, "LLaMA presets or folders")
	bindSettings(f, &base, false, "lora_r", "compute_dtype", "attention")
	alias(f, "vit-batch-size", "vit-batch")
	alias(f, "llama-batch-size", "llama-batch")
	alias(f, "llama-seq-len", "llama-seq")
	return cmd
}

func variantNames() string {
	names := make([]string, len(bench.Variants))
	for i, v := range bench.Variants {
		names[i] = v.Name
	}
	return strings.Join(names, ",")
}

func pickVariants(list string) ([]bench.Variant, error) {
	if list == "" {
		return bench.Variants, nil
	}
	var out []bench.Variant
	for _, name := range strings.Split(list, ",") {
		found := false
		for _, v := range bench.Variants {
			if strings.EqualFold(v.Name, strings.TrimSpace(name)) {
				out = append(out, v)
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown variant %q: choose from %s", name, variantNames())
		}
	}
	return out, nil
}

func newBenchGridCommand(opts *Options) *cobra.Command {
	var jsonOut, methodList, variantList, seqBudget, render string
	var steps int
	var overwrite bool
	cmd := &cobra.Command{
		Use:   "grid [--steps N] [--json FILE]",
		Short: "Timed training steps of every model x method x variant in one run (CPU-scaled models)",
		Long: `Trains, on random data, a ViT and a LLaMA scaled down for a CPU (the output states the shapes) with each method
(lora-qv, lora-all, lora-fa, full, qlora) in each variant (plain, approx-act, ms-norm, approx-act+ms-norm,
grad-ckpt, mesa): one warm-up step, then --steps timed optimizer steps with the variants of a method interleaved
round by round. Prints saved activations (exact), the step peak, the median step time and throughput with ratios
to plain, the step's matmul GFLOP/s beside the backend's own speed on the same products (the matmul-bound share)
and on a 1024^3 product, and for the LLaMA the longest sequence whose step fits --seq-budget. For the full-size
memory tables use "finetune bench memory".`,
		Example: `  finetune bench grid --steps 3 --json docs/benchmarks/grid-cpu.json`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := outputFile("--json", jsonOut, inputs{}.add("--render", render), overwrite, true); err != nil {
				return err
			}
			if render != "" {
				b, err := readfile.Read(render, readfile.Config)
				if err != nil {
					return usageError{err}
				}
				var run bench.GridRun
				if err := json.Unmarshal(b, &run); err != nil || len(run.Cells) == 0 {
					return usagef("%s is not a bench grid JSON file (%v)", render, err)
				}
				return bench.WriteGridRun(cmd.OutOrStdout(), run)
			}
			var methods []bench.GridMethod
			for _, name := range strings.Split(methodList, ",") {
				m, err := bench.GridMethodByName(strings.TrimSpace(name))
				if err != nil {
					return usageError{err}
				}
				methods = append(methods, m)
			}
			var variants []finetune.Variant
			for _, name := range strings.Split(variantList, ",") {
				v, err := finetune.VariantByName(strings.TrimSpace(name))
				if err != nil {
					return usageError{err}
				}
				variants = append(variants, v)
			}
			backend, err := opts.NewBackend()
			if err != nil {
				return err
			}
			defer backend.Finalize()
			dir, err := os.MkdirTemp("", "memfit-grid-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			tms, err := bench.ScaledModels(dir)
			if err != nil {
				return err
			}
			budget := int64(0)
			if seqBudget != "0" && seqBudget != "" {
				if budget, err = parseBudget("--seq-budget", seqBudget); err != nil {
					return usageError{err}
				}
			}
			for i := range tms {
				if tms[i].SeqBudget > 0 {
					tms[i].SeqBudget = budget
				}
			}
			mm, err := bench.MatmulGFLOPS(backend, 1024, 3)
			if err != nil {
				return err
			}
			cells, err := bench.TimeGrid(backend, tms, methods, variants, steps, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			if err := bench.WriteTimedGrid(cmd.OutOrStdout(), tms, cells, mm); err != nil {
				return err
			}
			if jsonOut != "" {
				desc := map[string]string{}
				for _, tm := range tms {
					desc[tm.Name] = tm.Describe
				}
				return writeResult(jsonOut, bench.GridRun{Models: desc, Backend: backend.Name(), Steps: steps,
					MatmulGFLOPS: mm, Cells: cells})
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&steps, "steps", 3, "timed steps per cell, after one warm-up step")
	f.StringVar(&jsonOut, "json", "", "write every cell to this JSON file")
	f.BoolVar(&overwrite, "overwrite", false, "replace an existing --json file")
	f.StringVar(&seqBudget, "seq-budget", "256MiB", "memory budget of the LLaMA's longest-sequence search (0: skip it)")
	f.StringVar(&render, "render", "", "print the table of an earlier run from its --json file instead of running")
	f.StringVar(&methodList, "methods", "lora-qv,lora-all,lora-fa,full,qlora", "methods")
	f.StringVar(&variantList, "variants", "plain,approx-act,ms-norm,approx-act+ms-norm,grad-ckpt,mesa", "variants, plain first")
	return cmd
}

func newBenchStepCommand(opts *Options) *cobra.Command {
	var model, methodName, variantName, jsonOut, workDir string
	var numLabels, batch, seqLen, steps int
	var overwrite bool
	base := finetune.Defaults()
	base.ComputeDType, base.Attention = "bfloat16", "memory-efficient"
	cmd := &cobra.Command{
		Use:   "step --model NAME --method M --variant V",
		Short: "Time one model x method x variant training step (one configuration per process, for GPU comparisons)",
		Long: `Trains one configuration on random data: a memfit preset with random weights (vit-b16, llama-1b, llama-7b,
vit:tiny, llama:tiny, ...; written to --work-dir first) or a Hugging Face folder. One warm-up step, then --steps
timed optimizer steps. Prints one JSON object: saved activations (exact), the step peak (simulated on the pure-Go
backend, compiled-program sizes on XLA), on XLA the device's peak bytes in use (PJRT memory stats, preallocation
off: the peak since the process started, hence one configuration per process), the median step time and the
throughput. LoRA alpha is 2 --lora-r. bench/pytorch/peft_compare.py prints the same fields for PyTorch + PEFT;
bench/gpu/compare.sh runs both.`,
		Example: `  finetune --backend xla:cuda bench step --model vit-b16 --method lora-qv --variant approx-act+ms-norm --batch-size 64
  finetune --backend xla:cuda bench step --model llama-7b --method qlora --variant plain --batch-size 4 --seq-len 512`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			method, err := bench.GridMethodByName(methodName)
			if err != nil {
				return usageError{err}
			}
			variant, err := finetune.VariantByName(variantName)
			if err != nil {
				return usageError{err}
			}
			if model == "" {
				return usagef("--model is required")
			}
			base.LoRAAlpha = float64(2 * base.LoRARank)
			if err := base.Validate(); err != nil {
				return usageError{err}
			}
			ins := inputs{}.add("--model", model, modelReads...)
			if workDir != "" {
				ins = ins.add("--work-dir", workDir, "*/config.json", "*/*.safetensors")
			}
			if err := outputFile("--json", jsonOut, ins, overwrite, true); err != nil {
				return err
			}
			backend, err := opts.NewBackend()
			if err != nil {
				return err
			}
			defer backend.Finalize()
			if workDir == "" {
				if workDir, err = os.MkdirTemp("", "memfit-step-"); err != nil {
					return err
				}
				defer os.RemoveAll(workDir)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "preparing %s ...\n", model)
			dir, err := bench.PresetCheckpoint(model, numLabels, workDir)
			if err != nil {
				return usageError{err}
			}
			r, err := bench.RunStep(backend, dir, finetune.Shape{Batch: batch, Seq: seqLen}, base, method, variant, steps, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			r.Model = model
			if err := writeJSON(cmd.OutOrStdout(), r); err != nil {
				return err
			}
			if jsonOut != "" {
				return writeResult(jsonOut, r)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&model, "model", "", "preset (vit-b16, llama-1b, llama-7b, vit:tiny, llama:tiny, ...) or Hugging Face folder")
	f.StringVar(&methodName, "method", "lora-all", "lora-qv, lora-all, lora-fa, full or qlora")
	f.StringVar(&variantName, "variant", "plain", "plain, approx-act, ms-norm, approx-act+ms-norm, grad-ckpt, mesa, ...")
	f.IntVar(&numLabels, "num-labels", 10, "classes of a ViT preset's head")
	f.IntVar(&batch, "batch-size", 8, "examples per step")
	f.IntVar(&seqLen, "seq-len", 512, "tokens per sequence (LLaMA)")
	f.IntVar(&steps, "steps", 10, "timed steps after one warm-up step")
	bindSettings(f, &base, false, "compute_dtype", "attention", "lora_r", "block_plan")
	f.StringVar(&jsonOut, "json", "", "also write the result to this file")
	f.BoolVar(&overwrite, "overwrite", false, "replace an existing --json file")
	f.StringVar(&workDir, "work-dir", "", "where a preset's random checkpoint is written, or reused when already there (default: a temporary folder, removed after)")
	alias(f, "num-labels", "labels")
	alias(f, "batch-size", "batch")
	alias(f, "seq-len", "seq")
	return cmd
}

func newBenchCompareCommand() *cobra.Command {
	var jsonOut string
	var overwrite bool
	cmd := &cobra.Command{
		Use:   "compare DIR",
		Short: "Side-by-side table of memfit and PyTorch + PEFT results (bench/gpu/compare.sh writes DIR)",
		Long: `Reads DIR's memfit-*.json (from "finetune bench step") and pytorch-*.json (from bench/pytorch/peft_compare.py),
pairs them by model, method and variant, and prints both peaks (memfit's device peak on XLA when measured, else
its step peak; PyTorch's torch.cuda.max_memory_allocated), both throughputs, the ratios to each side's plain
variant and memfit's ratios to PyTorch, with issue 10's goals for every approx-act+ms-norm row.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := outputFile("--json", jsonOut, inputs{}.add("DIR", args[0], "memfit-*.json", "pytorch-*.json"), overwrite, true); err != nil {
				return err
			}
			rows, err := bench.ReadComparison(args[0])
			if err != nil {
				return usageError{err}
			}
			if err := bench.WriteComparison(cmd.OutOrStdout(), rows); err != nil {
				return err
			}
			if jsonOut != "" {
				return writeResult(jsonOut, rows)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&jsonOut, "json", "", "also write the paired rows to this JSON file")
	cmd.Flags().BoolVar(&overwrite, "overwrite", false, "replace an existing --json file")
	return cmd
}

func newBenchCPUCommand(opts *Options) *cobra.Command {
	settings := bench.DefaultCPUSettings()
	var out, workDir, python, script, llamaTiny, robertaTiny, memfitBin, invocation string
	var caseList, variantList, qloraCases []string
	var rounds int
	var interleave, overwrite bool
	var lossTol float64
	var profile bool
	cmd := &cobra.Command{
		Use:   "cpu [--steps N] [--warmup W] [--out DIR]",
		Short: "memfit beside a plain-PyTorch reference on the CPU: same checkpoints, same batch, one process per run",
		Long: `Runs, one after the other on this machine, memfit (in each --variants) and a plain-PyTorch reference
(bench/pytorch/cpu_compare.py: ordinary torch modules, LoRA as a frozen Linear plus A and B, AdamW, float32,
torch.set_num_threads = cores) on the same checkpoints, shapes and batch:
  (a) a ViT-Ti-shaped encoder (hidden 192, 3 heads, MLP 768, patch 16 at 224, 4 layers), full fine-tuning, batch 16
  (b) pretrained/llama-tiny, LoRA r=8 on every linear layer, batch 8 x 256
  (c) the CPU grid's LLaMA (hidden 256, 4 layers, vocabulary 1024), LoRA on every linear layer, batch 4 x 256
  (d) pretrained/roberta-tiny (RobertaForMaskedLM, hidden 128, 4 post-LN layers), full fine-tuning, masked LM,
      batch 32 x 128
Each run is its own process: the driver reads its maximum resident set size from wait4's rusage. Both sides
print every step's loss; the first-step losses must agree to --loss-tol (relative) or the command fails, since
then the two sides do not train the same model. Prints the table (machine, versions, median step time after the
warm-up, throughput, ratios, memory, the issue's goals) and writes DIR/cpu-compare.txt, DIR/cpu-compare.json and
each process's JSON and log under DIR/processes. bench/cpu/compare.sh checks the Debian packages, builds memfit
with GOEXPERIMENT=simd and runs this with GODEBUG=cpu.fma=off.`,
		Example: `  bash bench/cpu/compare.sh
  GOTOOLCHAIN=go1.27.3 GOEXPERIMENT=simd go build -o bin/finetune ./cmd/finetune && GODEBUG=cpu.fma=off bin/finetune bench cpu --steps 3 --cases b`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := settings.Validate(); err != nil {
				return usageError{err}
			}
			for _, v := range variantList {
				if _, err := finetune.VariantByName(v); err != nil {
					return usageError{err}
				}
			}
			if len(variantList) == 0 || variantList[0] != "plain" {
				return usagef("--variants must start with plain (the baseline of the ratios)")
			}
			if rounds < 1 {
				return usagef("--rounds must be at least 1, got %d", rounds)
			}
			for _, k := range caseList {
				if k = strings.TrimSpace(k); bench.CPUCaseNames[k] == "" && !slices.Contains(slices.Collect(maps.Values(bench.CPUCaseNames)), k) {
					return usagef("unknown case %q: use a, b, c or d", k)
				}
			}
			reads := inputs{}.add("--script", script).add("--llama-tiny", llamaTiny, modelReads...).add("--roberta-tiny", robertaTiny, modelReads...).add("--memfit-bin", memfitBin)
			if err := outputFolder("--out", out, []string{"cpu-compare.txt", "cpu-compare.json", "processes/"}, reads.add("--work-dir", workDir), overwrite, true); err != nil {
				return err
			}
			if workDir != "" { // the scratch folder: its files are rewritten by every run, but never over an input
				scratch := []string{"vit/", "llama/", "spec-*.json", "batch-*.safetensors", "init-*.safetensors"}
				if err := outputFolder("--work-dir", workDir, scratch, reads, true, false); err != nil {
					return err
				}
			}
			if memfitBin == "" {
				exe, err := os.Executable()
				if err != nil {
					return err
				}
				memfitBin = exe
			}
			if workDir == "" {
				d, err := os.MkdirTemp("", "memfit-cpu-bench-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(d)
				workDir = d
			}
			all, err := bench.CPUCases(workDir, llamaTiny)
			if err != nil {
				return usageError{err}
			}
			if slices.ContainsFunc(caseList, func(k string) bool { k = strings.TrimSpace(k); return k == "d" || k == bench.CPUCaseNames["d"] }) {
				d, err := bench.RobertaCPUCase(robertaTiny)
				if err != nil {
					return usageError{err}
				}
				all = append(all, d)
			}
			var cases []bench.CPUCase
			for _, k := range caseList {
				for _, c := range all {
					if c.Key == strings.TrimSpace(k) || c.Name == strings.TrimSpace(k) {
						cases = append(cases, c)
					}
				}
			}
			memfitArgs := []string{memfitBin}
			if opts.Backend != "" {
				memfitArgs = append(memfitArgs, "--backend", opts.Backend)
			}
			interleaveArgs := append(slices.Clone(memfitArgs), "bench", "cpu", "interleave")
			memfitArgs = append(memfitArgs, "bench", "cpu", "step")
			env := os.Environ()
			if engine.FMAWorkaround() {
				env = engine.WithFMAWorkaround(env)
			}
			stderr := cmd.ErrOrStderr()
			if invocation == "" {
				invocation = "finetune " + strings.Join(os.Args[1:], " ")
			}
			o := bench.CPUCompareOptions{Cases: cases, Variants: variantList, Settings: settings,
				LossTol: lossTol, WorkDir: workDir, OutDir: out, Memfit: memfitArgs, Python: []string{python, script},
				MemfitEnv: env, Profile: profile, QLoRACases: qloraCases, Rounds: rounds, Log: stderr}
			if interleave {
				o.MemfitInterleave = interleaveArgs
			}
			run, err := bench.RunCPUCompare(o)
			if err != nil {
				return err
			}
			run.Command = invocation
			return writeBenchRun(cmd, filepath.Join(out, "cpu-compare"), run, run.Problems, func(w io.Writer) error { return bench.WriteCPURun(w, run) })
		},
	}
	f := cmd.Flags()
	f.IntVar(&settings.Warmup, "warmup", settings.Warmup, "warm-up steps per process, excluded from the timing (the first compiles memfit's step)")
	f.IntVar(&settings.Steps, "steps", settings.Steps, "timed steps per process (the median is reported)")
	f.StringVar(&settings.Attention, "attention", settings.Attention, "memfit's attention: standard (as the reference) or memory-efficient")
	f.IntVar(&settings.LoRARank, "lora-r", settings.LoRARank, "LoRA rank")
	f.Float64Var(&settings.LoRAAlpha, "lora-alpha", settings.LoRAAlpha, "LoRA alpha (scale alpha/r)")
	f.Float64Var(&settings.LR, "lr", settings.LR, "AdamW learning rate")
	f.Uint64Var(&settings.Seed, "seed", settings.Seed, "seed of the batch and of memfit's adapter initialisation")
	f.StringSliceVar(&caseList, "cases", []string{"a", "b", "c", "d"}, "cases to run (a, b, c, d)")
	f.BoolVar(&interleave, "interleave", true, "also train each case's memfit variants in one process, a step of each in turn, and judge their step ratio by that run")
	f.IntVar(&rounds, "rounds", 1, "run every process this many times, the rows taking turns, and report the median of each row's rounds (steadier on a shared machine)")
	f.StringSliceVar(&qloraCases, "qlora-cases", []string{"c"}, "LoRA cases that also get memfit's QLoRA rows (NF4 base weights, no reference), compared with memfit's LoRA step")
	f.StringSliceVar(&variantList, "variants", []string{"plain", "approx-act+ms-norm"}, "memfit variants, plain first")
	f.Float64Var(&lossTol, "loss-tol", 1e-4, "largest relative difference of the two sides' first-step losses")
	f.StringVar(&out, "out", "bench-cpu-out", "folder for cpu-compare.txt, cpu-compare.json and processes/")
	f.BoolVar(&overwrite, "overwrite", false, "replace the results of an earlier run in --out")
	f.StringVar(&workDir, "work-dir", "", "folder for the checkpoints, batches and specs (default: a temporary one, removed after)")
	f.StringVar(&python, "python", "/usr/bin/python3", "Python with torch (Debian's python3-torch)")
	f.StringVar(&script, "script", "bench/pytorch/cpu_compare.py", "the reference script")
	f.StringVar(&llamaTiny, "llama-tiny", "pretrained/llama-tiny", "memfit's pretrained/llama-tiny folder (case b)")
	f.StringVar(&robertaTiny, "roberta-tiny", "pretrained/roberta-tiny", "memfit's pretrained/roberta-tiny folder (case d)")
	f.StringVar(&memfitBin, "memfit-bin", "", "memfit binary for the memfit processes (default: this one)")
	f.BoolVar(&profile, "cpuprofile", false, "each memfit process writes a CPU profile of its timed steps to DIR/processes/*.pprof")
	f.StringVar(&invocation, "invocation", "", "the command line to print (bench/cpu/compare.sh passes its own)")
	_ = f.MarkHidden("invocation")
	cmd.AddCommand(newBenchCPUStepCommand(opts), newBenchCPUInterleaveCommand(opts))
	return cmd
}

func newBenchCPUInterleaveCommand(opts *Options) *cobra.Command {
	var specFile, jsonOut string
	var variants []string
	cmd := &cobra.Command{
		Use:   "interleave --spec FILE --variants plain,V --json OUT",
		Short: "memfit's variants of one \"bench cpu\" case trained in one process, a step of each in turn",
		Long: `Reads a spec written by "finetune bench cpu" and trains its case in every variant in this one process, one step
of each variant in turn on the same batch, for the spec's warm-up and timed steps, and writes each variant's step
times, median and the median over the turns of its step over the first variant's. The ratio then sees the same
machine at the same moments, which separate processes on a shared host do not.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			spec, err := bench.ReadCPUSpec(specFile)
			if err != nil {
				return usageError{err}
			}
			if jsonOut == "" {
				return usagef("--json is required")
			}
			// Driven by bench cpu, which names the file in its own folder: an earlier result is replaced.
			if err := outputFile("--json", jsonOut, inputs{}.add("--spec", specFile).add("the spec's batch", spec.BatchFile), true, false); err != nil {
				return err
			}
			backend, err := opts.NewBackend()
			if err != nil {
				return err
			}
			defer backend.Finalize()
			r, err := bench.RunCPUInterleaved(backend, spec, variants)
			if err != nil {
				return err
			}
			return writeResult(jsonOut, r)
		},
	}
	f := cmd.Flags()
	f.StringVar(&specFile, "spec", "", "spec file written by finetune bench cpu")
	f.StringSliceVar(&variants, "variants", []string{"plain", "approx-act+ms-norm"}, "memfit variants, the baseline first")
	f.StringVar(&jsonOut, "json", "", "write the result here")
	return cmd
}

func newBenchCPUStepCommand(opts *Options) *cobra.Command {
	var specFile, variant, jsonOut, profile string
	var writeInit bool
	cmd := &cobra.Command{
		Use:   "step --spec FILE --variant V --json OUT",
		Short: "One memfit process of \"bench cpu\": trains one case in one variant and writes its result",
		Long: `Reads a spec written by "finetune bench cpu" (case, settings, batch file), trains the case in the variant for the
spec's warm-up and timed steps on that batch, and writes every step's loss, the timed steps, the median, memfit's
saved-activation bytes (exact) and step peak, and the process's VmHWM before the first step. With --write-init the
initial adapter tensors go to the spec's init file, for the reference to start from.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			spec, err := bench.ReadCPUSpec(specFile)
			if err != nil {
				return usageError{err}
			}
			if jsonOut == "" {
				return usagef("--json is required")
			}
			// Driven by bench cpu, which names the files in its own folder: earlier results are replaced.
			ins := inputs{}.add("--spec", specFile).add("the spec's batch", spec.BatchFile)
			if err := outputFile("--json", jsonOut, ins, true, false); err != nil {
				return err
			}
			if err := outputFile("--cpuprofile", profile, ins, true, false); err != nil {
				return err
			}
			if writeInit {
				if err := outputFile("the spec's init file", spec.InitFile, ins, true, false); err != nil {
					return err
				}
			}
			backend, err := opts.NewBackend()
			if err != nil {
				return err
			}
			defer backend.Finalize()
			o := bench.CPUStepOptions{Case: spec.Case, Settings: spec.Settings, Variant: variant, BatchFile: spec.BatchFile}
			if writeInit {
				o.InitFile = spec.InitFile
			}
			var prof *os.File
			if profile != "" {
				// Written to a temporary file beside it and renamed into place when complete.
				if prof, err = os.CreateTemp(filepath.Dir(profile), "."+filepath.Base(profile)+".tmp-"); err != nil {
					return err
				}
				defer os.Remove(prof.Name())
				defer prof.Close()
				o.Profile = prof
			}
			r, err := bench.RunCPUStep(backend, o)
			if err != nil {
				return err
			}
			if prof != nil {
				if err := prof.Chmod(0o644); err != nil {
					return err
				}
				if err := prof.Close(); err != nil {
					return err
				}
				if err := os.Rename(prof.Name(), profile); err != nil {
					return err
				}
			}
			return writeResult(jsonOut, r)
		},
	}
	f := cmd.Flags()
	f.StringVar(&specFile, "spec", "", "spec file written by finetune bench cpu")
	f.StringVar(&variant, "variant", "plain", "plain, approx-act, ms-norm, approx-act+ms-norm, ...")
	f.StringVar(&jsonOut, "json", "", "write the result here")
	f.BoolVar(&writeInit, "write-init", false, "write the initial adapter tensors to the spec's init file")
	f.StringVar(&profile, "cpuprofile", "", "write a CPU profile (pprof) of the timed steps to this file")
	return cmd
}

// writeBenchRun prints a benchmark run's table (write), saves it as base.txt and the run as base.json, and fails
// when the run found problems (after both are written).
func writeBenchRun(cmd *cobra.Command, base string, run any, problems []string, write func(io.Writer) error) error {
	var table bytes.Buffer
	if err := write(&table); err != nil {
		return err
	}
	cmd.OutOrStdout().Write(table.Bytes())
	if err := writeFileAtomic(base+".txt", table.Bytes()); err != nil {
		return err
	}
	if err := writeResult(base+".json", run); err != nil {
		return err
	}
	if len(problems) > 0 {
		return fmt.Errorf("%d problem(s), the first: %s", len(problems), problems[0])
	}
	return nil
}
