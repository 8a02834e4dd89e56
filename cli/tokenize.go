package cli

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/memfit/memfit/data"
)

func newTokenizeCommand() *cobra.Command {
	var path string
	var noSpecial, decode, skipSpecial bool
	cmd := &cobra.Command{
		Use:   "tokenize --tokenizer PATH [--no-special] [--decode] [TEXT...]",
		Short: "Encode texts to token ids (or decode ids) with a Hugging Face tokenizer",
		Long: `Reads a tokenizer.json (with tokenizer_config.json beside it), a SentencePiece tokenizer.model, or a folder
holding one, or the tokenizer of a GGUF file, and prints one JSON object per text: {"text": ..., "ids": [...]}. Special tokens are added as the
tokenizer's post-processor says unless --no-special. With --decode each argument is a list of ids (separated by
spaces or commas) and the output is {"ids": [...], "text": ...}. Without arguments, each line of standard input is
one text.`,
		Example: `  finetune tokenize --tokenizer pretrained/llama-tiny "Hello world" "Once upon a time"
  finetune tokenize --tokenizer ../shared/data/tokenizers/llama2/tokenizer.model --decode "1 15043 3186"
  cat prompts.txt | finetune tokenize --tokenizer ../shared/data/tokenizers/llama3 --no-special`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if path == "" {
				return usagef("--tokenizer is required")
			}
			tok, err := loadTokenizer(path)
			if err != nil {
				return err
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetEscapeHTML(false)
			do := func(arg string) error {
				if !decode {
					return enc.Encode(struct {
						Text string `json:"text"`
						IDs  []int  `json:"ids"`
					}{arg, nonNil(tok.Encode(arg, !noSpecial))})
				}
				var ids []int
				for _, f := range strings.FieldsFunc(arg, func(r rune) bool { return r == ',' || r == ' ' || r == '\t' || r == '[' || r == ']' }) {
					id, err := strconv.Atoi(f)
					if err != nil || id < 0 || id >= tok.VocabSize() {
						return usagef("--decode: %q is not a token id (0..%d)", f, tok.VocabSize()-1)
					}
					ids = append(ids, id)
				}
				return enc.Encode(struct {
					IDs  []int  `json:"ids"`
					Text string `json:"text"`
				}{nonNil(ids), tok.Decode(ids, skipSpecial)})
			}
			if len(args) > 0 {
				for _, a := range args {
					if err := do(a); err != nil {
						return err
					}
				}
				return nil
			}
			return data.EachLineOf(cmd.InOrStdin(), "standard input", func(_ int, text string) error { return do(text) })
		},
	}
	f := cmd.Flags()
	f.StringVar(&path, "tokenizer", "", "tokenizer.json, tokenizer.model, or a folder with one")
	f.BoolVar(&noSpecial, "no-special", false, "do not add the post-processor's special tokens (BOS, [CLS], ...)")
	f.BoolVar(&decode, "decode", false, "arguments are token ids to decode")
	f.BoolVar(&skipSpecial, "skip-special", false, "with --decode: leave special tokens out of the text")
	return cmd
}

func nonNil(ids []int) []int {
	if ids == nil {
		return []int{}
	}
	return ids
}
