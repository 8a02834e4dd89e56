package cli

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/plan"
)

// calibrationSteps is how many timed steps each mode runs in the autopilot's calibration (in two passes over the
// modes, each after a warm-up step).
const calibrationSteps = 6

// printAutoplan writes the autopilot's choice: per mode, the blocks that take it, what each such block saves and
// costs against plain (from the exact planner and the measured uniform steps), then the plan and its figures.
func printAutoplan(w io.Writer, p *plan.Autoplan, blocks int, budget int64, margin float64) error {
	fmt.Fprintf(w, "memory autopilot: budget %s less %.0f%% margin = %s; %d blocks\n", memory.FormatBytes(budget), 100*margin,
		memory.FormatBytes(p.Limit), blocks)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "mode\tblocks\tsaves per block\ttime per block\tall blocks: total\tall blocks: step\tmeasured range\t\n")
	plain := p.Costs[0]
	for i, c := range p.Costs {
		save := float64(plain.TotalBytes-c.TotalBytes) / float64(blocks)
		cost := (c.StepSeconds - plain.StepSeconds) / float64(blocks)
		rng := fmt.Sprintf("%.1f-%.1f ms", 1e3*c.StepMin, 1e3*c.StepMax)
		if i > 0 && c.StepSeconds == plain.StepSeconds {
			rng += " (overlaps plain's: a tie)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%+.2f ms\t%s\t%.1f ms\t%s\t\n", c.Mode, p.Counts[i], memory.FormatBytes(int64(save)), 1e3*cost,
			memory.FormatBytes(c.TotalBytes), 1e3*c.StepSeconds, rng)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if p.BatchSize > 0 {
		fmt.Fprintf(w, "micro-batch %d x %d accumulation steps\n", p.BatchSize, p.AccumSteps)
	}
	_, err := fmt.Fprintf(w, "plan: %s\n  total %s (exact plan: step peak + optimizer state; additive prediction %s), predicted step %s\n",
		p.Plan, memory.FormatBytes(p.PlannedBytes), memory.FormatBytes(p.PredictedBytes), time.Duration(p.PredictedSeconds*float64(time.Second)).Round(time.Microsecond))
	return err
}

// blocksOf returns the number of blocks an autopilot plan covers.
func blocksOf(p *plan.Autoplan) int {
	n := 0
	for _, c := range p.Counts {
		n += c
	}
	return n
}
