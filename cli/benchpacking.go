package cli

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gomlx/gomlx/core/tensors"
	"github.com/spf13/cobra"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/readfile"
)

// newBenchPackingCommand is "bench packing": real tokens/s of training with and without --packing.
func newBenchPackingCommand(opts *Options) *cobra.Command {
	var model, data, method string
	var seqLen, batch, steps, rounds int
	cmd := &cobra.Command{
		Use:   "packing --model DIR --data FILE",
		Short: "Real (non-padding) tokens/s of LLaMA training on instruction or conversation data, with and without --packing",
		Long: `Trains --model on --data (Alpaca or messages JSONL) as train does, once with each example padded to its own
--seq-len sequence and once packed (--packing), and prints for each: sequences and real tokens per batch, the
padding share, the median real tokens/s and examples/s over --steps timed steps (after one warm-up step that
compiles), and the time one epoch of the data takes at that speed. The two trainers run side by side, a step of
each in turn, so both see the same machine load, for --rounds rounds; the machine's load average is printed
before and after.`,
		Example: `  finetune bench packing --model pretrained/llama-tiny --data ../shared/data/alpaca-libre/alpaca_libre_tasks_v1.jsonl \
    --seq-len 512 --batch-size 8 --steps 8 --rounds 2`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if model == "" || data == "" {
				return usagef("--model and --data are required")
			}
			if steps < 1 || rounds < 1 || batch < 1 {
				return usagef("--steps, --rounds and --batch-size must be at least 1")
			}
			var err error
			if model, _, err = hubModel(cmd, "--model", model, hubFiles); err != nil {
				return err
			}
			if data, _, err = hubData(cmd, "--data", data, finetune.DataOptions{}); err != nil {
				return err
			}
			backend, err := opts.NewBackend()
			if err != nil {
				return err
			}
			defer backend.Finalize()
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "bench packing: %s on %s, --seq-len %d --batch-size %d --method %s, %d timed steps x %d rounds, backend %s\n",
				model, data, seqLen, batch, method, steps, rounds, backend.Name())
			fmt.Fprintf(w, "load average before: %s\n", loadAverage())
			type result struct {
				name               string
				rows, docs, tokens int // in the data
				rowsPer, tokPer    float64
				tokRates, exRates  []float64
			}
			results := []*result{{name: "unpacked"}, {name: "packed"}}
			type side struct {
				tr           *finetune.Trainer
				it           finetune.Iterator
				tok, ex, sec float64
			}
			for round := 0; round < rounds; round++ {
				// Both trainers side by side, a step of each in turn, so that both see the same machine load.
				sides := make([]*side, len(results))
				release := func() {
					for _, sd := range sides {
						if sd != nil {
							sd.tr.Release()
						}
					}
				}
				for i, r := range results {
					cfg := finetune.Defaults()
					cfg.Method, cfg.BatchSize, cfg.Steps, cfg.LogEvery = method, batch, steps+1, 1
					if method == finetune.MethodFull {
						cfg.LoRARank, cfg.LoRATarget = 0, nil
					}
					m, err := finetune.LoadModel(model, cfg)
					if err != nil {
						release()
						return err
					}
					it, err := finetune.OpenData(data, finetune.DataOptions{SeqLen: seqLen, Packing: i == 1}, m, model, batch, cfg.Seed)
					if err != nil {
						release()
						return err
					}
					if l, ok := it.(*finetune.Loader); ok && round == 0 {
						r.rows = l.Data["input_ids"].Shape().Dim(0)
						r.tokens, r.docs = countTokens(l.Data)
					}
					tr, err := finetune.New(m, cfg, backend)
					if err != nil {
						release()
						return err
					}
					sides[i] = &side{tr: tr, it: it}
				}
				for s := 0; s <= steps; s++ {
					for i, sd := range sides {
						b, err := sd.it.Next()
						if err != nil {
							release()
							return err
						}
						start := time.Now()
						st, err := sd.tr.TrainStep([]finetune.Batch{b})
						if err != nil {
							release()
							return err
						}
						if s == 0 {
							continue // warm-up: compiles the step
						}
						_, docs := countTokens(b)
						sd.tok, sd.ex, sd.sec = sd.tok+float64(st.Tokens), sd.ex+float64(docs), sd.sec+time.Since(start).Seconds()
						results[i].tokPer += float64(st.Tokens) / float64(steps*rounds)
					}
				}
				release()
				for i, sd := range sides {
					results[i].tokRates = append(results[i].tokRates, sd.tok/sd.sec)
					results[i].exRates = append(results[i].exRates, sd.ex/sd.sec)
				}
			}
			fmt.Fprintf(w, "load average after:  %s\n\n", loadAverage())
			fmt.Fprintf(w, "%-9s %9s %9s %9s %14s %12s %11s %10s\n", "", "examples", "sequences", "padding", "real tok/batch", "real tok/s", "examples/s", "epoch")
			for _, r := range results {
				tokS, exS := median(r.tokRates), median(r.exRates)
				fmt.Fprintf(w, "%-9s %9d %9d %8.0f%% %14.0f %12.0f %11.1f %9.0fs\n", r.name, r.docs, r.rows,
					100*(1-float64(r.tokens)/float64(r.rows*seqLen)), r.tokPer, tokS, exS, float64(r.tokens)/tokS)
			}
			u, p := median(results[0].tokRates), median(results[1].tokRates)
			fmt.Fprintf(w, "\npacked / unpacked real tokens/s: %.2fx (per-round real tok/s: unpacked %s, packed %s)\n", p/u,
				rates(results[0].tokRates), rates(results[1].tokRates))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&model, "model", "", "LLaMA causal-LM folder with its tokenizer")
	f.StringVar(&data, "data", "", "Alpaca or messages JSONL")
	f.StringVar(&method, "method", finetune.MethodLoRA, "training method (lora, full, ...)")
	f.IntVar(&seqLen, "seq-len", 512, "tokens per sequence")
	f.IntVar(&batch, "batch-size", 8, "sequences per batch")
	f.IntVar(&steps, "steps", 8, "timed steps per round and mode")
	f.IntVar(&rounds, "rounds", 2, "rounds, each running unpacked then packed")
	return cmd
}

// countTokens returns the real tokens (attention_mask 1) and the examples of a batch or data set: one per row,
// or with position_ids one per real token at position 0.
func countTokens(b map[string]*tensors.Tensor) (tokens, examples int) {
	mask := b["attention_mask"].Value().([][]int32)
	var pos [][]int32
	if p, ok := b["position_ids"]; ok {
		pos = p.Value().([][]int32)
	}
	for i, row := range mask {
		if pos == nil {
			examples++
		}
		for j, v := range row {
			if v != 0 {
				tokens++
				if pos != nil && pos[i][j] == 0 {
					examples++
				}
			}
		}
	}
	return tokens, examples
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func rates(v []float64) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprintf("%.0f", x)
	}
	return strings.Join(parts, ", ")
}

// loadAverage is /proc/loadavg's first three fields ("unknown" where there is none).
func loadAverage() string {
	b, err := readfile.Read("/proc/loadavg", readfile.Small)
	if err != nil {
		return "unknown"
	}
	fields := strings.Fields(string(b))
	if len(fields) < 3 {
		return "unknown"
	}
	return strings.Join(fields[:3], " ")
}
