// Package cli builds the finetune command tree. It holds flags and printing only: every command is a few lines
// over a library call a Go user could make directly.
package cli

import (
	"errors"
	"fmt"
	_ "github.com/memfit/memfit/family/all" // the shipped model families register themselves
	"io"
	"os"
	"runtime/debug"
	"strings"

	"github.com/gomlx/compute"
	"github.com/spf13/cobra"

	"github.com/memfit/memfit/engine"
)

// Options are the flags shared by every command.
type Options struct {
	// Backend is the --backend flag: empty means $MEMFIT_BACKEND, then the pure-Go default.
	Backend string
	// Debug is the --debug flag: whole error messages with stack traces.
	Debug bool
}

// NewBackend creates the backend chosen by the --backend flag, $MEMFIT_BACKEND or the default.
func (o *Options) NewBackend() (compute.Backend, error) {
	return engine.NewBackend(engine.ChooseSpec(o.Backend))
}

// NewRoot returns the finetune root command.
func NewRoot() *cobra.Command {
	opts := &Options{}
	root := &cobra.Command{
		Use:   "finetune",
		Short: "memfit: memory-saving fine-tuning of ViT and LLaMA models in Go",
		Long: `finetune trains and measures transformer models with memfit's memory-saving backpropagation:
ReGELU2/ReSiLU2 (exact activation forward, 2-bit backward), MS-LN/MS-RMSNorm (norm affine folded into the next
linear layer) and int8 activation storage.

The backend is the pure-Go one by default; --backend xla:<plugin> (or MEMFIT_BACKEND) selects XLA/PJRT in builds
made with -tags xla.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().BoolVar(&opts.Debug, "debug", false, "show whole error messages and stack traces (same as MEMFIT_DEBUG=1)")
	root.PersistentPreRun = func(cmd *cobra.Command, _ []string) {
		if opts.Debug {
			os.Setenv("MEMFIT_DEBUG", "1")
		}
	}
	// After a long command that succeeded (so that an error stays one line), a build without the SIMD kernels
	// says how to get them.
	root.PersistentPostRun = func(cmd *cobra.Command, _ []string) {
		if longCommand(cmd) {
			if advice := engine.SIMDAdvice(); advice != "" {
				w := cmd.ErrOrStderr()
				fmt.Fprintln(w, wrapText(advice, terminalColumns(w))) // on a terminal, as wide as it is
			}
		}
	}
	root.PersistentFlags().StringVar(&opts.Backend, "backend", "",
		`"go" (pure Go, default) or "xla:<plugin name or absolute .so path>"; default $`+engine.BackendEnv)
	root.AddCommand(newBenchCommand(opts), newApproxBPCommand(opts), newInitCommand(opts), newLogitsCommand(opts),
		newTrainCommand(opts), newExportCommand(opts), newMemoryCommand(opts),
		newPretrainCommand(opts), newDownloadCommand(), newVersionCommand(), newDemoCommand(opts), newTokenizeCommand(), newEvalCommand(opts), newGenerateCommand(opts))
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	checkSizeFlags(root)
	refuseUnknownSubcommands(root)
	return root
}

// longCommand reports whether cmd is one of the commands that train or time models (train, demo, bench ...,
// pretrain, eval ...), where a build without the SIMD matmul kernels is worth a one-line note.
func longCommand(cmd *cobra.Command) bool {
	for c := cmd; c != nil; c = c.Parent() {
		switch c.Name() {
		case "train", "demo", "bench", "pretrain", "eval", "generate":
			return c.Parent() != nil && c.Parent().Parent() == nil
		}
	}
	return false
}

// Exit codes of Main.
const (
	ExitOK      = 0 // success
	ExitFailure = 1 // the work failed (bad files, a diverging run, ...)
	ExitUsage   = 2 // the command was called wrongly (unknown flag, contradictory or invalid settings)
	// ExitInternal is an internal error (a panic caught by Main: a bug).
	ExitInternal = 70
)

// Main runs the finetune command with args and returns the process exit code. Errors are printed as one line.
func Main(args []string, stdout, stderr io.Writer) (code int) {
	// The last line of defence: a panic anywhere below is an internal error, reported as one line (the stack with
	// MEMFIT_DEBUG=1), never a crash dump.
	defer func() {
		if r := recover(); r != nil {
			if os.Getenv("MEMFIT_DEBUG") != "" {
				fmt.Fprintf(stderr, "%s\n", debug.Stack())
			}
			msg := strings.SplitN(fmt.Sprint(r), "\n", 2)[0]
			fmt.Fprintf(stderr, "finetune: internal error: %s (a bug: please report it with the command; MEMFIT_DEBUG=1 prints the stack)\n", msg)
			code = ExitInternal
		}
	}()
	root := NewRoot()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.Execute()
	if err == nil {
		return ExitOK
	}
	msg := err.Error()
	if os.Getenv("MEMFIT_DEBUG") == "" {
		msg = strings.SplitN(msg, "\n", 2)[0]
	}
	fmt.Fprintf(stderr, "finetune: %s\n", msg)
	var ee exitError
	if errors.As(err, &ee) {
		return ee.code
	}
	var ue usageError
	if errors.As(err, &ue) || strings.HasPrefix(err.Error(), "unknown command") || strings.HasPrefix(err.Error(), "unknown flag") {
		return ExitUsage
	}
	return ExitFailure
}

// exitError is an error with its own exit code (an interrupted run: 130 for SIGINT, 143 for SIGTERM).
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string { return e.err.Error() }
func (e exitError) Unwrap() error { return e.err }

// refuseUnknownSubcommands makes a command group (bench, eval, pretrain, approxbp) answer an unknown subcommand
// with an error, as the top level does, instead of printing its help and exiting 0.
func refuseUnknownSubcommands(root *cobra.Command) {
	for _, c := range root.Commands() {
		if !c.HasSubCommands() || c.RunE != nil || c.Run != nil {
			continue
		}
		c.Args = cobra.ArbitraryArgs
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usagef("unknown command %q for \"finetune %s\" (run finetune %s --help)", args[0], cmd.Name(), cmd.Name())
			}
			return cmd.Help()
		}
	}
}
