package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/gomlx/compute"
	"github.com/gomlx/gomlx/core/tensors"
	"github.com/spf13/cobra"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/runner"
)

func newInitCommand(_ *Options) *cobra.Command {
	var arch, preset, out, from, dtype string
	var seed uint64
	var numLabels int
	var overwrite, configOnly bool
	var shardMB int64
	cmd := &cobra.Command{
		Use:   "init --arch vit|llama|bert|roberta --preset NAME --out DIR",
		Short: "Write a random-init Hugging Face checkpoint with real model shapes",
		Long: `Writes config.json and model.safetensors (sharded with an index above --max-shard-mb) for a randomly
initialised model, initialised as transformers does. Presets: vit: tiny, vit-b16; llama: tiny, llama-1b
(TinyLlama-1.1B shapes), llama-7b; bert: bert-base; roberta: roberta-mini (tests), roberta-base. --num-labels makes a classifier
(ViTForImageClassification, LlamaForSequenceClassification, ...ForSequenceClassification); without it ViT is a
ViTModel, LLaMA a causal LM, and an encoder (bert, roberta) a 2-class sequence classifier, what encoders are
fine-tuned as (its masked LM comes from pretraining: finetune pretrain roberta). --from DIR instead copies a
model and gives it a new classification head of --num-labels classes (1: a regression head), as transformers does
when a checkpoint is loaded with a new num_labels; tokenizer files come along.`,
		Example: `  finetune init --arch vit --preset tiny --num-labels 10 --out /tmp/vit-tiny
  finetune init --from pretrained/llama-tiny --num-labels 2 --out /tmp/llama-sst2
  finetune init --arch llama --preset llama-1b --out /tmp/llama-1b --seed 7`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return usagef("--out is required")
			}
			if numLabels < 0 || numLabels > maxLabels {
				return usagef("--num-labels %d: give 0 (no classification head) to %d classes", numLabels, maxLabels)
			}
			if shardMB < 0 {
				return usagef("--max-shard-mb %d: give 0 (one file) or a positive size", shardMB)
			}
			if from != "" && same(from, out) {
				return usagef("--out %s is the --from model: writing there would replace the weights it reads; choose another folder", out)
			}
			if from != "" && (arch != "" || cmd.Flags().Changed("preset") || cmd.Flags().Changed("dtype") || cmd.Flags().Changed("max-shard-mb")) {
				return usagef("--from takes the architecture, shapes, dtype and files from the model; leave out --arch, --preset, --dtype and --max-shard-mb")
			}
			var err error
			if from, _, err = hubModel(cmd, "--from", from, hubFiles); err != nil {
				return err
			}
			if err := outputFolder("--out", out, modelFiles, inputs{}.add("--from", from, modelReads...), overwrite, false); err != nil {
				return err
			}
			if err := freshModelFolder(out, overwrite); err != nil {
				return usageError{err}
			}
			if from != "" {
				if err := finetune.NewHead(from, numLabels, seed, out); err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (%s with a new %d-label head)\n", out, from, numLabels)
				return nil
			}
			if arch == "" {
				return usagef("--arch (vit or llama) or --from is required")
			}
			if configOnly {
				if err := finetune.InitConfig(arch, preset, numLabels, out); err != nil {
					return usageError{err}
				}
				fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (config.json only: %s %s)\n", filepath.Join(out, "config.json"), arch, preset)
				return nil
			}
			if err := finetune.InitModel(arch, preset, numLabels, seed, out, shardMB<<20, dtype); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (%s %s)\n", out, arch, preset)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&arch, "arch", "", "architecture: a model_type (vit, llama, bert, roberta, xlm-roberta, ...)")
	f.StringVar(&preset, "preset", "tiny", "shape preset")
	f.StringVar(&out, "out", "", "output folder")
	f.Uint64Var(&seed, "seed", 0, "random seed")
	f.IntVar(&numLabels, "num-labels", 0, "number of classes (0: ViTModel / causal LM)")
	f.Int64Var(&shardMB, "max-shard-mb", 0, "shard the weights above this many MiB (0: one file)")
	f.StringVar(&from, "from", "", "make a classifier from this model folder (or Hub id): its weights and a new --num-labels head")
	f.StringVar(&dtype, "dtype", "float32", "stored dtype: float32 or bfloat16")
	f.BoolVar(&overwrite, "overwrite", false, "replace the model in an --out that holds one (its weights, config and tokenizer files)")
	f.BoolVar(&configOnly, "config-only", false, "write config.json alone, no weights: what finetune memory reads to plan the model (edit it to plan another shape)")
	return cmd
}

// maxLabels bounds --num-labels: a head of a million classes is already gigabytes at LLaMA-7B's width.
const maxLabels = 1_000_000

// modelFiles matches the files of a Hugging Face model folder that init writes or that belong to the model it
// would replace (a tokenizer left from another model would pair the wrong vocabulary with the new weights).
var modelFiles = []string{"config.json", "*.safetensors", "model.safetensors.index.json", "tokenizer.json",
	"tokenizer_config.json", "chat_template.jinja", "tokenizer.model", "special_tokens_map.json", "preprocessor_config.json", "generation_config.json"}

// freshModelFolder refuses an output folder that already holds a model (a config.json or weights) unless
// overwrite, and with overwrite removes that model's files (and only those).
func freshModelFolder(out string, overwrite bool) error {
	return clearFiles(out, modelFiles, "a model", overwrite)
}

// clearFiles refuses an output folder holding files that match patterns (what names them in the error) unless
// overwrite, and with overwrite removes those files (and only those).
func clearFiles(out string, patterns []string, what string, overwrite bool) error {
	var found []string
	for _, pat := range patterns {
		m, _ := filepath.Glob(filepath.Join(out, pat))
		for _, f := range m {
			if !slices.Contains(found, f) { // two patterns may match one file (*.safetensors, adapter_model.safetensors)
				found = append(found, f)
			}
		}
	}
	if len(found) == 0 {
		return nil
	}
	if !overwrite {
		return fmt.Errorf("%s already holds %s (%s): choose another --out, or pass --overwrite to replace it", out, what, filepath.Base(found[0]))
	}
	for _, f := range found {
		if err := os.Remove(f); err != nil {
			return err
		}
	}
	return nil
}

func newLogitsCommand(opts *Options) *cobra.Command {
	var model, inputs, adapter string
	cmd := &cobra.Command{
		Use:   "logits --model DIR|FILE.gguf --inputs FILE.json [--adapter DIR]",
		Short: "Run a model on JSON inputs and print {\"logits\": [...]}",
		Long: `Loads a Hugging Face model folder (ViT or LLaMA) and prints its logits as JSON nested lists. The inputs file
holds input_ids (and optionally attention_mask) for LLaMA or pixel_values (NCHW) for ViT, as nested lists, either
at the top level or under "inputs" (the layout of the golden files). --adapter applies a PEFT LoRA adapter (and
its modules_to_save) to the model. --model also takes a LLaMA GGUF file (f32, f16, bf16 or q8_0 tensors, dequantised to
float32).`,
		Example: `  finetune logits --model ../shared/data/golden/llama_a --inputs ../shared/data/golden/llama_a/golden.json`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if model == "" || inputs == "" {
				return usagef("--model and --inputs are required")
			}
			in, err := runner.ReadInputs(inputs)
			if err != nil {
				return err
			}
			if _, _, err := hubFolders(cmd, &model, &adapter); err != nil {
				return err
			}
			backend, err := opts.NewBackend()
			if err != nil {
				return err
			}
			logits, err := modelLogits(backend, model, adapter, in)
			if err != nil {
				return err
			}
			data, err := runner.NestedJSON(logits)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "{\"logits\": %s}\n", data)
			return err
		},
	}
	cmd.Flags().StringVar(&model, "model", "", "model folder (config.json + safetensors), or Hub id ORG/NAME[@REVISION]")
	cmd.Flags().StringVar(&inputs, "inputs", "", "inputs JSON file")
	cmd.Flags().StringVar(&adapter, "adapter", "", "PEFT LoRA adapter folder (or Hub id) to apply")
	return cmd
}

// modelLogits runs the model at dir (with a PEFT adapter unless adapter is "") on the inputs, which must hold
// what the model reads (attention_mask is optional: without it no token is padding).
func modelLogits(backend compute.Backend, dir, adapter string, in runner.Batch) (*tensors.Tensor, error) {
	m, set, err := loadModelAdapter(dir, adapter)
	if err != nil {
		return nil, err
	}
	for _, name := range m.BatchInputs() {
		if _, ok := in[name]; !ok && name != "labels" && name != "attention_mask" {
			return nil, fmt.Errorf("the model reads %q: give it in the inputs file", name)
		}
	}
	for name := range in {
		if !slices.Contains(m.BatchInputs(), name) {
			return nil, fmt.Errorf("the inputs file gives %q, which the model does not read (it reads %v)", name, m.BatchInputs())
		}
	}
	return finetune.Logits(backend, m, nil, set, in)
}
