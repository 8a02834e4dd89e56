package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/memfit/memfit/bench"
)

func newBenchCommand(opts *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure memory and speed of the memory-saving options",
	}
	cfg := bench.ViTB(1, 2)
	var variants string
	blocks := &cobra.Command{
		Use:   "blocks",
		Short: "Saved activations, peak memory and step time of a ViT block stack in the four activation/norm modes",
		Long: `Builds a stack of ViT encoder layers (ViT-B shape by default: 197 tokens, hidden 768, MLP 3072, 12 heads),
every weight trainable, float32, standard attention, and trains it one step at a time on random data in each of
GELU+LN, ReGELU2+LN, GELU+MS-LN and ReGELU2+MS-LN. It prints the saved-activation bytes (exact, from the training
graph), the analytic count each variant must keep, the peak memory (measured by the buffer-pool counter in builds
that carry it, otherwise estimated by a liveness simulation; the output says which) and the step time, each with
its ratio to GELU+LN.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			chosen, err := pickVariants(variants)
			if err != nil {
				return err
			}
			backend, err := opts.NewBackend()
			if err != nil {
				return err
			}
			results, err := bench.Measure(backend, cfg, chosen, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			return bench.WriteTable(cmd.OutOrStdout(), cfg, results)
		},
	}
	f := blocks.Flags()
	f.IntVar(&cfg.Layers, "layers", cfg.Layers, "encoder layers")
	f.IntVar(&cfg.Batch, "batch", cfg.Batch, "batch size")
	f.IntVar(&cfg.Tokens, "tokens", cfg.Tokens, "tokens per example (197 = 224x224 images in 16x16 patches + CLS)")
	f.IntVar(&cfg.Hidden, "hidden", cfg.Hidden, "hidden size")
	f.IntVar(&cfg.MLP, "mlp", cfg.MLP, "MLP size")
	f.IntVar(&cfg.Heads, "heads", cfg.Heads, "attention heads")
	f.IntVar(&cfg.Steps, "steps", cfg.Steps, "timed steps per variant, after one warm-up step")
	f.StringVar(&variants, "variants", "", "comma-separated subset of "+variantNames()+" (default all; the first is the baseline for ratios)")
	cmd.AddCommand(blocks)
	return cmd
}

func variantNames() string {
	names := make([]string, len(bench.Variants))
	for i, v := range bench.Variants {
		names[i] = v.Name
	}
	return strings.Join(names, ",")
}

func pickVariants(list string) ([]bench.Variant, error) {
	if list == "" {
		return bench.Variants, nil
	}
	var out []bench.Variant
	for _, name := range strings.Split(list, ",") {
		found := false
		for _, v := range bench.Variants {
			if strings.EqualFold(v.Name, strings.TrimSpace(name)) {
				out = append(out, v)
				found = true
			}
		}
		if !found {
			return nil, fmt.Errorf("unknown variant %q: choose from %s", name, variantNames())
		}
	}
	return out, nil
}
