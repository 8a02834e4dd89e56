package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/memfit/memfit/finetune"
)

func newExportCommand(opts *Options) *cobra.Command {
	var run, format, out, checkpoint string
	var overwrite bool
	var g ggufExport
	cmd := &cobra.Command{
		Use:   "export --run DIR --format peft|merged|gguf --out PATH",
		Short: "Export a training run as a PEFT adapter, a merged Hugging Face checkpoint or a GGUF file (llama.cpp, Ollama)",
		Long: `Reads a training output folder (run.yaml and its latest checkpoint, or --checkpoint best|last|STEP|FOLDER) and writes either the PEFT
LoRA adapter (adapter_model.safetensors + adapter_config.json; adapters trained with MS-norm are converted to the
original checkpoint's basis) or a merged checkpoint that transformers and memfit load unchanged: config.json and
model.safetensors (adapters merged, norm affines restored), the tokenizer files of the run's tokenizer and the base
model's generation_config.json (made from the config's token ids for a causal LM without one), so that
finetune generate and eval take the folder as a model. A run started from --init-adapter exports from its own copy
of that adapter (its folder may be gone). --out is refused when it would replace a file export reads (the base
model, the run, its tokenizer), and an earlier export there needs --overwrite.

--format gguf writes the merged LLaMA causal LM as one GGUF v3 file that llama.cpp, Ollama and LM Studio run
(--out FILE.gguf; --gguf-type f32, f16, bf16 or q8_0): llama.cpp's tensor names and hyperparameters, the tokenizer
(byte-level BPE as gpt2 with its pre-tokenizer's name, SentencePiece as llama) and the chat template, plus an
Ollama Modelfile beside it (FILE.Modelfile). See docs/gguf.md.

--format gguf and merged also export a model folder without a run: --model DIR [--adapter DIR] [--tokenizer
PATH] (the PEFT adapter merged into the model).`,
		Example: `  finetune export --run runs/vit --format merged --out /tmp/vit-finetuned
  finetune export --run runs/alpaca --format gguf --out alpaca.gguf --gguf-type q8_0
  finetune export --model pretrained/llama-tiny --adapter pretrained/llama-tiny-alpaca --format gguf --out tiny.gguf`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if format == "gguf" {
				g.run, g.checkpoint, g.out, g.overwrite = run, checkpoint, out, overwrite
				return g.export(cmd, opts)
			}
			if format != "peft" && format != "merged" {
				return usagef("--format must be peft, merged or gguf, got %q", format)
			}
			if cmd.Flags().Changed("gguf-type") {
				return usagef("--gguf-type goes with --format gguf")
			}
			if format == "merged" && g.model != "" {
				g.run, g.checkpoint, g.out, g.overwrite = run, checkpoint, out, overwrite
				return g.exportMerged(cmd)
			}
			if g.model != "" || g.adapter != "" || g.tokenizer != "" {
				return usagef("--model, --adapter and --tokenizer go with --format gguf or merged; --format %s exports a run (--run)", format)
			}
			if run == "" || out == "" {
				return usagef("--run and --out are required")
			}
			spec, err := finetune.ReadRunSpec(run)
			if err != nil {
				return err
			}
			if err := restoreHub(cmd, &spec); err != nil {
				return err
			}
			ins := inputs{}.add("--run", run, runReads...).add("--checkpoint", checkpointPath(run, checkpoint), checkpointReads...).
				add("the run's base model", spec.Model, modelReads...).add("the run's tokenizer", spec.DataOptions.Tokenizer, tokenizerReads...)
			if err := exportTarget(out, spec.Model, format, exportName(format, checkpoint), overwrite, ins); err != nil {
				return err
			}
			model, err := finetune.LoadModel(spec.Model, spec.Config)
			if err != nil {
				return err
			}
			backend, err := opts.NewBackend()
			if err != nil {
				return err
			}
			from, err := checkpointOf(run, checkpoint)
			if err != nil {
				return err
			}
			tr, err := finetune.Resume(from, model, backend, nil)
			if err != nil {
				return err
			}
			if format == "peft" {
				err = tr.ExportAdapterAt(out, spec.ModelName(), spec.ModelRevision())
			} else {
				err = tr.ExportMergedFolder(out, spec.Model, spec.DataOptions.Tokenizer)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (%s, step %d)\n", out, format, tr.Step)
			return nil
		},
	}
	cmd.Flags().StringVar(&run, "run", "", "training output folder")
	cmd.Flags().StringVar(&checkpoint, "checkpoint", "", "best (the lowest validation loss), last, a step number, or a checkpoint folder (default: the run's latest)")
	cmd.Flags().StringVar(&format, "format", "peft", "peft, merged or gguf")
	cmd.Flags().StringVar(&out, "out", "", "output folder (peft, merged) or file (gguf: FILE.gguf)")
	cmd.Flags().BoolVar(&overwrite, "overwrite", false, "replace an earlier export in --out")
	cmd.Flags().StringVar(&g.typ, "gguf-type", "f32", "GGUF tensor type: f32, f16, bf16 or q8_0 (norms stay f32)")
	cmd.Flags().StringVar(&g.model, "model", "", "gguf or merged without a run: a model folder or Hub id ORG/NAME[@REVISION]")
	cmd.Flags().StringVar(&g.adapter, "adapter", "", "gguf or merged without a run: a PEFT adapter folder (or Hub id) merged into --model")
	cmd.Flags().StringVar(&g.tokenizer, "tokenizer", "", "gguf or merged without a run: the tokenizer (default: the --model folder's)")
	return cmd
}

// checkpointPath is the folder --checkpoint names: best, last and a step number are checkpoints of the run
// (run/best, its latest, run/checkpoint-N); anything else is a folder path ("" : none given).
func checkpointPath(run, checkpoint string) string {
	switch {
	case checkpoint == finetune.BestDir:
		return filepath.Join(run, finetune.BestDir)
	case checkpoint == "last":
		if dir, err := finetune.LatestCheckpoint(run); err == nil {
			return dir
		}
		return ""
	case isStep(checkpoint):
		return filepath.Join(run, "checkpoint-"+checkpoint)
	}
	return checkpoint
}

func isStep(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n >= 0 && strconv.Itoa(n) == s
}

// checkpointOf returns the checkpoint folder export reads: the run's latest without --checkpoint, or the one
// --checkpoint names (checkpointPath), with one line saying what is missing when it is not there.
func checkpointOf(run, checkpoint string) (string, error) {
	if checkpoint == "" || checkpoint == "last" {
		return run, nil // finetune.Resume takes the latest checkpoint of an output folder
	}
	dir := checkpointPath(run, checkpoint)
	if _, err := os.Stat(filepath.Join(dir, finetune.StateFile)); err != nil {
		switch {
		case errors.Is(err, fs.ErrPermission):
			return "", fmt.Errorf("--checkpoint %s: %v: this user cannot read that checkpoint (ask its owner to make it readable: chmod -R a+rX %s)", checkpoint, err, dir)
		case checkpoint == finetune.BestDir:
			if spec, err := finetune.ReadRunSpec(run); err == nil && (spec.EvalData != "" || spec.Config.EvalSplit > 0) {
				when := "at its last step"
				if n := spec.Config.EvalEvery; n > 0 {
					when = fmt.Sprintf("at step %d", min(n, spec.Config.Steps))
				}
				return "", fmt.Errorf("--checkpoint best: %s has no best checkpoint yet (%s): the run has a validation set, and its first evaluation (%s) writes one: wait for it, or export another checkpoint", run, dir, when)
			}
			return "", fmt.Errorf("--checkpoint best: %s has no best checkpoint (%s): only runs with a validation set (--eval-data or --eval-split) keep one", run, dir)
		case isStep(checkpoint):
			return "", fmt.Errorf("--checkpoint %s: %s has no checkpoint of step %s (%s): the run keeps %s", checkpoint, run, checkpoint, dir, keptCheckpoints(run))
		}
		return "", fmt.Errorf("--checkpoint %s is not a checkpoint folder (no %s): give best, last, a step number or a checkpoint folder", checkpoint, finetune.StateFile)
	}
	return dir, nil
}

// keptCheckpoints lists the checkpoint folders of a run ("none" when it has none).
func keptCheckpoints(run string) string {
	matches, _ := filepath.Glob(filepath.Join(run, "checkpoint-*"))
	var names []string
	for _, m := range matches {
		names = append(names, filepath.Base(m))
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// The files export reads in a run folder and in a checkpoint folder.
var (
	runReads        = []string{finetune.RunFile, finetune.LatestFile, "checkpoint-*/*", "checkpoint-*/" + finetune.InitAdapterDir + "/*", finetune.BestDir + "/*", finetune.BestDir + "/" + finetune.InitAdapterDir + "/*"}
	checkpointReads = []string{"*", finetune.InitAdapterDir + "/*"}
)

// exportTarget refuses an --out that would lose something: the run's base model (its weights would be replaced
// by the merged ones), a training output folder, a checkpoint or any folder training manages (managedFolder:
// the export would mix with the run's files, or be deleted with them), any other file the export reads (ins), or
// an earlier export unless overwrite; with overwrite it removes the earlier export's files, of either format (a
// merged export over a PEFT one left adapter_config.json beside config.json). name is the suggested export
// folder's name (exportName).
func exportTarget(out, baseModel, format, name string, overwrite bool, ins inputs) error {
	if same(out, baseModel) {
		return usagef("--out %s is the run's base model: exporting there would replace the weights the run trains on; choose another folder", out)
	}
	if isRunFolder(out) {
		return usagef("--out %s is a training output folder (it holds %s): export to a folder of its own, e.g. %s", out, finetune.RunFile, filepath.Join(out, "exports", name))
	}
	if err := notInManaged("--out", out, name); err != nil {
		return err
	}
	files := append(slices.Clone(modelFiles), adapterFiles...)
	if err := outputFolder("--out", out, files, ins, overwrite, false); err != nil {
		return err
	}
	if err := clearFiles(out, files, "an export", overwrite); err != nil {
		return usageError{err}
	}
	return nil
}

// adapterFiles are the files of a PEFT adapter export.
var adapterFiles = []string{"adapter_config.json", "adapter_model.safetensors"}

// exportName is the name export suggests for its output under a run's exports folder: the format, with the
// checkpoint exported when one was named (peft, merged-best, peft-20).
func exportName(format, checkpoint string) string {
	if checkpoint == "" || checkpoint == "last" {
		return format
	}
	if checkpoint != finetune.BestDir && !isStep(checkpoint) {
		return format + "-" + filepath.Base(checkpoint)
	}
	return format + "-" + checkpoint
}

// same reports whether two paths name the same folder (after resolving links).
func same(a, b string) bool {
	sa, errA := os.Stat(a)
	sb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(sa, sb)
}
