package cli

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/gomlx/compute"
	"github.com/spf13/cobra"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/data/hfdata"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/hfhub"
	"github.com/memfit/memfit/preference"
	"github.com/memfit/memfit/pretrained"
	"github.com/memfit/memfit/safetensors"
	"github.com/memfit/memfit/tokenizer/bpetrain"
)

func newPretrainCommand(opts *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "pretrain",
		Short: "Make the small pretrained checkpoints memfit ships (tokenizers, ViT, LLaMA, RoBERTa) from real data",
		Long: `No real ViT, LLaMA or RoBERTa checkpoint is reachable from memfit's build machines, so memfit makes small ones
itself and ships them (pretrained/): byte-level BPE tokenizers trained on English text, a small ViT trained on
Fashion-MNIST, a small LLaMA and a small RoBERTa (masked LM) trained on English text. pretrained/README.md
records the exact commands.`,
	}
	cmd.AddCommand(newPretrainTokenizerCommand(), newPretrainViTCommand(opts), newPretrainDemoDataCommand(),
		newPretrainLlamaCommand(opts), newPretrainRobertaCommand(opts), newPretrainPreferenceDataCommand())
	return cmd
}

const fashionDir = "/usr/share/datasets/fashion-mnist"

func newPretrainViTCommand(opts *Options) *cobra.Command {
	var dir, out string
	var overwrite bool
	var o pretrained.PretrainViTOptions
	cmd := &cobra.Command{
		Use:   "vit --out DIR [--fashion-mnist DIR]",
		Short: "Train the shipped small ViT from random init on Fashion-MNIST classes 0-4",
		Long: `Trains pretrained.ViTConfig (28x28 grey images, 7x7 patches, hidden 64, 4 layers) from random initialisation
on the Fashion-MNIST training images of classes 0-4 (T-shirt/top, Trouser, Pullover, Dress, Coat), full
fine-tuning with AdamW, and writes a Hugging Face folder. Fashion-MNIST comes from the Debian package
dataset-fashion-mnist (apt install dataset-fashion-mnist), which installs it in ` + fashionDir + `.`,
		Example: `  finetune pretrain vit --out pretrained/vit-fashion`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return usagef("--out is required")
			}
			if err := outputFolder("--out", out, modelFiles, inputs{}.add("--fashion-mnist", dir), overwrite, true); err != nil {
				return err
			}
			backend, err := opts.NewBackend()
			if err != nil {
				return err
			}
			defer backend.Finalize()
			progress := newProgress(cmd.ErrOrStderr(), o.Steps, 0)
			o.OnStep = progress
			f := func(name string) string { return filepath.Join(dir, name) }
			acc, err := pretrained.PretrainViT(cmd.Context(), backend, f("train-images-idx3-ubyte.gz"), f("train-labels-idx1-ubyte.gz"),
				f("t10k-images-idx3-ubyte.gz"), f("t10k-labels-idx1-ubyte.gz"), out, o)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: test accuracy on classes 0-4 %.2f%%\n", out, 100*acc)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "fashion-mnist", fashionDir, "folder with the Fashion-MNIST IDX files")
	f.StringVar(&out, "out", "", "output folder")
	f.IntVar(&o.Steps, "steps", 1500, "optimizer steps")
	f.IntVar(&o.BatchSize, "batch-size", 64, "batch size")
	f.Float64Var(&o.LR, "lr", 1e-3, "peak learning rate")
	f.Uint64Var(&o.Seed, "seed", 1, "seed of the initialisation and the data order")
	f.BoolVar(&overwrite, "overwrite", false, "replace the model in an --out that holds one")
	return cmd
}

func newPretrainDemoDataCommand() *cobra.Command {
	var dir, out string
	var overwrite bool
	var perClassTrain, perClassTest int
	cmd := &cobra.Command{
		Use:   "demo-data --out DIR [--fashion-mnist DIR]",
		Short: "Write the demo's fine-tuning data: Fashion-MNIST classes 5-9 subsets as IDX files",
		Long: `Writes the first --train-per-class training images and the first --test-per-class test images of each of
Fashion-MNIST's classes 5-9 (Sandal, Shirt, Sneaker, Bag, Ankle boot: classes the shipped ViT never saw) in the
original IDX format, gzip-compressed, for finetune demo.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return usagef("--out is required")
			}
			if err := outputFolder("--out", out, []string{"fashion-5to9-*.idx.gz"}, inputs{}.add("--fashion-mnist", dir), overwrite, true); err != nil {
				return err
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			for _, split := range []struct {
				in, name string
				per      int
			}{{"train", "train", perClassTrain}, {"t10k", "test", perClassTest}} {
				imgs, err := pretrained.ReadIDX(filepath.Join(dir, split.in+"-images-idx3-ubyte.gz"))
				if err != nil {
					return err
				}
				labs, err := pretrained.ReadIDX(filepath.Join(dir, split.in+"-labels-idx1-ubyte.gz"))
				if err != nil {
					return err
				}
				si, sl, err := pretrained.Subset(imgs, labs, []int{5, 6, 7, 8, 9}, split.per)
				if err != nil {
					return err
				}
				if err := pretrained.WriteIDX(filepath.Join(out, "fashion-5to9-"+split.name+"-images.idx.gz"), si); err != nil {
					return err
				}
				if err := pretrained.WriteIDX(filepath.Join(out, "fashion-5to9-"+split.name+"-labels.idx.gz"), sl); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %d images\n", split.name, sl.Dims[0])
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "fashion-mnist", fashionDir, "folder with the Fashion-MNIST IDX files")
	f.StringVar(&out, "out", "", "output folder")
	f.IntVar(&perClassTrain, "train-per-class", 300, "training images per class")
	f.IntVar(&perClassTest, "test-per-class", 200, "test images per class")
	f.BoolVar(&overwrite, "overwrite", false, "replace the data files in an --out that holds them")
	return cmd
}

func newPretrainTokenizerCommand() *cobra.Command {
	var texts []string
	var out, layout string
	var overwrite bool
	var vocab, maxLen int
	cmd := &cobra.Command{
		Use:   "tokenizer --text FILE [--text FILE...] --vocab N --out DIR [--layout roberta]",
		Short: "Train a byte-level BPE tokenizer (Llama-3 or RoBERTa layout) and write tokenizer.json",
		Long: `Trains a byte-level BPE tokenizer on the given files (.txt: the whole file; .jsonl: each row's string fields,
e.g. Alpaca instruction/input/output, rows whose "status" is present and not "ok" are skipped) and writes
tokenizer.json and tokenizer_config.json into --out. Training is deterministic. The llama3 layout (default) has
the Llama-3 pre-tokenizer and special tokens <|begin_of_text|> as BOS, <|end_of_text|> as EOS and <|pad|> after
the vocabulary; the roberta layout has GPT-2's pre-tokenizer (RoBERTa's ByteLevel), <s> <pad> </s> <unk> <mask>
as ids 0-4 and RoBERTa's <s> A </s></s> B </s> template.`,
		Example: `  finetune pretrain tokenizer --text ../shared/data/text/war-and-peace.txt \
    --text ../shared/data/alpaca-libre/alpaca_libre_tasks_v1.jsonl --vocab 4096 --out pretrained/llama-tiny
  finetune pretrain tokenizer --text ../shared/data/text/war-and-peace.txt --vocab 4096 --layout roberta \
    --max-length 128 --out pretrained/roberta-tiny`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(texts) == 0 || out == "" {
				return usagef("--text and --out are required")
			}
			var ins inputs
			for _, t := range texts {
				ins = ins.add("--text", t)
			}
			if err := outputFolder("--out", out, []string{"tokenizer.json", "tokenizer_config.json"}, ins, overwrite, true); err != nil {
				return err
			}
			var corpus []string
			for _, path := range texts {
				docs, err := readTextDocs(path)
				if err != nil {
					return err
				}
				corpus = append(corpus, docs...)
			}
			bo := bpetrain.Options{VocabSize: vocab, Layout: layout}
			if layout != bpetrain.LayoutRoBERTa {
				bo.Special = []string{"<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"}
			}
			m, err := bpetrain.Train(corpus, bo)
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
	f.StringVar(&layout, "layout", bpetrain.LayoutLlama3, "tokenizer.json layout: llama3 or roberta")
	f.BoolVar(&overwrite, "overwrite", false, "replace the tokenizer in an --out that holds one (a model's tokenizer no longer matches its vocabulary)")
	return cmd
}

// readTextDocs reads a .txt file as one document, or a .jsonl file as one document per row (its string fields
// joined by newlines, in key order; rows with a "status" other than "ok" skipped). A line longer than
// data.MaxLineBytes is an error naming the file and line.
func readTextDocs(path string) ([]string, error) {
	if !strings.HasSuffix(path, ".jsonl") {
		text, err := data.ReadTextFile(path)
		if err != nil {
			return nil, err
		}
		return []string{text}, nil
	}
	var docs []string
	err := data.EachFileLine(path, func(line int, text string) error {
		if strings.TrimSpace(text) == "" {
			return nil
		}
		var row map[string]any
		if err := json.Unmarshal([]byte(text), &row); err != nil {
			return fmt.Errorf("%s:%d: not a JSON object: %v", path, line, err)
		}
		if s, ok := row["status"]; ok && s != "ok" {
			return nil
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
		return nil
	})
	return docs, err
}

// writeFileAtomic writes data to path through a temporary file and a rename.
func writeFileAtomic(path string, data []byte) error {
	return safetensors.WriteAtomic(path, func(w *bufio.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

func newPretrainLlamaCommand(opts *Options) *cobra.Command {
	var tok, out string
	var texts []string
	var overwrite bool
	var o pretrained.PretrainLlamaOptions
	cmd := &cobra.Command{
		Use:   "llama --tokenizer DIR --text FILE... --out DIR",
		Short: "Train the shipped tiny LLaMA from random init on English text",
		Long: `Trains pretrained.LlamaConfig (hidden 128, 4 layers, GQA 4/2 heads, SwiGLU, tied embeddings) from random
initialisation as a causal LM on the given texts (.txt split into paragraphs, Alpaca .jsonl rows), encoded with
the tokenizer in --tokenizer and packed into --seq-len blocks, and writes a Hugging Face folder with the
tokenizer files. Prints the held-out loss and perplexity (every 50th block is held out).`,
		Example: `  finetune pretrain llama --tokenizer pretrained/llama-tiny --text ../shared/data/text/war-and-peace.txt \
    --text ../shared/data/alpaca-libre/alpaca_libre_tasks_v1.jsonl --out pretrained/llama-tiny`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runPretrainText(cmd, opts, tok, out, "", texts, overwrite, o.Steps, "held-out loss",
				func(backend compute.Backend, onStep func(finetune.StepStats)) (float64, float64, error) {
					o.OnStep = onStep
					return pretrained.PretrainLlama(cmd.Context(), backend, tok, texts, out, o)
				})
		},
	}
	f := cmd.Flags()
	f.StringVar(&tok, "tokenizer", "", "folder with tokenizer.json (and tokenizer_config.json)")
	f.StringArrayVar(&texts, "text", nil, "training text: .txt or Alpaca .jsonl (repeatable)")
	f.StringVar(&out, "out", "", "output folder")
	f.IntVar(&o.Steps, "steps", 2000, "optimizer steps")
	f.IntVar(&o.BatchSize, "batch-size", 16, "sequences per step")
	f.IntVar(&o.SeqLen, "seq-len", 128, "tokens per sequence")
	f.Float64Var(&o.LR, "lr", 3e-3, "peak learning rate")
	f.Uint64Var(&o.Seed, "seed", 1, "seed of the initialisation and the data order")
	f.BoolVar(&overwrite, "overwrite", false, "replace the model in an --out that holds one")
	return cmd
}

func newPretrainRobertaCommand(opts *Options) *cobra.Command {
	var tok, out string
	var texts []string
	var overwrite bool
	var o pretrained.PretrainRobertaOptions
	cmd := &cobra.Command{
		Use:   "roberta --tokenizer DIR --text FILE... --out DIR",
		Short: "Train the shipped tiny RoBERTa (masked LM) from random init on English text",
		Long: `Trains pretrained.RobertaConfig (hidden 128, 4 layers of 4 heads, GELU MLP 512, post-LN, 128-token sequences)
from random initialisation as a masked LM on the given texts (.txt split into paragraphs), encoded with the
RoBERTa-layout tokenizer in --tokenizer (finetune pretrain tokenizer --layout roberta) into rows of --seq-len
tokens, masked afresh each batch (15%: 80% <mask>, 10% random, 10% kept), and writes a Hugging Face folder
(RobertaForMaskedLM) with the tokenizer files. Prints the held-out masked-LM loss and perplexity (every 50th row
is held out).`,
		Example: `  finetune pretrain roberta --tokenizer pretrained/roberta-tiny --text ../shared/data/text/war-and-peace.txt \
    --out pretrained/roberta-tiny`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !(o.MaskProb > 0 && o.MaskProb < 1) { // 0 would mean the default to PretrainRoberta
				return usagef("--mask-prob %g: give a share of the tokens between 0 and 1", o.MaskProb)
			}
			return runPretrainText(cmd, opts, tok, out, o.From, texts, overwrite, o.Steps, "held-out masked-LM loss",
				func(backend compute.Backend, onStep func(finetune.StepStats)) (float64, float64, error) {
					o.OnStep = onStep
					return pretrained.PretrainRoberta(cmd.Context(), backend, tok, texts, out, o)
				})
		},
	}
	f := cmd.Flags()
	f.StringVar(&tok, "tokenizer", "", "folder with a RoBERTa-layout tokenizer.json (and tokenizer_config.json)")
	f.StringArrayVar(&texts, "text", nil, "training text: .txt (repeatable)")
	f.StringVar(&out, "out", "", "output folder")
	f.IntVar(&o.Steps, "steps", 1200, "optimizer steps")
	f.IntVar(&o.BatchSize, "batch-size", 32, "sequences per step")
	f.IntVar(&o.SeqLen, "seq-len", 128, "tokens per sequence (at most 128)")
	f.Float64Var(&o.LR, "lr", 1e-3, "peak learning rate")
	f.Uint64Var(&o.Seed, "seed", 1, "seed of the initialisation, the data order and the masking")
	f.Float64Var(&o.MaskProb, "mask-prob", 0.15, "share of the tokens each batch masks (80% <mask>, 10% random, 10% kept)")
	f.StringVar(&o.From, "from", "", "continue from this RoBERTa masked LM (a further stage with its own schedule) instead of random initialisation")
	f.BoolVar(&overwrite, "overwrite", false, "replace the model in an --out that holds one")
	return cmd
}

// runPretrainText is what the text pretraining commands (llama, roberta) share: the required flags, the output
// folder's checks (its model files; the tokenizer files too unless --tokenizer is --out, as the documented
// pipeline trains the tokenizer into the model's folder first; --from read unless it is --out), the backend, the
// progress line and the result line (what names the loss).
func runPretrainText(cmd *cobra.Command, opts *Options, tok, out, from string, texts []string, overwrite bool, steps int, what string,
	train func(backend compute.Backend, onStep func(finetune.StepStats)) (loss, ppl float64, err error)) error {
	if tok == "" || out == "" || len(texts) == 0 {
		return usagef("--tokenizer, --text and --out are required")
	}
	ins := inputs{}.add("--tokenizer", tok, tokenizerReads...)
	for _, t := range texts {
		ins = ins.add("--text", t)
	}
	if from != "" && !same(from, out) {
		ins = ins.add("--from", from, modelReads...)
	}
	writes := []string{"config.json", "*.safetensors", "model.safetensors.index.json"}
	if !same(tok, out) {
		writes = append(writes, "tokenizer.json", "tokenizer_config.json")
	}
	if err := outputFolder("--out", out, writes, ins, overwrite, true); err != nil {
		return err
	}
	backend, err := opts.NewBackend()
	if err != nil {
		return err
	}
	defer backend.Finalize()
	loss, ppl, err := train(backend, newProgress(cmd.ErrOrStderr(), steps, 0))
	if err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %s %.4f, perplexity %.2f\n", out, what, loss, ppl)
	return nil
}

func newPretrainPreferenceDataCommand() *cobra.Command {
	var in, out string
	var n, perPrompt int
	var seed uint64
	var overwrite bool
	cmd := &cobra.Command{
		Use:   "preference-data --data ALPACA.jsonl --out PAIRS.jsonl [--prompts N] [--per-prompt K] [--seed S]",
		Short: "Write a preference set (prompt, chosen, rejected JSONL) built from Alpaca instructions",
		Long: `Builds DPO/ORPO training pairs from Alpaca-format instructions, reproducibly: each pair's prompt is a row's
Alpaca prompt, chosen its own response and rejected another row's response (drawn by a shuffle seeded by --seed;
--per-prompt K makes K pairs of each prompt, each rejecting a response of its own shuffle).
Nothing but relevance to the prompt tells them apart, so a model that learns to prefer the chosen replies on pairs
it never trained on has learned to answer the prompt. docs/preference.md trains on the set this writes from
../shared/data/alpaca-libre.`,
		Example: `  finetune pretrain preference-data --data ../shared/data/alpaca-libre/alpaca_libre_tasks_v1.jsonl --out /tmp/pairs.jsonl`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if in == "" || out == "" {
				return usagef("--data and --out are required")
			}
			if n < 0 || perPrompt < 1 {
				return usagef("--prompts must not be negative and --per-prompt must be at least 1 (got %d, %d)", n, perPrompt)
			}
			// What this reads and writes is JSONL (probe 2026-11-27-b pp6, pp9, pp10, pp13).
			switch st, err := os.Stat(out); {
			case err == nil && st.IsDir():
				return usagef("--out %s is a folder: give a file name, e.g. %s", out, filepath.Join(out, "pairs.jsonl"))
			case !strings.HasSuffix(out, ".jsonl"):
				return usagef("--out %s: the pairs are written as JSONL: give a name ending in .jsonl (train reads a file's format from its name)", out)
			case hfhub.IsDataURL(in):
				return usagef("--data %s: preference-data reads a local Alpaca JSONL file; fetch the dataset's JSONL file first (finetune download hf://datasets/ORG/NAME/FILE.jsonl prints its path)", in)
			case hfdata.IsParquet(in):
				return usagef("--data %s is parquet: preference-data reads Alpaca JSONL (instruction, input, output)", in)
			}
			if err := outputFile("--out", out, inputs{}.add("--data", in), overwrite, true); err != nil {
				return err
			}
			rows, err := data.ReadInstructions(in)
			if err != nil {
				return err
			}
			pairs, err := preference.FromInstructions(rows, n, perPrompt, seed)
			if err != nil {
				return fmt.Errorf("%s: %w", in, err)
			}
			if err := safetensors.WriteAtomic(out, func(w *bufio.Writer) error { return data.WritePreferences(w, pairs) }); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %d pairs from %d instructions\n", out, len(pairs), len(rows))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&in, "data", "", "Alpaca-format JSONL (instruction, input, output; rows whose status is not ok are skipped)")
	f.StringVar(&out, "out", "", "the preference JSONL to write")
	f.IntVar(&n, "prompts", 0, "prompts to make pairs of: the first rows with a response (0: all)")
	f.IntVar(&perPrompt, "per-prompt", 1, "pairs per prompt, each rejecting another shuffled response")
	f.Uint64Var(&seed, "seed", 1, "seed of the shuffle that draws each rejected response")
	f.BoolVar(&overwrite, "overwrite", false, "replace an --out that exists")
	return cmd
}
