package cli

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/memfit/memfit/finetune"
)

func newExportCommand(opts *Options) *cobra.Command {
	var run, format, out, checkpoint string
	var overwrite bool
	cmd := &cobra.Command{
		Use:   "export --run DIR --format peft|merged --out DIR",
		Short: "Export a training run as a PEFT adapter or a merged Hugging Face checkpoint",
		Long: `Reads a training output folder (run.yaml and its latest checkpoint, or --checkpoint) and writes either the PEFT
LoRA adapter (adapter_model.safetensors + adapter_config.json; adapters trained with MS-norm are converted to the
original checkpoint's basis) or a merged checkpoint (config.json + model.safetensors) that transformers and memfit
load unchanged: adapters merged, norm affines restored.`,
		Example: `  finetune export --run runs/vit --format merged --out /tmp/vit-finetuned`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if run == "" || out == "" {
				return usagef("--run and --out are required")
			}
			if format != "peft" && format != "merged" {
				return usagef("--format must be peft or merged, got %q", format)
			}
			spec, err := finetune.ReadRunSpec(run)
			if err != nil {
				return err
			}
			if err := exportTarget(out, spec.Model, format, overwrite); err != nil {
				return usageError{err}
			}
			model, err := finetune.LoadModel(spec.Model, spec.Config)
			if err != nil {
				return err
			}
			backend, err := opts.NewBackend()
			if err != nil {
				return err
			}
			from := run
			if checkpoint != "" {
				from = checkpoint
			}
			tr, err := finetune.Resume(from, model, backend, nil)
			if err != nil {
				return err
			}
			if format == "peft" {
				err = tr.ExportAdapter(out, spec.Model)
			} else {
				err = tr.ExportMerged(out)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (%s, step %d)\n", out, format, tr.Step)
			return nil
		},
	}
	cmd.Flags().StringVar(&run, "run", "", "training output folder")
	cmd.Flags().StringVar(&checkpoint, "checkpoint", "", "a specific checkpoint folder (default: the run's latest)")
	cmd.Flags().StringVar(&format, "format", "peft", "peft or merged")
	cmd.Flags().StringVar(&out, "out", "", "output folder")
	cmd.Flags().BoolVar(&overwrite, "overwrite", false, "replace an earlier export in --out")
	return cmd
}

// exportTarget refuses an --out that would lose something: the run's base model (its weights would be replaced
// by the merged ones), a training output folder or a checkpoint (whose files would mix with the export), or an
// earlier export unless overwrite (whose files it then removes).
func exportTarget(out, baseModel, format string, overwrite bool) error {
	if same(out, baseModel) {
		return fmt.Errorf("--out %s is the run's base model: exporting there would replace the weights the run trains on; choose another folder", out)
	}
	for _, f := range []struct{ file, what string }{{finetune.RunFile, "a training output folder"}, {"trainer_state.json", "a checkpoint"}} {
		if _, err := os.Stat(filepath.Join(out, f.file)); err == nil {
			return fmt.Errorf("--out %s is %s (it holds %s): export to a folder of its own, e.g. %s", out, f.what, f.file, filepath.Join(out, format))
		}
	}
	files := modelFiles
	if format == "peft" {
		files = []string{"adapter_config.json", "adapter_model.safetensors"}
	}
	return clearFiles(out, files, "an export", overwrite)
}

// same reports whether two paths name the same folder (after resolving links).
func same(a, b string) bool {
	sa, errA := os.Stat(a)
	sb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(sa, sb)
}
