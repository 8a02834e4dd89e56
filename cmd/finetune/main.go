// Command finetune is memfit's command-line tool. Run `finetune --help` for its commands.
package main

import (
	"os"

	"github.com/memfit/memfit/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
