package cli

import (
	"strconv"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// sizeLimits bounds the integer flags that size tensors or loops, in every command that has them: a typo such as
// --batch-size 1000000000 or --hidden 1000000 would otherwise allocate until the machine gives out, and 0 or a
// negative number divide by zero or make no sense. Commands check finer limits themselves (the model's positions,
// the dataset's size, ...). The keys are canonical flag names: a deprecated spelling sets its canonical flag,
// which is checked.
var sizeLimits = map[string]struct{ lo, hi int64 }{
	"batch-size": {1, 1 << 20}, "vit-batch-size": {1, 1 << 20}, "llama-batch-size": {1, 1 << 20},
	"max-batch-size": {1, 1 << 20}, "seq-len": {1, 1 << 20}, "llama-seq-len": {1, 1 << 20}, "max-seq-len": {1, 1 << 20},
	"hidden": {1, 1 << 16}, "mlp": {1, 1 << 18}, "heads": {1, 1 << 12}, "layers": {1, 1 << 12}, "steps": {1, 1 << 40},
	"warmup": {0, 1 << 40}, "warmup-steps": {0, 1 << 40}, "num-labels": {0, 1_000_000}, "lora-r": {0, 1 << 16},
	"train-per-class": {1, 1 << 30}, "max-new-tokens": {1, 1 << 20},
}

// ownRange is the annotation of a flag in sizeLimits whose command checks its range itself, with a message that
// names the real bound (train's --seq-len: the model's positions).
const ownRange = "memfit-own-range"

// checksOwnRange exempts the flag name of f from the sizeLimits check: the command checks it.
func checksOwnRange(f *pflag.FlagSet, name string) {
	_ = f.SetAnnotation(name, ownRange, []string{"true"})
}

// checkSizeFlags gives every command of the tree under root a pre-run check of the flags in sizeLimits that the
// user set (one line naming the flag and its range), after a note for each deprecated flag spelling given.
func checkSizeFlags(root *cobra.Command) {
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if c.RunE == nil && c.Run == nil {
			return
		}
		prev := c.PreRunE
		c.PreRunE = func(cmd *cobra.Command, args []string) error {
			noteAliases(cmd)
			var bad error
			cmd.Flags().Visit(func(f *pflag.Flag) {
				lim, ok := sizeLimits[f.Name]
				if !ok || bad != nil || len(f.Annotations[ownRange]) > 0 {
					return
				}
				if f.Value.Type() != "int" && f.Value.Type() != "int64" && f.Value.Type() != "uint64" {
					return
				}
				v, err := strconv.ParseInt(f.Value.String(), 10, 64)
				if err != nil || v < lim.lo || v > lim.hi {
					bad = usagef("--%s %s: give %d to %d", f.Name, f.Value.String(), lim.lo, lim.hi)
				}
			})
			if bad != nil {
				return bad
			}
			if prev != nil {
				return prev(cmd, args)
			}
			return nil
		}
	}
	walk(root)
}
