// Command finetune is memfit's command-line tool. Run `finetune --help` for its commands.
package main

import (
	"os"

	"github.com/memfit/memfit/cli"
	"github.com/memfit/memfit/engine"
)

func main() {
	// SIMD builds restart themselves once with GODEBUG=cpu.fma=off (see engine.FMAWorkaround: Go's math.Exp is
	// about 100x slower after GoMLX's AVX kernels otherwise).
	engine.ReexecWithFMAWorkaround()
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
