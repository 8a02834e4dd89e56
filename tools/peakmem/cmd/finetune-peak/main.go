// Command finetune-peak is memfit's finetune command built against the patched GoMLX of this module, so that
// `finetune-peak bench blocks` reports peaks measured by the simplego buffer-pool counter
// (memory.MethodPoolCounter) instead of the simulation's estimate.
//
//	cd tools/peakmem && ./setup.sh && go run ./cmd/finetune-peak bench blocks --layers 2 --batch 32
package main

import (
	"os"

	"github.com/memfit/memfit/cli"
	_ "github.com/memfit/memfit/tools/peakmem/poolcounter"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
