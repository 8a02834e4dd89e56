package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/hfhub"
)

func newDownloadCommand() *cobra.Command {
	var split, config string
	cmd := &cobra.Command{
		Use:   "download ORG/NAME[@REVISION] | hf://datasets/ORG/NAME[@REVISION][/PATH]",
		Short: "Fetch a model or dataset from the Hugging Face Hub into the cache ahead of time",
		Long: `Downloads what a run would read from the Hugging Face Hub into the huggingface_hub cache that Python's tools
share ($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub), and prints the local folder (or file).
Later runs naming the same id find it there, also with HF_HUB_OFFLINE=1 (no request at all).

A model (or PEFT adapter) repository: its config, safetensors weights (the index's shards when sharded) and
tokenizer files; not the copies in other formats (.bin, .pth, .onnx, .gguf) or subfolders. A dataset: the files
of one split (--split, default train) of one config (--data-config, default the card's default), chosen as train
--data chooses them (README.md's configs, else the file layout), or the Hub's parquet conversion for a dataset
without parquet files; a URL naming a file fetches that file.

Endpoint, token and cache come from the environment as for huggingface_hub: HF_ENDPOINT (a mirror), HF_TOKEN or
the token file of ` + "`huggingface-cli login`" + ` ($HF_HOME/token), HF_HUB_CACHE / HF_HOME. Progress is on stderr.`,
		Example: `  finetune download memfit-test/llama-tiny
  finetune download Qwen/Qwen2.5-0.5B@main
  finetune download hf://datasets/tatsu-lab/alpaca
  finetune download hf://datasets/stanfordnlp/imdb --data-config plain_text --split test
  HF_HUB_OFFLINE=1 finetune train --model Qwen/Qwen2.5-0.5B --data hf://datasets/tatsu-lab/alpaca --out runs/a`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("download takes one repository: ORG/NAME[@REVISION] (a model) or hf://datasets/ORG/NAME (a dataset)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if strings.HasPrefix(name, "hf://datasets/") { // hf://ORG/NAME and hf://models/ORG/NAME are models, as for --model
				if _, err := hfhub.ParseData(name); err != nil {
					return usageError{err}
				}
				local, src, err := hubData(cmd, "download", name, finetune.DataOptions{Split: split, Config: config})
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "dataset %s at commit %s\n", src.Repo, src.Commit)
				fmt.Fprintln(cmd.OutOrStdout(), local)
				return nil
			}
			if cmd.Flags().Changed("split") || cmd.Flags().Changed("data-config") {
				return usagef("--split and --data-config pick a dataset's files: name it hf://datasets/%s", name)
			}
			r, ok, err := hfhub.ParseModel(name)
			if err != nil {
				return usageError{err}
			}
			if !ok {
				return usagef("%s is not a Hub id: a model is ORG/NAME[@REVISION], a dataset hf://datasets/ORG/NAME", name)
			}
			ctx, stop := interruptible()
			defer stop()
			snap, err := hubClient(cmd).Model(ctx, r)
			if err != nil {
				return hubError("download", name, err)
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "model %s at commit %s: %d files\n", r.ID, snap.Commit, len(snap.Files))
			fmt.Fprintln(cmd.OutOrStdout(), snap.Dir)
			return nil
		},
	}
	cmd.Flags().StringVar(&split, "split", "", "the dataset's split (default train)")
	cmd.Flags().StringVar(&config, "data-config", "", "the dataset's config (default: the card's default, or its only one)")
	return cmd
}
