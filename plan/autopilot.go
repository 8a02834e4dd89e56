package plan

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/readfile"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/preference"
	"github.com/memfit/memfit/safetensors"
)

// AutopilotModes are the block modes the memory autopilot chooses among for each transformer block (MS-norm is
// model-wide and free: it is the config's own setting). approx-act trades no time for memory, Mesa a little
// quantisation work, gradient checkpointing a recomputation of the block.
var AutopilotModes = []string{"plain", "approx-act", "approx-act+mesa", "grad-ckpt"}

// ModeCost is what one mode costs when every block takes it: the exact planner's total (the step's peak plus the
// optimizer state, PlanStep) and the step time measured on the backend (CalibrateModes).
type ModeCost struct {
	Mode       string `json:"mode"`
	TotalBytes int64  `json:"total_bytes"`
	// SavedBytes are the step's saved activations (the exact planner's): the cost model's measure of the
	// elementwise work a mode adds.
	SavedBytes  int64   `json:"saved_activation_bytes"`
	StepSeconds float64 `json:"step_seconds"`
	// StepMin and StepMax are the range of the timed calibration steps (StepSeconds is their median).
	StepMin float64 `json:"step_seconds_min,omitempty"`
	StepMax float64 `json:"step_seconds_max,omitempty"`
}

// settleTies returns costs with the step time of approx-act set to plain's when their calibration ranges
// overlap: a difference within the calibration's own spread is no evidence that a mode is slower or faster, and
// the search then prefers, among plans of equal predicted time, the one that keeps least. (ReGELU2/ReSiLU2 cost
// about nothing on a GPU; on a busy CPU their measured difference to plain is often noise of either sign.) Mesa
// and gradient checkpointing do work of their own (quantisation, a forward recomputed): an overlap of their
// ranges with plain's is the noise of a loaded machine, and taking them as free made the fast calibration on
// a loaded 2-core VM checkpoint every block of llama-1b at 95% of plain's memory.
func settleTies(costs []ModeCost) []ModeCost {
	out := slices.Clone(costs)
	p := out[0]
	for i := 1; i < len(out); i++ {
		c := out[i]
		if c.Mode == "approx-act" && p.StepMax > 0 && c.StepMax > 0 && c.StepMin <= p.StepMax && p.StepMin <= c.StepMax {
			out[i].StepSeconds = p.StepSeconds
		}
	}
	return out
}

// Autoplan is the autopilot's choice for a budget.
type Autoplan struct {
	// Plan is the chosen per-block plan (Config.BlockPlan).
	Plan string `json:"block_plan"`
	// Counts are how many blocks take each mode of Costs.
	Counts []int `json:"counts"`
	// Costs are the modes' measured uniform figures the choice was made from.
	Costs []ModeCost `json:"costs"`
	// Limit is the budget less the margin: what the plan's total must not exceed.
	Limit int64 `json:"limit_bytes"`
	// PredictedBytes and PredictedSeconds are the additive model's figures for the plan; PlannedBytes is the exact
	// planner's total of the plan itself (what was checked against Limit).
	PredictedBytes   int64   `json:"predicted_total_bytes"`
	PlannedBytes     int64   `json:"planned_total_bytes"`
	PredictedSeconds float64 `json:"predicted_step_seconds"`
	// BatchSize and AccumSteps are the micro-batch and accumulation the plan is for (AutopilotBatch may change
	// them, keeping their product, the effective batch).
	BatchSize  int `json:"batch_size"`
	AccumSteps int `json:"accum_steps"`
	// Source says where the step times came from: SourceFast, SourceFull or SourceCostModel; Cached that they
	// were read from the calibration cache (measured by an earlier plan of the same step); Why, for the cost
	// model, why no timing was made.
	Source string `json:"source"`
	Cached bool   `json:"cached,omitempty"`
	Why    string `json:"why,omitempty"`
	// Calibration is what the fast calibration timed (nil for the others and from the cache); Profile the
	// device the cost model planned for (nil for a calibration).
	Calibration *CalibrationRun `json:"calibration,omitempty"`
	Profile     *DeviceProfile  `json:"device_profile,omitempty"`
	// Blocks are the plan's blocks in order: each one's mode, the bytes it saves against plain and the time it
	// adds (the additive model's per-block figures).
	Blocks []BlockChoice `json:"blocks"`
	// NextBest is the next-best plan that did not fit: of the plans predicted to run faster than the chosen
	// one, the slowest (the closest to it), with its exact total (nil when no faster plan was left out).
	NextBest *PlanTotal `json:"next_best_not_fitting,omitempty"`
	// Checked is how many mixed plans the exact planner checked.
	Checked int `json:"checked_plans"`
}

// BlockChoice is one block of a plan: its index, mode, the bytes it saves against plain and the seconds it adds
// to the step (negative: faster).
type BlockChoice struct {
	Block        int     `json:"block"`
	Mode         string  `json:"mode"`
	SavedBytes   int64   `json:"saved_bytes"`
	ExtraSeconds float64 `json:"extra_seconds"`
}

// PlanTotal is a plan with its exact total and predicted step time.
type PlanTotal struct {
	Plan             string  `json:"block_plan"`
	TotalBytes       int64   `json:"total_bytes"`
	PredictedSeconds float64 `json:"predicted_step_seconds"`
}

// ErrNoPlanFits is wrapped by the autopilot's error when no per-block plan fits the budget (the message names the
// smallest total reachable and what to change).
var ErrNoPlanFits = errors.New("no per-block plan fits")

// verifySlack and verifyTries bound the exact checks of ChooseBlockPlan: a mixed plan's exact total differs from
// the additive prediction (the step's peak depends on which blocks take which mode, see planOf), so candidates
// predicted up to verifySlack over the limit are checked too, at most verifyTries of them, and as many of the
// candidates predicted to fit (two separate allowances: the faster candidates just over the limit must not use
// up the checks of those predicted to fit; measured on llama-1b at 80% of plain, 48 checks of candidates
// predicted over the limit left only the uniform plans). Uniform plans need no check and are always considered.
const (
	verifySlack = 0.10
	verifyTries = 48
)

// candidate is one count vector of the search with its additive figures.
type candidate struct {
	counts  []int
	bytes   float64
	seconds float64
}

// ChooseBlockPlan picks the per-block plan of the given number of blocks with the lowest step time whose total
// fits limit. The model is additive over blocks: a block in mode o saves (T_plain - T_o)/blocks bytes and costs
// (s_o - s_plain)/blocks seconds, T and s from costs (every block in one mode; costs[0] must be plain). The blocks
// of one model are identical, so a plan is fixed, for both figures, by how many blocks take each mode; the search
// enumerates every such count vector (C(blocks+k-1, k-1) of them: 2,925 for 24 blocks and 4 modes), so its
// choice is the optimum of that model, not a heuristic. Candidates are then taken in order of predicted time
// and each is checked with verify (the exact planner on the plan itself; those predicted up to verifySlack over
// the limit too, since a mixed plan's exact peak differs from the prediction both ways); the first whose exact
// total fits is returned. When none fits, the error names the smallest total reachable (exact) and what to change.
func ChooseBlockPlan(costs []ModeCost, blocks int, limit int64, verify func(plan string) (int64, error)) (*Autoplan, error) {
	if len(costs) == 0 || costs[0].Mode != "plain" || blocks <= 0 {
		return nil, fmt.Errorf("autopilot: the costs must start with plain, for a model with blocks")
	}
	k := len(costs)
	saving := make([]float64, k)
	slower := make([]float64, k)
	for i, c := range costs {
		saving[i] = float64(costs[0].TotalBytes-c.TotalBytes) / float64(blocks)
		slower[i] = (c.StepSeconds - costs[0].StepSeconds) / float64(blocks)
	}
	var all []candidate
	counts := make([]int, k)
	var walk func(i, left int)
	walk = func(i, left int) {
		if i == k-1 {
			counts[i] = left
			c := candidate{counts: slices.Clone(counts), bytes: float64(costs[0].TotalBytes), seconds: costs[0].StepSeconds}
			for j, n := range counts {
				c.bytes -= float64(n) * saving[j]
				c.seconds += float64(n) * slower[j]
			}
			all = append(all, c)
			return
		}
		for n := 0; n <= left; n++ {
			counts[i] = n
			walk(i+1, left-n)
		}
	}
	walk(0, blocks)
	sort.SliceStable(all, func(a, b int) bool {
		if all[a].seconds != all[b].seconds {
			return all[a].seconds < all[b].seconds
		}
		return all[a].bytes < all[b].bytes
	})
	triedOver, triedFit := 0, 0
	var rejected *candidate // the last candidate that did not fit, faster than every later one
	for _, c := range all {
		uniform := slices.Contains(c.counts, blocks)
		over := c.bytes > float64(limit)
		switch {
		case c.bytes > float64(limit)*(1+verifySlack):
			rejected = &c
			continue
		case uniform:
		case over && triedOver >= verifyTries, !over && triedFit >= verifyTries:
			continue
		}
		plan := planOf(costs, c.counts)
		exact := int64(math.Round(c.bytes)) // a uniform plan's prediction is its exact total
		if !uniform {
			var err error
			if exact, err = verify(plan); err != nil {
				return nil, err
			}
			if over {
				triedOver++
			} else {
				triedFit++
			}
		}
		if exact <= limit {
			p := &Autoplan{Plan: plan, Counts: c.counts, Costs: costs, Limit: limit, PredictedBytes: int64(math.Round(c.bytes)),
				PlannedBytes: exact, PredictedSeconds: c.seconds, Blocks: blockChoices(costs, c.counts, saving, slower)}
			if rejected != nil && rejected.seconds < c.seconds {
				next := planOf(costs, rejected.counts)
				total := int64(math.Round(rejected.bytes))
				if !slices.Contains(rejected.counts, blocks) {
					var err error
					if total, err = verify(next); err != nil {
						return nil, err
					}
				}
				p.NextBest = &PlanTotal{Plan: next, TotalBytes: total, PredictedSeconds: rejected.seconds}
			}
			return p, nil
		}
		rejected = &c
	}
	smallest := all[0]
	for _, c := range all {
		if c.bytes < smallest.bytes {
			smallest = c
		}
	}
	plan := planOf(costs, smallest.counts)
	exact, err := verify(plan)
	if err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("%w %s: the smallest total reachable is %s (%s); lower --batch-size or the sequence length, or use qlora or bfloat16",
		ErrNoPlanFits, memory.FormatBytes(limit), memory.FormatBytes(exact), plan)
}

// planOf writes the plan giving counts[i] blocks mode costs[i].Mode. The blocks that keep least (the modes in
// order of increasing uniform total, gradient checkpointing first) come first: the backward reaches the first
// blocks last, so a recomputed block rebuilds its activations when the later blocks' saved activations have
// been freed, instead of on top of them. Which blocks take a mode changes nothing in the additive model (the
// saved bytes are the same) but does change the step's peak, which the exact planner checks.
func planOf(costs []ModeCost, counts []int) string {
	var parts []string
	for _, i := range blockOrder(costs) {
		if counts[i] > 0 {
			parts = append(parts, fmt.Sprintf("%s*%d", costs[i].Mode, counts[i]))
		}
	}
	return strings.Join(parts, ",")
}

// blockOrder is the order of the modes of costs along the blocks of a plan: increasing uniform total, gradient
// checkpointing first (planOf says why).
func blockOrder(costs []ModeCost) []int {
	order := make([]int, len(costs))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return costs[order[a]].TotalBytes < costs[order[b]].TotalBytes })
	return order
}

// blockChoices lists the blocks of the plan of counts in planOf's order, each with its mode's saving and extra
// time per block.
func blockChoices(costs []ModeCost, counts []int, saving, slower []float64) []BlockChoice {
	var out []BlockChoice
	for _, i := range blockOrder(costs) {
		for range counts[i] {
			out = append(out, BlockChoice{Block: len(out), Mode: costs[i].Mode, SavedBytes: int64(math.Round(saving[i])), ExtraSeconds: slower[i]})
		}
	}
	return out
}

// uniformPlan is the plan giving every one of blocks the mode.
func uniformPlan(mode string, blocks int) string { return fmt.Sprintf("%s*%d", mode, blocks) }

// ModeCosts returns the exact planner's total of each mode on every block, for model at the batch shape in;
// cfg must have no per-block plan nor approx_act, grad_ckpt or mesa (the modes set them). StepSeconds is left 0.
func ModeCosts(backend compute.Backend, model finetune.Model, cfg finetune.Config, in finetune.Shape, modes []string) ([]ModeCost, error) {
	blocks, err := finetune.BlockCount(model)
	if err != nil {
		return nil, err
	}
	var out []ModeCost
	for _, mode := range modes {
		total, err := planStep(backend, model, cfg, in, uniformPlan(mode, blocks))
		if err != nil {
			return nil, fmt.Errorf("planning %s: %w", mode, err)
		}
		out = append(out, ModeCost{Mode: mode, TotalBytes: total.TotalBytes, SavedBytes: total.SavedActivationBytes})
	}
	return out, nil
}

// Total is the exact planner's total (step peak + optimizer state) of cfg with the per-block plan on model.
func Total(backend compute.Backend, model finetune.Model, cfg finetune.Config, in finetune.Shape, plan string) (int64, error) {
	mv, err := planStep(backend, model, cfg, in, plan)
	return mv.TotalBytes, err
}

// planStep is the exact planner's figures of cfg with the per-block plan on model.
func planStep(backend compute.Backend, model finetune.Model, cfg finetune.Config, in finetune.Shape, plan string) (StepMemory, error) {
	if bp, ok := model.(finetune.PerBlock); ok {
		saved, _ := bp.BlockModes()
		defer bp.SetBlockModes(saved) // the model keeps its own options
	}
	c := cfg
	c.BlockPlan = plan
	if err := finetune.ApplyBlockPlan(model, c); err != nil {
		return StepMemory{}, err
	}
	return Step(backend, model, finetune.ParamShapes(model, c), c, in)
}

// CalibrateModes measures the step time of each mode of costs on every block: a trainer of o.Config with that
// uniform plan on o.Model runs o.Batch on o.Backend for one warm-up step (compilation) and then o.CalibSteps
// timed steps, in two passes over the modes
// in opposite orders (so a drift of the machine's speed during the calibration falls on every mode alike); the
// median of each mode's timed steps is kept, with their range. One trainer exists at a time. The model's own
// per-block options are restored afterwards.
func CalibrateModes(o AutopilotOptions, costs []ModeCost) error {
	backend, model, cfg, batch, steps := o.Backend, o.Model, o.Config, o.Batch, o.CalibSteps
	blocks, err := finetune.BlockCount(model)
	if err != nil {
		return err
	}
	saved, _ := model.(finetune.PerBlock).BlockModes()
	defer model.(finetune.PerBlock).SetBlockModes(saved)
	times := make([][]float64, len(costs))
	perPass := max(1, (steps+1)/2)
	for pass := 0; pass < 2; pass++ {
		for k := range costs {
			i := k
			if pass == 1 {
				i = len(costs) - 1 - k
			}
			c := cfg
			c.BlockPlan = uniformPlan(costs[i].Mode, blocks)
			tr, err := finetune.New(model, c, backend)
			if err != nil {
				return fmt.Errorf("calibrating %s: %w", costs[i].Mode, err)
			}
			for s := 0; s <= perPass; s++ {
				st, err := tr.TrainStep([]finetune.Batch{batch})
				if err != nil {
					return fmt.Errorf("calibrating %s: %w", costs[i].Mode, err)
				}
				what := "warm-up, compiles"
				if s > 0 {
					times[i] = append(times[i], st.Seconds)
					what = "timed"
				}
				o.progress("full calibration: %-15s on %d blocks, pass %d/2: step %d/%d (%s) %.3f s", costs[i].Mode, blocks, pass+1, s+1, perPass+1, what, st.Seconds)
			}
		}
	}
	for i := range costs {
		slices.Sort(times[i])
		costs[i].StepSeconds, costs[i].StepMin, costs[i].StepMax = times[i][len(times[i])/2], times[i][0], times[i][len(times[i])-1]
	}
	return nil
}

// BlockModesOf returns the modes of plan for model (ParseBlockPlan with its block count).
func BlockModesOf(model finetune.Model, plan string) ([]models.BlockMode, error) {
	n, err := finetune.BlockCount(model)
	if err != nil {
		return nil, err
	}
	return models.ParseBlockPlan(plan, n)
}

// CheckAutopilot checks what a --budget plan needs of the config and the margin, before any model is loaded or
// mode timed: approx_act, grad_ckpt, mesa and block_plan left to the autopilot (from flags and the config file
// alike) and a margin in [0, 1). Autopilot and AutopilotBatch check it too.
func CheckAutopilot(cfg finetune.Config, margin float64) error {
	var set []string
	if cfg.ApproxAct {
		set = append(set, "--approx-act")
	}
	if cfg.GradCkpt {
		set = append(set, "--grad-ckpt")
	}
	if len(cfg.Mesa) > 0 {
		set = append(set, "--mesa")
	}
	if cfg.BlockPlan != "" {
		set = append(set, fmt.Sprintf("--block-plan (%s)", cfg.BlockPlan))
	}
	if len(set) > 0 {
		return fmt.Errorf("--budget chooses approx-act, grad-ckpt and mesa per block: leave %s off (a flag, or its key in --config), or drop --budget", strings.Join(set, ", "))
	}
	if !(margin >= 0 && margin < 1) {
		return fmt.Errorf("--budget-margin %g: give the fraction of the budget kept free, in [0, 1)", margin)
	}
	return nil
}

// AutopilotOptions are what the memory autopilot plans for: a model trained with Config on Backend, a budget
// less a margin, and how it times the modes.
type AutopilotOptions struct {
	Backend compute.Backend
	// Model is the model with weights, in Config's model-wide modes (MS-norm, attention); its own per-block
	// options are left as they were.
	Model finetune.Model
	// Config must leave approx_act, grad_ckpt, mesa and block_plan to the autopilot (CheckAutopilot).
	Config finetune.Config
	// Batch is the batch the modes are timed on, and Shape its shape (Autopilot). AutopilotBatch reads only
	// Shape.Seq, the sequence length (0 for ViT), and times on random batches of each micro-batch it tries.
	Batch finetune.Batch
	Shape finetune.Shape
	// Budget is the memory budget in bytes and Margin the fraction of it kept free, in [0, 1).
	Budget int64
	Margin float64
	// Calibration is how the modes are timed: CalibrationFast (also the zero value), CalibrationFull or
	// CalibrationNone (the cost model).
	Calibration Calibration
	// ForBackend plans the run for another backend than Backend ("xla:cuda": a GPU run planned on a laptop):
	// its step times come from the cost model with that backend's DeviceProfile (ProfileFor). Empty: this one.
	ForBackend string
	// CalibSteps are the timed steps of each mode of the full calibration (CalibrateModes); FastSteps those of
	// the fast one (0: DefaultFastCalibSteps).
	CalibSteps int
	FastSteps  int
	// CalibFLOPs and CalibBytes bound the fast calibration's block: its forward FLOPs (0: DefaultCalibFLOPs;
	// above, a smaller shape is timed and scaled) and its memory (0: DefaultCalibBytes; above, the cost model).
	CalibFLOPs float64
	CalibBytes int64
	// Cache keeps the calibrations by key (nil: none; DefaultCalibrationCache is the user's).
	Cache *CalibrationCache
	// Progress, when not nil, receives a line per timed step of a calibration (mode, blocks or pass, step) and
	// what the autopilot does, as it goes.
	Progress func(line string)
}

// progress reports a line to o.Progress.
func (o AutopilotOptions) progress(format string, args ...any) {
	if o.Progress != nil {
		o.Progress(fmt.Sprintf(format, args...))
	}
}

// Autopilot chooses the per-block plan of o.Config on o.Model for the budget less the margin: the modes' totals
// from the exact planner (ModeCosts), their step times from o.Calibration (the fast calibration by default,
// CalibrateFast; the full one, CalibrateModes, on o.Batch; or the cost model, CostModel) cached by calibration
// key in o.Cache when it is not nil, and the search of ChooseBlockPlan, each candidate checked with the exact
// planner. The cost model is used, and the plan says why, with CalibrationNone, when o.ForBackend names
// another backend, and when even the fast calibration's one-block model does not fit the memory it may take.
// o.Model needs weights only for the full calibration (a model made from its config alone is given random ones).
func Autopilot(o AutopilotOptions) (*Autoplan, error) {
	backend, model, cfg, in := o.Backend, o.Model, o.Config, o.Shape
	if err := CheckAutopilot(cfg, o.Margin); err != nil {
		return nil, err
	}
	if err := o.Cache.Check(); err != nil {
		return nil, err
	}
	blocks, err := finetune.BlockCount(model)
	if err != nil {
		return nil, err
	}
	method, why := o.Calibration, ""
	if method == "" {
		method = CalibrationFast
	}
	profile, profileErr := ProfileFor(profileName(backend.Name()))
	if o.ForBackend != "" {
		if profile, profileErr = ProfileFor(o.ForBackend); profileErr != nil {
			return nil, profileErr
		}
		if profileName(backend.Name()) != profileName(profile.Backend) {
			method, why = CalibrationNone, fmt.Sprintf("planned for %s (--for-backend %s), not timed on this %s backend", profile.Device, o.ForBackend, backend.Name())
		}
	}
	if method == CalibrationNone && why == "" {
		why = "--calibrate=false"
	}
	if fam, ok := finetune.FamilyOf(model); method == CalibrationFast && (!ok || fam.Cut == nil || fam.BlockFLOPs == nil) {
		method = CalibrationFull // a family that cannot cut its blocks out is timed whole
		o.progress("memory autopilot: this model's family does not cut its blocks out: the full calibration times the whole model")
	}
	modes := AutopilotModes
	if r := profile.Restrict; r != nil && method == CalibrationNone && o.ForBackend != "" && profileName(backend.Name()) != profileName(profile.Backend) {
		// Planned on another backend than the run's: only the modes measured to lower that device's peak
		// (DeviceProfile.Restrict), the memory figures being this backend's planner's.
		modes = r.Modes
		why += fmt.Sprintf("; modes %s only: memory is this backend's exact planner, and %s: check the plan on the GPU with bench step --block-plan",
			strings.Join(modes, ", "), r.Reason)
	}
	o.progress("memory autopilot: planning %d modes on %d blocks (exact planner)", len(modes), blocks)
	costs, err := ModeCosts(backend, model, cfg, in, modes)
	if err != nil {
		return nil, err
	}
	p := &Autoplan{}
	costModel := func() error {
		if profileErr != nil { // this backend has no profile
			return profileErr
		}
		w, err := blockWork(model, cfg, in, costs, blocks)
		if err != nil {
			return err
		}
		p.Source, p.Why, p.Profile = SourceCostModel, why, &profile
		o.progress("memory autopilot: step times from the cost model (%s): %s", profile.Device, why)
		return CostModel(costs, blocks, w, profile)
	}
	switch method {
	case CalibrationNone:
		if err := costModel(); err != nil {
			return nil, err
		}
	case CalibrationFast, CalibrationFull:
		key, kerr := calibrationKey(backend, model, cfg, in, method, o.calibSettings(method))
		if kerr != nil {
			return nil, kerr
		}
		p.Source = SourceFast
		if method == CalibrationFull {
			p.Source = SourceFull
		}
		hit, cacheErr := o.Cache.lookup(key, costs)
		if hit {
			p.Cached = true
			o.progress("memory autopilot: step times of the %s from the cache %s", p.Source, o.Cache.Path)
			break
		}
		if cacheErr != nil {
			o.progress("warning: the calibration cache cannot be read (%v): planning without it; the step times will not be cached", cacheErr)
		}
		if method == CalibrationFast {
			run, cerr := CalibrateFast(o, costs)
			if big := (errCalibrationTooBig{}); errors.As(cerr, &big) {
				why = cerr.Error()
				if err := costModel(); err != nil {
					return nil, err
				}
				break
			}
			if cerr != nil {
				return nil, cerr
			}
			p.Calibration = &run
		} else {
			if err := fullCalibration(o, costs); err != nil {
				return nil, err
			}
		}
		if cacheErr == nil {
			if err := o.Cache.store(key, costs); err != nil {
				o.progress("warning: the step times were not cached (%v): the next plan of this step times them again", err)
			}
		}
	default:
		return nil, fmt.Errorf("autopilot: unknown calibration %q (fast, full or none)", method)
	}
	limit := int64(float64(o.Budget) * (1 - o.Margin))
	o.progress("memory autopilot: searching the plans of %d blocks for %s (each candidate checked by the exact planner)", blocks, memory.FormatBytes(limit))
	checked, searchStart := 0, time.Now()
	choice, err := ChooseBlockPlan(settleTies(costs), blocks, limit, func(plan string) (int64, error) {
		checked++
		if checked%10 == 0 {
			o.progress("memory autopilot: %d candidates checked (%.1f s)", checked, time.Since(searchStart).Seconds())
		}
		return Total(backend, model, cfg, in, plan)
	})
	if err != nil {
		return nil, err
	}
	o.progress("memory autopilot: %d candidates checked by the exact planner in %.1f s", checked, time.Since(searchStart).Seconds())
	choice.Checked = checked
	choice.Source, choice.Cached, choice.Why, choice.Calibration, choice.Profile = p.Source, p.Cached, p.Why, p.Calibration, p.Profile
	choice.BatchSize, choice.AccumSteps = in.Batch, cfg.AccumSteps
	return choice, nil
}

// fullCalibration times the modes on the whole model (CalibrateModes), with random weights when o.Model has
// none, after checking that its step fits this machine.
func fullCalibration(o AutopilotOptions, costs []ModeCost) error {
	if o.Backend.Name() != "xla" {
		if limit, ok, err := memory.MachineBytes(); err == nil && ok && costs[0].TotalBytes > limit {
			return fmt.Errorf("timing the modes runs the step at this shape, which needs %s (planned, plain) but this machine has %s: choose the plan where the step runs (a GPU), or at a smaller shape",
				memory.FormatBytes(costs[0].TotalBytes), memory.FormatBytes(limit))
		}
	}
	if len(o.Model.Params()) == 0 {
		m, err := finetune.WithRandomWeights(o.Model, o.Config, 1)
		if err != nil {
			return err
		}
		o.Model = m
	}
	if o.Batch == nil {
		o.Batch = finetune.StepRandomBatch(o.Model, o.Config, o.Shape, 1)
	}
	return CalibrateModes(o, costs)
}

// profileName is the kind of backend a Backend.Name() ("Go Backend", "xla") or a --for-backend name ("go",
// "xla:cuda") stands for: "go" or "xla".
func profileName(name string) string {
	n := strings.ToLower(name)
	if strings.HasPrefix(n, "go") {
		return "go"
	}
	if strings.HasPrefix(n, "xla") {
		return "xla"
	}
	return n
}

// calibSettings are the settings of a calibration that its cache key holds.
func (o AutopilotOptions) calibSettings(method Calibration) string {
	if method == CalibrationFull {
		return fmt.Sprint(o.CalibSteps)
	}
	return fmt.Sprint(o.FastSteps, o.CalibFLOPs, o.CalibBytes)
}

// AutopilotBatch is Autopilot that may also change the micro-batch (--budget-batch): for every micro-batch size b
// dividing the effective batch E = batch_size x accum_steps, with E/b accumulation steps, it chooses the plan
// (batches of random inputs of that shape time the modes) and keeps the one with the highest predicted throughput,
// b examples per predicted micro-batch step time. A size for which even the lightest mode on every block does not
// fit is skipped before any timing. o.Batch and o.Shape.Batch are not read.
func AutopilotBatch(o AutopilotOptions) (*Autoplan, error) {
	backend, model, cfg := o.Backend, o.Model, o.Config
	if err := CheckAutopilot(cfg, o.Margin); err != nil {
		return nil, err
	}
	if err := o.Cache.Check(); err != nil {
		return nil, err
	}
	effective := cfg.BatchSize * cfg.AccumSteps
	limit := int64(float64(o.Budget) * (1 - o.Margin))
	var best *Autoplan
	var lastErr error
	for b := effective; b >= 1; b-- {
		if effective%b != 0 {
			continue
		}
		c := cfg
		c.BatchSize, c.AccumSteps = b, effective/b
		in := finetune.Shape{Batch: b, Seq: o.Shape.Seq, Packed: o.Shape.Packed}
		costs, err := ModeCosts(backend, model, c, in, AutopilotModes)
		if err != nil {
			return nil, err
		}
		lightest := costs[0].TotalBytes
		for _, m := range costs {
			lightest = min(lightest, m.TotalBytes)
		}
		if lightest > limit {
			lastErr = fmt.Errorf("micro-batch %d: the lightest mode on every block needs %s", b, memory.FormatBytes(lightest))
			continue
		}
		at := o
		at.Config, at.Batch, at.Shape = c, nil, in // the full calibration makes a random batch of the shape
		p, err := Autopilot(at)
		if err != nil {
			lastErr = err
			continue
		}
		if best == nil || float64(p.BatchSize)/p.PredictedSeconds > float64(best.BatchSize)/best.PredictedSeconds {
			best = p
		}
	}
	if best == nil {
		return nil, fmt.Errorf("no micro-batch dividing the effective batch %d fits %s: %v", effective, memory.FormatBytes(limit), lastErr)
	}
	return best, nil
}

// CalibrationCache keeps measured mode step times in a JSON file, by a key of the backend, the model's
// config, the training settings that shape the step and the batch shape, so that a second plan of the same
// step does not time it again.
type CalibrationCache struct {
	// Path is the JSON file.
	Path string
}

// DefaultCalibrationCache is the cache under the user's cache folder ($XDG_CACHE_HOME/memfit/calibration.json on
// Linux), or nil when there is none.
func DefaultCalibrationCache() *CalibrationCache {
	dir, err := os.UserCacheDir()
	if err != nil {
		return nil
	}
	return &CalibrationCache{Path: filepath.Join(dir, "memfit", "calibration.json")}
}

// Check refuses a cache path that is something no cache can be: a device, a named pipe or a socket (a link to
// /dev/zero was read without end: memory --plan hung), or a file larger than readfile.Config. A cache that is
// missing, damaged (re-timed and rewritten) or cannot be written (a folder at its path, a cache folder that
// cannot be created) is no error: the plan is made without it, with a warning.
func (c *CalibrationCache) Check() error {
	if c == nil {
		return nil
	}
	if st, err := os.Stat(c.Path); err != nil || st.IsDir() {
		return nil
	}
	if _, err := c.read(); err != nil {
		return fmt.Errorf("the calibration cache cannot be used: %v: remove it (memfit writes a new one), or set XDG_CACHE_HOME to another folder", err)
	}
	return nil
}

// read returns the cache's calibrations: none when there is no cache or no file yet, or when the file does not
// decode (a damaged cache is measured again and rewritten); an error when the file cannot be read (a folder, a
// device, a file larger than readfile.Config: never read without a bound).
func (c *CalibrationCache) read() (map[string][]ModeCost, error) {
	out := map[string][]ModeCost{}
	if c == nil {
		return out, nil
	}
	raw, err := readfile.Read(c.Path, readfile.Config)
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return out, err
	}
	_ = json.Unmarshal(raw, &out) // a damaged cache is measured again and rewritten
	return out, nil
}

// lookup fills costs' step times from the cache; false when the key or a mode is missing, or when the cache
// cannot be read (the error).
func (c *CalibrationCache) lookup(key string, costs []ModeCost) (bool, error) {
	all, err := c.read()
	saved, ok := all[key]
	if !ok {
		return false, err
	}
	byMode := map[string]ModeCost{}
	for _, s := range saved {
		byMode[s.Mode] = s
	}
	for _, m := range costs {
		if byMode[m.Mode].StepSeconds <= 0 {
			return false, nil
		}
	}
	for i := range costs {
		m := byMode[costs[i].Mode]
		costs[i].StepSeconds, costs[i].StepMin, costs[i].StepMax = m.StepSeconds, m.StepMin, m.StepMax
	}
	return true, nil
}

// store adds the calibration of key to the cache file (written atomically); an error says why it was not
// written (the plan is good without it).
func (c *CalibrationCache) store(key string, costs []ModeCost) error {
	if c == nil {
		return nil
	}
	all, err := c.read()
	if err != nil {
		return err
	}
	all[key] = costs
	if err := os.MkdirAll(filepath.Dir(c.Path), 0o755); err != nil {
		return err
	}
	raw, err := json.MarshalIndent(all, "", "  ")
	if err != nil {
		return err
	}
	return safetensors.WriteAtomic(c.Path, func(w *bufio.Writer) error {
		_, err := w.Write(append(raw, '\n'))
		return err
	})
}

// calibrationKey identifies a calibration: the backend, the model's config.json, the settings that shape the
// step, the batch shape, the calibration and its settings.
func calibrationKey(backend compute.Backend, model finetune.Model, cfg finetune.Config, in finetune.Shape, method Calibration, settings string) (string, error) {
	conf, err := model.ConfigJSON()
	if err != nil {
		return "", err
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s|%s|%s|%d|%s|%v|%s|%s|%v|%s|%v|%d|%d|%s|%s", backend.Name(), conf, cfg.Method, cfg.LoRARank,
		strings.Join(cfg.LoRATarget, ","), cfg.TrainModules, cfg.Optimizer, cfg.ComputeDType, cfg.MSNorm, cfg.Attention,
		AutopilotModes, in.Batch, in.Seq, method, settings)
	return hex.EncodeToString(h.Sum(nil))[:20], nil
}

// Budget is the memory autopilot of a training run (`finetune train --budget`), as the finetune.Planner of its
// recipe (finetune.Recipe.Plan): its Plan times the modes (the fast calibration by default; the full one on the
// run's first batch, leaving the data where it was, or with ChooseBatch on random batches of each micro-batch
// it tries), and returns the run's config with
// the chosen block_plan (and micro-batch).
type Budget struct {
	// Bytes is the memory budget and Margin the fraction of it kept free, in [0, 1).
	Bytes  int64
	Margin float64
	// ChooseBatch lets the autopilot choose the micro-batch too (AutopilotBatch).
	ChooseBatch bool
	// Calibration is how the modes are timed (CalibrationFast by default); CalibSteps are the full
	// calibration's timed steps of each mode; Cache keeps the calibrations (nil: none).
	Calibration Calibration
	CalibSteps  int
	Cache       *CalibrationCache
	// Progress receives the autopilot's progress lines (AutopilotOptions.Progress).
	Progress func(line string)
	// OnStart is called before the modes are planned and timed; OnChoice sees the choice before the run takes
	// it (an error stops the run).
	OnStart  func()
	OnChoice func(p *Autoplan) error
}

// Plan chooses the run's per-block plan (and micro-batch): a finetune.Planner.
func (b Budget) Plan(s finetune.Setup) (finetune.Config, error) {
	batch, in, err := peekBatch(s.Data)
	if err != nil {
		return s.Config, err
	}
	if err := b.Cache.Check(); err != nil {
		return s.Config, err
	}
	if b.OnStart != nil {
		b.OnStart()
	}
	o := AutopilotOptions{Backend: s.Backend, Model: s.Model, Config: s.Config, Batch: batch, Shape: in, Budget: b.Bytes,
		Margin: b.Margin, Calibration: b.Calibration, CalibSteps: b.CalibSteps, Cache: b.Cache, Progress: b.Progress}
	var p *Autoplan
	if b.ChooseBatch {
		p, err = AutopilotBatch(o)
	} else {
		p, err = Autopilot(o)
	}
	if err != nil {
		return s.Config, err
	}
	if b.OnChoice != nil {
		if err := b.OnChoice(p); err != nil {
			return s.Config, err
		}
	}
	cfg := s.Config
	cfg.BlockPlan = p.Plan
	if p.BatchSize != cfg.BatchSize {
		cfg.BatchSize, cfg.AccumSteps = p.BatchSize, p.AccumSteps
	}
	return cfg, nil
}

// peekBatch returns the data's next batch and its shape without moving the data.
func peekBatch(data finetune.Iterator) (finetune.Batch, finetune.Shape, error) {
	state, err := data.State()
	if err != nil {
		return nil, finetune.Shape{}, err
	}
	b, err := data.Next()
	if err != nil {
		return nil, finetune.Shape{}, err
	}
	if err := data.Restore(state); err != nil {
		return nil, finetune.Shape{}, err
	}
	in := finetune.Shape{Batch: b.Size(), Seq: sequenceLength(b)}
	_, in.Packed = b["position_ids"] // packed sequences (--packing)
	return b, in, nil
}

// sequenceLength is the length of a batch's (or data's) token sequences: of its input_ids, or of a preference
// pair's completions (chosen_input_ids: a pair batch holds no input_ids; probe 2026-11-27-b pb01: the autopilot of
// a DPO run planned sequences of 0 tokens and stopped); 0 when it has no token ids.
func sequenceLength(b map[string]*tensors.Tensor) int {
	for _, name := range []string{"input_ids", preference.ChosenIDs} {
		if ids, ok := b[name]; ok && ids.Rank() == 2 {
			return ids.Shape().Dim(1)
		}
	}
	return 0
}
