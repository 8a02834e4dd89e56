package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/memfit/memfit/engine"
)

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print memfit's version, its GoMLX version and the backends this binary can use",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			version, gomlx, goxla := "(devel)", "?", ""
			if info, ok := debug.ReadBuildInfo(); ok {
				if info.Main.Version != "" {
					version = info.Main.Version
				}
				for _, dep := range info.Deps {
					switch dep.Path {
					case "github.com/gomlx/gomlx":
						gomlx = dep.Version
					case "github.com/gomlx/go-xla":
						goxla = dep.Version
					}
				}
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "memfit %s\nGoMLX %s\n%s %s/%s\n", version, gomlx, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			backends := "go (pure Go, default)"
			if engine.XLAAvailable() {
				backends += ", xla (go-xla " + goxla + "; --backend xla:cuda finds a PJRT CUDA plugin or JAX's, xla:/abs/plugin.so loads one)"
				if inst, err := engine.FindJAXCUDA(); err == nil {
					backends += "\nJAX CUDA plugin: " + inst.Plugin
				}
			} else {
				backends += "; xla not built in (rebuild with -tags xla)"
			}
			fmt.Fprintf(out, "backends: %s\n", backends)
			return nil
		},
	}
}
