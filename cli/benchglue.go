package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/memfit/memfit/bench"
)

// newBenchGlueCommand is "bench glue": the Approx-BP paper's GLUE table (Table 4) on an encoder.
func newBenchGlueCommand(opts *Options) *cobra.Command {
	o := bench.DefaultGLUEOptions()
	var out, tasks, variants, targets string
	var overwrite bool
	cmd := &cobra.Command{
		Use:   "glue --model DIR --data GLUE_ROOT [--out DIR]",
		Short: "The paper's GLUE table: four variants (GELU/ReGELU2 x LN/MS-LN) trained and scored on five tasks",
		Long: `Reproduces the Approx-BP paper's GLUE table (Table 4) on a pretrained encoder (BERT, RoBERTa): for each task
(CoLA, SST-2, MRPC, STS-B, RTE) a classifier head is made from --model (the same for every variant), trained with
the paper's recipe (AdamW, weight decay 0.01, linear schedule with 10% warm-up, batch 32, LoRA r=64 alpha 16 on
query and key, the head trained beside them as PEFT's modules_to_save, float32) in each variant (GELU / LN,
ReGELU2 / LN, GELU / MS-LN, ReGELU2 / MS-LN), and scored on the dev set (CoLA Matthews correlation, STS-B
Pearson correlation, accuracy otherwise). Prints the table in the paper's layout with the mean score, the step's
saved activations (exact) and peak (the backend's method named) and the training throughput, and writes
glue.md and glue.json into --out. --epochs and --max-steps size the training to the machine (the paper: 30
epochs); the machine's load average is printed before and after.`,
		Example: `  finetune bench glue --model pretrained/roberta-tiny --data ../shared/data/glue --lr 3e-3 --out docs/benchmarks/glue-cpu
  finetune-xla --backend xla:cuda bench glue --model ROBERTA_BASE_DIR --data ../shared/data/glue --epochs 30 --max-steps 0 --out glue-gpu`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.Model == "" || o.Data == "" {
				return usagef("--model and --data are required")
			}
			o.Tasks, o.Targets = splitFlag(tasks), splitFlag(targets)
			o.Variants = nil
			for _, name := range splitFlag(variants) {
				found := false
				for _, v := range bench.GLUEVariants {
					if strings.EqualFold(strings.ReplaceAll(v.Name, " ", ""), strings.ReplaceAll(name, " ", "")) {
						o.Variants, found = append(o.Variants, v), true
					}
				}
				if !found {
					return usagef("--variants: unknown variant %q (have GELU/LN, ReGELU2/LN, GELU/MS-LN, ReGELU2/MS-LN)", name)
				}
			}
			if o.Epochs <= 0 || o.MaxSteps < 0 || o.BatchSize < 1 || o.SeqLen < 3 || o.EvalBatch < 1 {
				return usagef("--epochs must be positive, --max-steps at least 0, --batch-size and --eval-batch-size at least 1, --seq-len at least 3")
			}
			if out != "" {
				if err := outputFolder("--out", out, []string{"glue.md", "glue.json"}, inputs{}.add("--model", o.Model).add("--data", o.Data), overwrite, true); err != nil {
					return err
				}
			}
			backend, err := opts.NewBackend()
			if err != nil {
				return err
			}
			defer backend.Finalize()
			work, err := os.MkdirTemp("", "memfit-bench-glue-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(work)
			o.Backend, o.Work, o.Log = backend, work, cmd.ErrOrStderr()
			bars := map[string]func(done, total int){}
			o.Progress = func(task string, done, total int) {
				if bars[task] == nil {
					bars[task] = countProgress(cmd.ErrOrStderr(), fmt.Sprintf("%s: training %d variants side by side", task, len(o.Variants)))
				}
				bars[task](done, total)
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "bench glue: %s on %s, tasks %s, %g epochs (at most %d steps) of %d x %d tokens, lr %g, LoRA r=%d alpha %g on %s, backend %s\n",
				o.Model, o.Data, strings.Join(o.Tasks, ","), o.Epochs, o.MaxSteps, o.BatchSize, o.SeqLen, o.LR, o.LoRARank, o.LoRAAlpha, strings.Join(o.Targets, ","), backend.Name())
			before := loadAverage()
			fmt.Fprintf(w, "load average before: %s\n", before)
			rep, err := bench.RunGLUE(cmd.Context(), o)
			if err != nil {
				return err
			}
			after := loadAverage()
			fmt.Fprintf(w, "load average after:  %s (%.0f s)\n\n", after, rep.Seconds)
			var table strings.Builder
			if err := bench.WriteGLUETable(&table, rep); err != nil {
				return err
			}
			fmt.Fprint(w, table.String())
			if out == "" {
				return nil
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			md := fmt.Sprintf("# GLUE, the paper's Table 4 layout\n\n`finetune %s`\n\nload average before %s, after %s; %.0f s\n\n%s",
				strings.Join(os.Args[1:], " "), before, after, rep.Seconds, table.String())
			j, err := json.MarshalIndent(rep, "", "  ")
			if err != nil {
				return err
			}
			for name, b := range map[string][]byte{"glue.md": []byte(md), "glue.json": append(j, '\n')} {
				if err := writeFileAtomic(filepath.Join(out, name), b); err != nil {
					return err
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Model, "model", "", "pretrained encoder folder (masked LM or bare encoder) with its tokenizer")
	f.StringVar(&o.Data, "data", "", "GLUE root (../shared/data/glue layout)")
	f.StringVar(&tasks, "tasks", strings.Join(bench.GLUETasks, ","), "comma-separated tasks")
	f.StringVar(&variants, "variants", "GELU/LN,ReGELU2/LN,GELU/MS-LN,ReGELU2/MS-LN", "comma-separated variants (the first is the baseline for ratios)")
	f.Float64Var(&o.Epochs, "epochs", o.Epochs, "epochs over each task's training set")
	f.IntVar(&o.MaxSteps, "max-steps", o.MaxSteps, "most optimizer steps per task (0: no cap)")
	f.IntVar(&o.BatchSize, "batch-size", o.BatchSize, "sequences per step")
	f.IntVar(&o.SeqLen, "seq-len", o.SeqLen, "tokens per sequence (truncation=True, padded to it)")
	f.Float64Var(&o.LR, "lr", o.LR, "peak learning rate")
	f.IntVar(&o.LoRARank, "lora-r", o.LoRARank, "LoRA rank")
	f.Float64Var(&o.LoRAAlpha, "lora-alpha", o.LoRAAlpha, "LoRA alpha")
	f.StringVar(&targets, "lora-targets", strings.Join(o.Targets, ","), "LoRA targets")
	f.Uint64Var(&o.Seed, "seed", o.Seed, "seed of the heads, the adapters and the data order")
	f.IntVar(&o.EvalBatch, "eval-batch-size", o.EvalBatch, "sequences per dev-set prediction batch")
	f.StringVar(&out, "out", "", "folder for glue.md and glue.json")
	f.BoolVar(&overwrite, "overwrite", false, "replace glue.md and glue.json in --out")
	return cmd
}

// splitFlag splits a comma-separated flag, dropping empty entries.
func splitFlag(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
