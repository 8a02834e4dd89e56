package cli

import (
	"fmt"
	"io"
	"time"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/plan"
)

// calibrationSteps is how many timed steps each mode runs in the autopilot's calibration (in two passes over the
// modes, each after a warm-up step).
const calibrationSteps = 6

// calibrationName is how a plan's step times are got, in words.
func calibrationName(c plan.Calibration) string {
	switch c {
	case plan.CalibrationNone:
		return "the cost model, no timing"
	case plan.CalibrationFull:
		return "the full calibration, the whole model"
	}
	return "the fast calibration, one and two blocks of the real width"
}

// printAutoplan writes the autopilot's choice: where its step times came from, per mode the blocks that take it,
// what each such block saves and costs against plain (from the exact planner and the step times), each block's
// mode, saved bytes and extra time, the plan and its figures, and the next-best plan that did not fit.
func printAutoplan(w io.Writer, p *plan.Autoplan, blocks int, budget int64, margin float64) error {
	cols := terminalColumns(w)
	line := func(format string, args ...any) { fmt.Fprintln(w, wrapText(fmt.Sprintf(format, args...), cols)) }
	line("memory autopilot: budget %s less %.0f%% margin = %s; %d blocks", memory.FormatBytes(budget), 100*margin,
		memory.FormatBytes(p.Limit), blocks)
	line("step times: %s", sourceLine(p))
	rows := [][]string{{"mode", "blocks", "saves per block", "time per block", "all blocks: total", "all blocks: step", "range"}}
	plain := p.Costs[0]
	for i, c := range p.Costs {
		save := float64(plain.TotalBytes-c.TotalBytes) / float64(blocks)
		cost := (c.StepSeconds - plain.StepSeconds) / float64(blocks)
		rng := "-"
		if c.StepMax > 0 {
			rng = fmt.Sprintf("%.1f-%.1f ms", 1e3*c.StepMin, 1e3*c.StepMax)
			if c.Mode == "approx-act" && c.StepSeconds == plain.StepSeconds {
				rng += " (overlaps plain's: a tie)"
			}
		}
		rows = append(rows, []string{c.Mode, fmt.Sprint(p.Counts[i]), memory.FormatBytes(int64(save)), fmt.Sprintf("%+.2f ms", 1e3*cost),
			memory.FormatBytes(c.TotalBytes), fmt.Sprintf("%.1f ms", 1e3*c.StepSeconds), rng})
	}
	if err := writeTable(w, rows, cols); err != nil {
		return err
	}
	fmt.Fprintf(w, "per block (the backward reaches block 0 last):\n")
	rows = [][]string{{"  blocks", "mode", "saves each", "extra time each"}}
	for i := 0; i < len(p.Blocks); {
		j := i
		for j < len(p.Blocks) && p.Blocks[j].Mode == p.Blocks[i].Mode {
			j++
		}
		b := p.Blocks[i]
		span := fmt.Sprint(i)
		if j-i > 1 {
			span = fmt.Sprintf("%d-%d", i, j-1)
		}
		rows = append(rows, []string{"  " + span, b.Mode, memory.FormatBytes(b.SavedBytes), fmt.Sprintf("%+.2f ms", 1e3*b.ExtraSeconds)})
		i = j
	}
	if err := writeTable(w, rows, cols); err != nil {
		return err
	}
	if p.BatchSize > 0 {
		fmt.Fprintf(w, "micro-batch %d x %d accumulation steps\n", p.BatchSize, p.AccumSteps)
	}
	share := ""
	if p.Source != plan.SourceFull {
		share = " (the blocks' share)"
	}
	fmt.Fprintf(w, "plan: %s\n", p.Plan)
	line("  total %s (exact plan: step peak + optimizer state; additive prediction %s), predicted step%s %s",
		memory.FormatBytes(p.PlannedBytes), memory.FormatBytes(p.PredictedBytes), share, seconds(p.PredictedSeconds))
	if n := p.NextBest; n != nil {
		line("next-best plan, did not fit: %s, total %s > %s, predicted step%s %s", n.Plan, memory.FormatBytes(n.TotalBytes),
			memory.FormatBytes(p.Limit), share, seconds(n.PredictedSeconds))
	} else {
		line("next-best plan: none faster was left out (this is the fastest plan)")
	}
	return nil
}

// sourceLine says where a plan's step times came from.
func sourceLine(p *plan.Autoplan) string {
	switch {
	case p.Source == plan.SourceCostModel && p.Profile != nil:
		return fmt.Sprintf("cost model for %s (%.3g FLOP/s, %.3g B/s elementwise; docs/autopilot.md): %s", p.Profile.Device, p.Profile.FLOPs, p.Profile.Bytes, p.Why)
	case p.Cached:
		return fmt.Sprintf("%s, read from the calibration cache", p.Source)
	case p.Calibration != nil:
		c := p.Calibration
		scaled := "the real shape"
		if c.Scale > 1.0001 {
			scaled = fmt.Sprintf("scaled x%.2f by the block's FLOPs to the real shape", c.Scale)
		}
		return fmt.Sprintf("%s: %v block(s) of the real width, %s, %d timed steps per mode (%s), %s planned; %.1f s",
			p.Source, c.Blocks, shapeWords(c.Shape), c.TimedSteps, scaled, memory.FormatBytes(c.Bytes), c.Seconds)
	}
	return p.Source
}

func shapeWords(in finetune.Shape) string {
	if in.Seq > 0 {
		return fmt.Sprintf("batch %d x %d", in.Batch, in.Seq)
	}
	return fmt.Sprintf("batch %d", in.Batch)
}

func seconds(s float64) time.Duration {
	return time.Duration(s * float64(time.Second)).Round(time.Microsecond)
}

// blocksOf returns the number of blocks an autopilot plan covers.
func blocksOf(p *plan.Autoplan) int {
	n := 0
	for _, c := range p.Counts {
		n += c
	}
	return n
}
