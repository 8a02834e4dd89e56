package cli

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/memfit/memfit/approxbp"
)

func newApproxBPCommand(_ *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "approxbp",
		Short: "Approximate-backpropagation activations (ReGELU2, ReSiLU2, k-bit variants)",
	}
	var act string
	var bits int
	fit := &cobra.Command{
		Use:   "fit",
		Short: "Fit k-bit ReLU-formed coefficients for GELU or SiLU and print them as JSON",
		Long: `Solves the Approx-BP objective: minimise the integral of (h(x) - sum_i a_i relu(x - c_i))^2 subject to
sum a = 1 and sum a*c = 0, for h = GELU or SiLU and 2^bits - 1 breakpoints. Prints one JSON object with the
coefficients, the objective and, for bits = 2, the published values and their objective for comparison.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var (
				coeffs    approxbp.Coefficients
				res       approxbp.FitResult
				err       error
				published approxbp.Coefficients
				h         func(float64) float64
				lo, hi    float64
			)
			switch act {
			case "gelu":
				coeffs, res, err = approxbp.FitGELU(bits)
				published, h, lo, hi = approxbp.ReGELU2Coefficients, approxbp.GELU64, -approxbp.GELURange, approxbp.GELURange
			case "silu":
				coeffs, res, err = approxbp.FitSiLU(bits)
				published, h, lo, hi = approxbp.ReSiLU2Coefficients, approxbp.SiLU64, -approxbp.SiLURange, approxbp.SiLURange
			default:
				return fmt.Errorf("--act must be gelu or silu, got %q", act)
			}
			if err != nil {
				return err
			}
			out := map[string]any{
				"name": coeffs.Name, "bits": coeffs.Bits, "a": coeffs.A, "c": coeffs.C,
				"levels": coeffs.Levels(), "objective": res.Objective, "iterations": res.Iterations,
			}
			if bits == published.Bits {
				out["published"] = map[string]any{"a": published.A, "c": published.C,
					"objective": approxbp.Objective(h, published, lo, hi)}
			}
			enc := json.NewEncoder(cmd.OutOrStdout())
			enc.SetIndent("", "  ")
			return enc.Encode(out)
		},
	}
	fit.Flags().StringVar(&act, "act", "gelu", "activation: gelu or silu")
	fit.Flags().IntVar(&bits, "bits", 2, "code bits per element, 1..4")
	cmd.AddCommand(fit)
	return cmd
}
