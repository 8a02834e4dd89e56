package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/memfit/memfit/bench"
	"github.com/memfit/memfit/memory"
)

func newBenchMemoryModesCommand() *cobra.Command {
	var jsonOut, mdOut, checksOut string
	var missing, overwrite bool
	cmd := &cobra.Command{
		Use:   "memory-modes DIR",
		Short: "Issue 35's GPU table: each memory mode's device, compiled and planned peak (bench/gpu/memory_modes.sh writes DIR)",
		Long: `Reads the result files bench/gpu/memory_modes.sh writes into DIR (finetune memory --json on XLA,
compile__MODEL__METHOD__ties{0,1}[__L{n}].json; finetune bench step, step__MODEL__METHOD__MODE.json;
bench/pytorch/peft_compare.py, pytorch__MODEL__METHOD__MODE.json), and prints one row per model x method x mode
with the device's measured peak, XLA's compiled peak, the pure-Go planner's total and the step time, the
before/after rows of the ordering ties (MEMFIT_XLA_TIES) on cut models, and the targets of issue 35 checked on
them (PASS, FAIL, or SKIP where a figure is missing). --json writes the rows (memory-modes.json), --checks the
checks as tab-separated STATUS, NAME, DETAIL lines; --missing prints only the "MODEL METHOD MODE" of the rows
that miss a memory target (the ones to dump and digest: finetune bench xla-digest).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ins := inputs{}.add("DIR", args[0], "compile__*.json", "step__*.json", "pytorch__*.json")
			for _, o := range []struct{ flag, path string }{{"--json", jsonOut}, {"--markdown", mdOut}, {"--checks", checksOut}} {
				if err := outputFile(o.flag, o.path, ins, overwrite, true); err != nil {
					return err
				}
			}
			m, err := bench.ReadMemoryModes(args[0])
			if err != nil {
				return usageError{err}
			}
			out := cmd.OutOrStdout()
			if missing {
				for _, line := range m.Missing() {
					fmt.Fprintln(out, line)
				}
			} else if err := m.WriteMarkdown(out); err != nil {
				return err
			}
			if jsonOut != "" {
				if err := writeResult(jsonOut, m.Rows); err != nil {
					return err
				}
			}
			if mdOut != "" {
				var b strings.Builder
				if err := m.WriteMarkdown(&b); err != nil {
					return err
				}
				if err := writeFileAtomic(mdOut, []byte(b.String())); err != nil {
					return err
				}
			}
			if checksOut != "" {
				var b strings.Builder
				for _, c := range m.Checks {
					fmt.Fprintf(&b, "%s\t%s\t%s\n", c.Status, c.Name, c.Detail)
				}
				return writeFileAtomic(checksOut, []byte(b.String()))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&jsonOut, "json", "", "write the rows to this JSON file (memory-modes.json)")
	f.StringVar(&mdOut, "markdown", "", "write the tables to this markdown file")
	f.StringVar(&checksOut, "checks", "", "write the checks to this file, one STATUS<TAB>NAME<TAB>DETAIL line each")
	f.BoolVar(&missing, "missing", false, `print only the "MODEL METHOD MODE" of the rows that miss a memory target`)
	f.BoolVar(&overwrite, "overwrite", false, "replace existing output files")
	return cmd
}

func newBenchXLADigestCommand() *cobra.Command {
	var module, jsonOut string
	var top int
	var overwrite bool
	cmd := &cobra.Command{
		Use:   "xla-digest DUMP_DIR",
		Short: "The largest buffers live at the peak of an XLA program, by the op that made them (from an XLA dump)",
		Long: `Reads an XLA dump folder (run any memfit command with
XLA_FLAGS="--xla_dump_to=DUMP_DIR --xla_dump_hlo_as_text") and prints, for its largest program (or the one whose
file name contains --module), the peak of the buffer assignment's live ranges and the values live there, largest
first, each with the op that made it in the optimised HLO (a fusion's kind, a custom call's target): what a memory
mode that does not lower XLA's peak leaves alive (docs/memory-saving.md, "Order is data").`,
		Example: `  XLA_FLAGS="--xla_dump_to=/tmp/dump --xla_dump_hlo_as_text" finetune --backend xla:cuda memory --model llama-1b \
    --lora-targets all-linear --batch-size 2 --seq-len 512 --variants grad-ckpt
  finetune bench xla-digest /tmp/dump --module train-step --top 15`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := outputFile("--json", jsonOut, inputs{}.add("DUMP_DIR", args[0], "*.txt"), overwrite, true); err != nil {
				return err
			}
			d, err := memory.XLADumpDigest(args[0], module, top)
			if err != nil {
				return usageError{err}
			}
			if err := d.WriteText(cmd.OutOrStdout()); err != nil {
				return err
			}
			if jsonOut != "" {
				return writeResult(jsonOut, d)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&module, "module", "", "digest the largest program whose file name contains this (default: the largest)")
	f.IntVar(&top, "top", 20, "values and op groups to list")
	f.StringVar(&jsonOut, "json", "", "also write the digest to this JSON file")
	f.BoolVar(&overwrite, "overwrite", false, "replace an existing --json file")
	return cmd
}
