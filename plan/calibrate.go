package plan

import (
	"fmt"
	"math"
	"runtime"
	"runtime/debug"
	"slices"
	"time"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/memory"
)

// Calibration is how the autopilot gets the modes' step times.
type Calibration string

const (
	// CalibrationFast times each mode on a model of the real width cut to one block (and plain on two, for the
	// block's own time by difference), with random weights made for that small model only (CalibrateFast, the
	// default): seconds, and never the whole model's memory.
	CalibrationFast Calibration = "fast"
	// CalibrationFull times each mode on the whole model (CalibrateModes): what the autopilot did first; the
	// benchmark compares the others with it.
	CalibrationFull Calibration = "full"
	// CalibrationNone times nothing: the cost model (CostModel) predicts the times from a device profile.
	CalibrationNone Calibration = "none"
)

// Sources of an Autoplan's step times (Autoplan.Source).
const (
	SourceFast      = "fast calibration"
	SourceFull      = "full calibration"
	SourceCostModel = "cost model"
)

// Defaults of the fast calibration: the largest forward FLOPs of the calibrated block (DefaultCalibFLOPs: about
// a llama-1b block at 512 tokens, a quarter of a second on the 2-core build VM), the memory it may take
// (DefaultCalibBytes, 1.5 GiB, also never more than half this machine's: llama-1b's one-block calibration, four
// trainers, peaked at 1.72 GiB resident with the planner and the Go runtime), and its timed steps per mode after
// the warm-up.
const (
	DefaultCalibFLOPs      = 60e9
	DefaultCalibBytes      = int64(3 << 29)
	DefaultFastCalibSteps  = 2
	fastCalibrationMaxCuts = 2
)

// CalibrationRun says what the fast calibration timed: the shape (the real one, or a smaller one whose times
// were scaled by Scale, the ratio of the block's forward FLOPs at the real shape to those at this one), the cut
// models' blocks, the timed steps per mode, the memory the largest cut model was planned to take (its step's
// total and its float32 random weights) and how long it all took.
type CalibrationRun struct {
	Shape      finetune.Shape `json:"shape"`
	Scale      float64        `json:"scale"`
	Blocks     []int          `json:"blocks"`
	TimedSteps int            `json:"timed_steps"`
	Bytes      int64          `json:"planned_bytes"`
	Seconds    float64        `json:"seconds"`
}

// calibrationShape returns the shape the fast calibration times a block at: in, or, when one block's forward
// FLOPs there exceed maxFLOPs, a smaller batch (and then, for a family with a sequence, a shorter sequence,
// halved down to 16 tokens) whose do not; and the ratio of the FLOPs at in to those at the shape returned.
func calibrationShape(model finetune.Model, in finetune.Shape, maxFLOPs float64) (finetune.Shape, float64, error) {
	full, err := finetune.BlockFLOPs(model, in)
	if err != nil {
		return in, 0, err
	}
	fam, _ := finetune.FamilyOf(model)
	cs := in
	flops := full
	for flops > maxFLOPs && cs.Batch > 1 {
		cs.Batch--
		flops, _ = finetune.BlockFLOPs(model, cs)
	}
	for flops > maxFLOPs && fam.Sequence && cs.Seq > 16 {
		cs.Seq = max(16, cs.Seq/2)
		flops, _ = finetune.BlockFLOPs(model, cs)
	}
	return cs, full / flops, nil
}

// The fast calibration's guard against timings a loaded machine made noisy: a mode whose block time by
// difference comes out below minBlockShare of plain's block time (no mode is that much faster than plain: each
// does at least plain's matrix products) is timed again, up to noisyAttempts times in all.
const (
	minBlockShare = 0.25
	noisyAttempts = 3
)

// stepSeconds is the time the fast calibration takes for a timed step of mode on a cut model of blocks blocks
// (measured: the step's own time; a test replaces it to play a loaded machine).
var stepSeconds = func(mode string, blocks int, measured float64) float64 { return measured }

// errCalibrationTooBig is returned by CalibrateFast when even the one-block model does not fit the memory the
// calibration may take; the autopilot then uses the cost model and says why.
type errCalibrationTooBig struct{ need, limit int64 }

func (e errCalibrationTooBig) Error() string {
	return fmt.Sprintf("the one-block calibration (a trainer per mode, each with its own weights) needs %s, more than the calibration may take here (%s)",
		memory.FormatBytes(e.need), memory.FormatBytes(e.limit))
}

// calibrationBytes is the memory a cut model takes to calibrate with the given number of trainers alive
// together: the exact planner's plain total at shape cs (one step runs at a time) and, for each trainer, its own
// parameters drawn in float32 (before QLoRA quantises them).
func calibrationBytes(o AutopilotOptions, cut finetune.Model, cs finetune.Shape, trainers int) (int64, error) {
	total, err := Total(o.Backend, cut, o.Config, cs, uniformPlan("plain", mustBlocks(cut)))
	if err != nil {
		return 0, err
	}
	var params int64
	for _, dims := range cut.Shapes() {
		n := int64(1)
		for _, d := range dims {
			n *= int64(d)
		}
		params += n
	}
	return total + int64(trainers)*4*params, nil
}

func mustBlocks(m finetune.Model) int {
	n, _ := finetune.BlockCount(m)
	return n
}

// CalibrateFast sets each mode's StepSeconds of costs (for o.Model's blocks at o.Shape) from timings of small
// models: o.Model's architecture cut to one block (finetune.CutModel: the real width, the parts outside the blocks
// made small) with random weights made for it alone, each mode on that block timed for one warm-up step and
// o.FastSteps (default DefaultFastCalibSteps) timed steps, and plain on two blocks likewise. A mode's extra time
// per block is its one-block step less plain's (the rest of the step is the same model); plain's own block time
// is the two-block step less the one-block step (or the one-block step itself when two blocks do not fit
// o.CalibBytes). The shape is o.Shape when one block's forward FLOPs there are at most o.CalibFLOPs, else a
// smaller one (calibrationShape) whose times are scaled by the FLOPs ratio. A mode's StepSeconds is then the
// blocks' share of the step, blocks x (plain's block time + its extra); its range is that of its timed steps.
// Each timed step is reported to o.Progress. When even the one-block model does not fit the memory the
// calibration may take (o.CalibBytes, and half this machine's), the error is an errCalibrationTooBig.
func CalibrateFast(o AutopilotOptions, costs []ModeCost) (CalibrationRun, error) {
	start := time.Now()
	blocks, err := finetune.BlockCount(o.Model)
	if err != nil {
		return CalibrationRun{}, err
	}
	maxFLOPs, limit, steps := o.CalibFLOPs, o.CalibBytes, o.FastSteps
	if maxFLOPs <= 0 {
		maxFLOPs = DefaultCalibFLOPs
	}
	if limit <= 0 {
		limit = DefaultCalibBytes
	}
	if machine, ok, err := memory.MachineBytes(); err == nil && ok {
		limit = min(limit, machine/2)
	}
	if steps <= 0 {
		steps = DefaultFastCalibSteps
	}
	cs, scale, err := calibrationShape(o.Model, o.Shape, maxFLOPs)
	if err != nil {
		return CalibrationRun{}, err
	}
	run := CalibrationRun{Shape: cs, Scale: scale, TimedSteps: steps}
	var cuts []finetune.Model
	for n := 1; n <= min(fastCalibrationMaxCuts, blocks); n++ {
		cut, err := finetune.CutModel(o.Model, n)
		if err != nil {
			return run, err
		}
		trainers := 1 // plain on two blocks
		if n == 1 {
			trainers = len(costs) // every mode on one block
		}
		need, err := calibrationBytes(o, cut, cs, trainers)
		if err != nil {
			return run, fmt.Errorf("planning the %d-block calibration model: %w", n, err)
		}
		if need > limit {
			if n == 1 {
				return run, errCalibrationTooBig{need: need, limit: limit}
			}
			break
		}
		cuts, run.Blocks, run.Bytes = append(cuts, cut), append(run.Blocks, n), max(run.Bytes, need)
	}
	// timed runs the uniform plan of each mode on the cut model of n blocks (a trainer per mode, each with random
	// weights of its own, alive together): a warm-up round (plain twice: the first steps of a process are slow), then steps
	// rounds over the modes, in alternate orders, so that a change of the machine's load falls on every mode
	// alike. It returns each mode's timed steps, sorted.
	timed := func(cut finetune.Model, n int, modes []string) ([][]float64, error) {
		batch := finetune.StepRandomBatch(cut, o.Config, cs, 1)
		trainers := make([]*finetune.Trainer, len(modes))
		defer func() {
			for _, tr := range trainers {
				if tr != nil {
					tr.Release()
				}
			}
		}()
		for i, mode := range modes {
			// Each trainer its own weights: trainers sharing a model's tensors measured slower steps for the
			// first ones made (llama-1b, one block: 1.5 s against 0.9 s for the same work).
			model, err := finetune.WithRandomWeights(cut, o.Config, 1)
			if err != nil {
				return nil, err
			}
			c := o.Config
			c.BlockPlan = uniformPlan(mode, n)
			c.BatchSize = cs.Batch
			if trainers[i], err = finetune.New(model, c, o.Backend); err != nil {
				return nil, fmt.Errorf("%s: %w", mode, err)
			}
		}
		out := make([][]float64, len(modes))
		step := func(i int, round string) error {
			st, err := trainers[i].TrainStep([]finetune.Batch{batch})
			if err != nil {
				return fmt.Errorf("%s: %w", modes[i], err)
			}
			sec := stepSeconds(modes[i], n, st.Seconds)
			if round != "warm-up" {
				out[i] = append(out[i], sec)
			}
			o.progress("fast calibration: %-15s on %d block(s), %s: %s %.3f s", modes[i], n, shapeString(cs), round, sec)
			return nil
		}
		if err := step(0, "warm-up"); err != nil {
			return nil, err
		}
		for r := 0; r <= steps; r++ {
			round := "warm-up"
			if r > 0 {
				round = fmt.Sprintf("step %d/%d", r, steps)
			}
			for k := range modes {
				i := k
				if r%2 == 0 {
					i = len(modes) - 1 - k
				}
				if err := step(i, round); err != nil {
					return nil, err
				}
			}
		}
		for i := range out {
			slices.Sort(out[i])
		}
		return out, nil
	}
	var modes []string
	for _, c := range costs {
		modes = append(modes, c.Mode)
	}
	// low is the lower median: with few steps on a loaded machine the faster steps are the better estimate.
	low := func(t []float64) float64 { return t[(len(t)-1)/2] }
	for attempt := 1; ; attempt++ {
		one, err := timed(cuts[0], 1, modes)
		if err != nil {
			return run, fmt.Errorf("fast calibration: %w", err)
		}
		blockPlain := low(one[0])
		if len(cuts) > 1 {
			runtime.GC()
			two, err := timed(cuts[1], 2, modes[:1])
			if err != nil {
				return run, fmt.Errorf("fast calibration on two blocks: %w", err)
			}
			// A difference under a tenth of the one-block step is noise of a loaded machine: keep the one-block step.
			if d := low(two[0]) - low(one[0]); d > 0.1*low(one[0]) {
				blockPlain = d
			}
		}
		// A mode's block time is plain's block time plus the mode's extra, a difference of two steps: under load
		// it can come out below any real block time, even negative (the step timed second ran on a quieter
		// machine). Such timings are measured again, up to noisyAttempts times, then bounded below by
		// minBlockShare of plain's block time, and the progress says so.
		base := scale * blockPlain
		p := low(one[0])
		floor := minBlockShare * base
		worst, worstMode := math.Inf(1), ""
		for i, t := range one {
			if b := base + scale*(t[0]-p); b < worst {
				worst, worstMode = b, modes[i]
			}
		}
		noisy := worst < floor
		if noisy && attempt < noisyAttempts {
			o.progress("fast calibration: noisy timings (%s's block %.2f ms against plain's %.2f ms: the machine's load changed while timing): timing again (%d of %d)",
				worstMode, 1e3*worst, 1e3*base, attempt+1, noisyAttempts)
			continue
		}
		if noisy {
			o.progress("fast calibration: the timings stayed noisy after %d tries (%s's block %.2f ms against plain's %.2f ms): each mode's block time is taken as at least %.0f%% of plain's; the plan may not be the fastest (time it again on a quiet machine)",
				noisyAttempts, worstMode, 1e3*worst, 1e3*base, 100*minBlockShare)
		}
		block := func(x float64) float64 { return float64(blocks) * max(floor, base+scale*(x-p)) }
		for i := range costs {
			t := one[i]
			costs[i].StepSeconds, costs[i].StepMin, costs[i].StepMax = block(low(t)), block(t[0]), block(t[len(t)-1])
		}
		break
	}
	cuts = nil
	runtime.GC()
	debug.FreeOSMemory() // the cut models' weights go back before the plan is searched
	run.Seconds = time.Since(start).Seconds()
	return run, nil
}

// shapeString writes a shape as "batch 2 x 512" (with a sequence) or "batch 8".
func shapeString(in finetune.Shape) string {
	if in.Seq > 0 {
		return fmt.Sprintf("batch %d x %d", in.Batch, in.Seq)
	}
	return fmt.Sprintf("batch %d", in.Batch)
}
