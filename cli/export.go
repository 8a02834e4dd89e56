package cli

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/memfit/memfit/finetune"
)

func newExportCommand(opts *Options) *cobra.Command {
	var run, format, out, checkpoint string
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
	return cmd
}
