// Command finetune-peak is memfit's finetune command built against this module's patched Go backend
// (github.com/gomlx/compute with a buffer-pool counter), so that `finetune-peak bench blocks` reports peaks
// measured by the counter (memory.MethodPoolCounter) instead of the simulation's estimate. Pass a backend with
// parallelism=1 (--backend go:parallelism=1) for figures the simulation reproduces to the byte.
//
//	cd tools/peakmem && ./setup.sh && go run ./cmd/finetune-peak bench blocks --layers 2 --batch-size 32
package main

import (
	"os"

	"github.com/memfit/memfit/cli"
	_ "github.com/memfit/memfit/tools/peakmem/poolcounter"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
