package cli

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/memfit/memfit/safetensors"
	"github.com/memfit/memfit/tokenizer/bpetrain"
)

func newPretrainCommand(opts *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pretrain",
		Short: "Make the small pretrained checkpoints memfit ships (tokenizer, ViT, LLaMA) from real data",
		Long: `No real ViT or LLaMA checkpoint is reachable from memfit's build machines, so memfit makes small ones itself and
ships them (pretrained/): a byte-level BPE tokenizer trained on English text, a small ViT trained on
Fashion-MNIST and a small LLaMA trained on English text. pretrained/README.md records the exact commands.`,
	}
	cmd.AddCommand(newPretrainTokenizerCommand())
	return cmd
}

func newPretrainTokenizerCommand() *cobra.Command {
	var texts []string
	var out string
	var vocab, maxLen int
	cmd := &cobra.Command{
		Use:   "tokenizer --text FILE [--text FILE...] --vocab N --out DIR",
		Short: "Train a byte-level BPE tokenizer (Llama-3 pre-tokenizer) and write tokenizer.json",
		Long: `Trains a byte-level BPE tokenizer on the given files (.txt: the whole file; .jsonl: each row's string fields,
e.g. Alpaca instruction/input/output, rows whose "status" is present and not "ok" are skipped) and writes
tokenizer.json and tokenizer_config.json (special tokens <|begin_of_text|> as BOS, <|end_of_text|> as EOS and
<|pad|>) into --out. Training is deterministic.`,
		Example: `  finetune pretrain tokenizer --text ../shared/data/text/war-and-peace.txt \
    --text ../shared/data/alpaca-libre/alpaca_libre_tasks_v1.jsonl --vocab 4096 --out pretrained/llama-tiny`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(texts) == 0 || out == "" {
				return usagef("--text and --out are required")
			}
			var corpus []string
			for _, path := range texts {
				docs, err := readTextDocs(path)
				if err != nil {
					return err
				}
				corpus = append(corpus, docs...)
			}
			m, err := bpetrain.Train(corpus, bpetrain.Options{VocabSize: vocab,
				Special: []string{"<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"}})
			if err != nil {
				return usageError{err}
			}
			tj, err := m.TokenizerJSON()
			if err != nil {
				return err
			}
			tc, err := m.TokenizerConfigJSON(maxLen)
			if err != nil {
				return err
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			for name, data := range map[string][]byte{"tokenizer.json": tj, "tokenizer_config.json": tc} {
				if err := writeFileAtomic(filepath.Join(out, name), append(data, '\n')); err != nil {
					return err
				}
			}
			fmt.Fprintf(cmd.OutOrStdout(), "trained %d tokens (%d merges, %d special) on %d documents into %s\n",
				len(m.Vocab), len(m.Merges), len(m.Special), len(corpus), out)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&texts, "text", nil, "training text: .txt or .jsonl (repeatable)")
	f.StringVar(&out, "out", "", "output folder")
	f.IntVar(&vocab, "vocab", 4096, "vocabulary size, special tokens included")
	f.IntVar(&maxLen, "max-length", 512, "model_max_length written to tokenizer_config.json")
	return cmd
}

// readTextDocs reads a .txt file as one document, or a .jsonl file as one document per row (its string fields
// joined by newlines, in key order; rows with a "status" other than "ok" skipped).
func readTextDocs(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if !strings.HasSuffix(path, ".jsonl") {
		return []string{string(data)}, nil
	}
	var docs []string
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for line := 1; sc.Scan(); line++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var row map[string]any
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil {
			return nil, fmt.Errorf("%s:%d: not a JSON object: %v", path, line, err)
		}
		if s, ok := row["status"]; ok && s != "ok" {
			continue
		}
		var fields []string
		for _, k := range []string{"instruction", "input", "output", "text"} {
			if s, ok := row[k].(string); ok && s != "" {
				fields = append(fields, s)
			}
		}
		if len(fields) == 0 {
			keys := make([]string, 0, len(row))
			for k := range row {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			for _, k := range keys {
				if s, ok := row[k].(string); ok {
					fields = append(fields, s)
				}
			}
		}
		docs = append(docs, strings.Join(fields, "\n"))
	}
	return docs, sc.Err()
}

// writeFileAtomic writes data to path through a temporary file and a rename.
func writeFileAtomic(path string, data []byte) error {
	return safetensors.WriteAtomic(path, func(w *bufio.Writer) error {
		_, err := w.Write(data)
		return err
	})
}
