package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gomlx/compute"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/readfile"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/plan"
)

// AutopilotCase is one model of the autopilot benchmark: a checkpoint folder whose steps run on the backend
// (Run), or a preset or folder that is only planned (exact memory), its step times standing in from the measured
// ratios of the run case named Sibling.
type AutopilotCase struct {
	Name     string          `json:"name"`
	Model    string          `json:"model"`
	Labels   int             `json:"labels,omitempty"`
	Shape    finetune.Shape  `json:"shape"`
	Config   finetune.Config `json:"-"`
	Method   string          `json:"method"`
	Describe string          `json:"describe"`
	Run      bool            `json:"run"`
	Sibling  string          `json:"sibling,omitempty"`
}

// AutopilotFractions are the budgets of the benchmark, as fractions of plain's total (the issue's).
var AutopilotFractions = []float64{0.95, 0.80, 0.65, 0.50}

// GlobalOption is one memory option applied to the whole model: what a user picks without the autopilot (PEFT's
// and torchtune's switches, or memfit's model-wide variants).
type GlobalOption struct {
	Name   string `json:"name"`
	MSNorm bool   `json:"ms_norm"`
	// Mode is the block mode every block takes (plan.AutopilotModes).
	Mode string `json:"mode"`
}

// GlobalOptions are the single global options the autopilot's plans are compared with: plain (the reference of
// the budgets) and uniform gradient checkpointing without MS-norm (the usual switch), then each autopilot mode on
// every block with MS-norm, as the plans have it.
var GlobalOptions = []GlobalOption{
	{"plain", false, "plain"},
	{"grad-ckpt", false, "grad-ckpt"},
	{"ms-norm", true, "plain"},
	{"approx-act+ms-norm", true, "approx-act"},
	{"approx-act+mesa+ms-norm", true, "approx-act+mesa"},
	{"grad-ckpt+ms-norm", true, "grad-ckpt"},
}

// AutopilotMeasure is one configuration of a case: a global option or a plan, with the exact planner's total and,
// for a run case, what its own process measured.
type AutopilotMeasure struct {
	Name      string `json:"name"`
	MSNorm    bool   `json:"ms_norm"`
	BlockPlan string `json:"block_plan"`
	// PlannedBytes is the exact planner's total (the step's peak + the optimizer state).
	PlannedBytes int64 `json:"planned_total_bytes"`
	// PeakBytes is the peak of the training step in its own process (PeakMethod: the XLA device's peak bytes in
	// use, the pure-Go backend's buffer-pool counter in builds with tools/peakmem, else the executor's liveness
	// simulation): weights, optimizer state, batch and the step's buffers. 0 for a planned case.
	PeakBytes  int64  `json:"peak_bytes,omitempty"`
	PeakMethod string `json:"peak_method,omitempty"`
	// StepSeconds is the median timed step (run cases) or, for a planned case, the sibling's measured step time
	// of the same option relative to its ms-norm step (Predicted is then true); PerSecond the examples or tokens
	// per second at the median.
	StepSeconds float64 `json:"step_seconds"`
	StepMin     float64 `json:"step_seconds_min,omitempty"`
	StepMax     float64 `json:"step_seconds_max,omitempty"`
	PerSecond   float64 `json:"per_second,omitempty"`
	Unit        string  `json:"unit,omitempty"`
	Predicted   bool    `json:"predicted,omitempty"`
	// Process names the processes' JSON results (one per round), relative to the output folder.
	Process string `json:"process,omitempty"`
}

// AutopilotRow is one budget of a case: the autopilot's choice and how it compares.
type AutopilotRow struct {
	Fraction    float64 `json:"fraction"`
	BudgetBytes int64   `json:"budget_bytes"`
	LimitBytes  int64   `json:"limit_bytes"`
	// Plan is the chosen block plan (NoFit, the autopilot's one line, when nothing fits).
	Plan             string  `json:"block_plan,omitempty"`
	PlannedBytes     int64   `json:"planned_total_bytes,omitempty"`
	PredictedBytes   int64   `json:"predicted_total_bytes,omitempty"`
	PredictedSeconds float64 `json:"predicted_step_seconds,omitempty"`
	NoFit            string  `json:"no_fit,omitempty"`
	// Source is where the plan's step times came from (run cases: the full calibration; planned ones: empty,
	// the sibling's ratios).
	Source string `json:"source,omitempty"`
	// Measured is the plan's own configuration (shared with a global option whose plan it is).
	Measured *AutopilotMeasure `json:"measured,omitempty"`
	// Fits: the plan's peak (measured, or planned for a planned case) is within the budget.
	Fits bool `json:"fits"`
	// VsGradCkpt is the plan's throughput over uniform gradient checkpointing's (the global option grad-ckpt,
	// whether it fits or not); GradCkptFits says whether it does (planned total within the limit).
	VsGradCkpt   float64 `json:"vs_grad_ckpt"`
	GradCkptFits bool    `json:"grad_ckpt_fits"`
	// BestGlobal is the fastest global option whose planned total fits the limit ("" when none does) and
	// VsBestGlobal the plan's throughput over its.
	BestGlobal   string  `json:"best_global,omitempty"`
	VsBestGlobal float64 `json:"vs_best_global,omitempty"`
	// Alternatives are the plans the fast calibration and the cost model choose at this budget, beside the
	// full calibration's (Plan).
	Alternatives []AutopilotAlternative `json:"alternatives,omitempty"`
}

// AutopilotAlternative is the plan another source of step times chose at a budget, against the full
// calibration's plan: the same plan, or one whose measured (planned case: predicted) step is compared.
type AutopilotAlternative struct {
	// Source is plan.SourceFast or plan.SourceCostModel; Seconds how long the autopilot took (calibration and
	// search; the fast calibration's first budget of a case calibrates, the later ones read the cache).
	Source  string  `json:"source"`
	Seconds float64 `json:"seconds"`
	Plan    string  `json:"block_plan,omitempty"`
	NoFit   string  `json:"no_fit,omitempty"`
	Planned int64   `json:"planned_total_bytes,omitempty"`
	// Same says the plan is the full calibration's; VsFull is the full calibration plan's step over this plan's
	// (above 1: this plan runs faster), measured for a run case, predicted (the sibling's ratios) for a planned
	// one; Fits that its measured peak (planned total, planned case) is within the budget.
	Same     bool              `json:"same_plan"`
	VsFull   float64           `json:"vs_full,omitempty"`
	Fits     bool              `json:"fits"`
	Measured *AutopilotMeasure `json:"measured,omitempty"`
}

// altSources are the calibrations the benchmark runs beside the full one.
var altSources = []plan.Calibration{plan.CalibrationFast, plan.CalibrationNone}

// alternatives returns the plans of the fast calibration and the cost model at budget (o's autopilot options
// with another calibration).
func alternatives(log io.Writer, name string, f float64, budget int64, ao plan.AutopilotOptions) ([]AutopilotAlternative, error) {
	var out []AutopilotAlternative
	for _, src := range altSources {
		a := ao
		a.Calibration, a.Budget = src, budget
		logf(log, "%s: the autopilot at %.0f%% of plain, %s", name, 100*f, src)
		start := time.Now()
		p, err := plan.Autopilot(a)
		alt := AutopilotAlternative{Source: string(src), Seconds: time.Since(start).Seconds()}
		switch {
		case errors.Is(err, plan.ErrNoPlanFits):
			alt.NoFit = err.Error()
		case err != nil:
			return nil, err
		default:
			alt.Source, alt.Plan, alt.Planned = p.Source, p.Plan, p.PlannedBytes
		}
		out = append(out, alt)
	}
	return out, nil
}

// compareAlternatives fills each alternative of the row from the measured (or predicted) configurations.
func compareAlternatives(row *AutopilotRow, options []AutopilotMeasure, planned bool) {
	for k := range row.Alternatives {
		a := &row.Alternatives[k]
		if a.Plan == "" {
			continue
		}
		a.Same = a.Plan == row.Plan
		i := findMeasure(options, true, a.Plan)
		if i < 0 {
			continue
		}
		m := options[i]
		a.Measured = &m
		if planned {
			a.Fits = a.Planned <= row.BudgetBytes
		} else {
			a.Fits = m.PeakBytes > 0 && m.PeakBytes <= row.BudgetBytes
		}
		if row.Measured != nil && m.StepSeconds > 0 {
			a.VsFull = row.Measured.StepSeconds / m.StepSeconds
		}
	}
}

// AutopilotResult is one case of the benchmark.
type AutopilotResult struct {
	Case   AutopilotCase   `json:"case"`
	Blocks int             `json:"blocks"`
	Costs  []plan.ModeCost `json:"costs"`
	// Options are the global options, then the plans that are none of them.
	Options []AutopilotMeasure `json:"options"`
	Rows    []AutopilotRow     `json:"rows"`
}

// AutopilotRun is the whole benchmark.
type AutopilotRun struct {
	Date       string            `json:"date"`
	Command    string            `json:"command"`
	Backend    string            `json:"backend"`
	Machine    CPUMachine        `json:"machine"`
	Versions   map[string]string `json:"versions"`
	Margin     float64           `json:"margin"`
	Steps      int               `json:"steps"`
	Rounds     int               `json:"rounds"`
	CalibSteps int               `json:"calibration_steps"`
	Results    []AutopilotResult `json:"results"`
	// Problems lists every row whose plan does not fit its budget or runs slower than uniform gradient
	// checkpointing or the best fitting global option.
	Problems []string `json:"problems,omitempty"`
}

// StepRunner runs one configuration of a run case in its own process (`finetune bench step`, see
// StepProcess) and returns its result; name names the process's files.
type StepRunner func(c AutopilotCase, msNorm bool, plan string, name string) (StepResult, error)

// AutopilotOptions configure RunAutopilot.
type AutopilotOptions struct {
	Backend   compute.Backend
	Cases     []AutopilotCase
	Fractions []float64
	// Margin is the fraction of each budget the autopilot keeps free (--budget-margin).
	Margin float64
	// CalibSteps are the autopilot's timed calibration steps per mode; Steps the timed steps of each measured
	// configuration's process (Runner's to honour).
	CalibSteps, Steps int
	// Rounds is how many times each configuration's process runs, all configurations once per round.
	Rounds int
	Runner StepRunner
	// Cache is the autopilot's calibration cache (a fresh file: every run calibrates once per case).
	Cache *plan.CalibrationCache
	Log   io.Writer
}

// RunAutopilot runs the autopilot benchmark: for each case and each budget (a fraction of plain's planned total)
// the autopilot's plan, as `finetune train --budget` makes it (MS-norm on, the modes timed in this process), and,
// for run cases, every global option and every plan trained in its own process (Runner) for its measured peak
// and throughput. Planned cases use the exact planner for memory and their sibling's measured time ratios.
func RunAutopilot(o AutopilotOptions) (AutopilotRun, error) {
	run := AutopilotRun{Date: time.Now().UTC().Format("2006-01-02 15:04 UTC"), Backend: o.Backend.Name(), Machine: MachineInfo(),
		Versions: MemfitVersions(), Margin: o.Margin, Steps: o.Steps, Rounds: max(1, o.Rounds), CalibSteps: o.CalibSteps}
	byName := map[string]*AutopilotResult{}
	for _, c := range o.Cases {
		var res *AutopilotResult
		var err error
		if c.Run {
			res, err = runAutopilotCase(o, c)
		} else {
			sib := byName[c.Sibling]
			if sib == nil {
				return run, fmt.Errorf("%s: its sibling %q must be a run case listed before it", c.Name, c.Sibling)
			}
			res, err = planAutopilotCase(o, c, sib)
		}
		if err != nil {
			return run, fmt.Errorf("%s: %w", c.Name, err)
		}
		run.Results = append(run.Results, *res)
		byName[c.Name] = &run.Results[len(run.Results)-1]
	}
	run.Problems = autopilotProblems(run.Results)
	return run, nil
}

// shapeModels returns c's model (config only, no weights) without and with MS-norm.
func shapeModels(c AutopilotCase) (map[bool]finetune.Model, error) {
	out := map[bool]finetune.Model{}
	for _, ms := range []bool{false, true} {
		cfg := c.Config
		cfg.MSNorm = ms
		m, _, err := plan.ShapeModel(c.Model, cfg, c.Labels)
		if err != nil {
			return nil, err
		}
		out[ms] = m
	}
	return out, nil
}

// planGlobalOptions returns c's shape models (shapeModels), its block count and the global options with their
// block plans and exact totals.
func planGlobalOptions(o AutopilotOptions, c AutopilotCase) (map[bool]finetune.Model, int, []AutopilotMeasure, error) {
	models, err := shapeModels(c)
	if err != nil {
		return nil, 0, nil, err
	}
	blocks, err := finetune.BlockCount(models[true])
	if err != nil {
		return nil, 0, nil, err
	}
	var out []AutopilotMeasure
	for _, g := range GlobalOptions {
		cfg := c.Config
		cfg.MSNorm = g.MSNorm
		uniform := fmt.Sprintf("%s*%d", g.Mode, blocks)
		total, err := plan.Total(o.Backend, models[g.MSNorm], cfg, c.Shape, uniform)
		if err != nil {
			return nil, 0, nil, fmt.Errorf("planning %s: %w", g.Name, err)
		}
		out = append(out, AutopilotMeasure{Name: g.Name, MSNorm: g.MSNorm, BlockPlan: uniform, PlannedBytes: total})
	}
	return models, blocks, out, nil
}

func runAutopilotCase(o AutopilotOptions, c AutopilotCase) (*AutopilotResult, error) {
	logf(o.Log, "%s: planning the global options", c.Name)
	_, blocks, opts, err := planGlobalOptions(o, c)
	if err != nil {
		return nil, err
	}
	res := &AutopilotResult{Case: c, Blocks: blocks, Options: opts}
	cfg := c.Config
	cfg.MSNorm = true
	model, err := finetune.LoadModel(c.Model, cfg)
	if err != nil {
		return nil, err
	}
	batch := finetune.RandomBatch(model, c.Shape, 1)
	plain := opts[0].PlannedBytes
	for _, f := range o.Fractions {
		row, p, err := budgetRow(f, plain, o.Margin, func(budget, _ int64) (*plan.Autoplan, error) {
			logf(o.Log, "%s: the autopilot at %.0f%% of plain (%s)", c.Name, 100*f, memory.FormatBytes(budget))
			return plan.Autopilot(plan.AutopilotOptions{Backend: o.Backend, Model: model, Config: cfg, Batch: batch, Shape: c.Shape,
				Budget: budget, Margin: o.Margin, Calibration: plan.CalibrationFull, CalibSteps: o.CalibSteps, Cache: o.Cache})
		})
		if err != nil {
			return nil, err
		}
		if p != nil {
			res.Costs = p.Costs
		}
		if row.Alternatives, err = alternatives(o.Log, c.Name, f, row.BudgetBytes, plan.AutopilotOptions{Backend: o.Backend, Model: model,
			Config: cfg, Shape: c.Shape, Margin: o.Margin, Cache: o.Cache}); err != nil {
			return nil, err
		}
		res.Rows = append(res.Rows, row)
	}
	// The plans that are not a global option are configurations of their own.
	for _, row := range res.Rows {
		if row.Plan != "" && findMeasure(res.Options, true, row.Plan) < 0 {
			res.Options = append(res.Options, AutopilotMeasure{Name: "plan " + row.Plan, MSNorm: true, BlockPlan: row.Plan, PlannedBytes: row.PlannedBytes})
		}
		for _, a := range row.Alternatives {
			if a.Plan != "" && findMeasure(res.Options, true, a.Plan) < 0 {
				res.Options = append(res.Options, AutopilotMeasure{Name: "plan " + a.Plan, MSNorm: true, BlockPlan: a.Plan, PlannedBytes: a.Planned})
			}
		}
	}
	// Rounds over every configuration, so that a drift of the machine's speed falls on all of them alike; a
	// configuration's step is the median of its rounds' medians, its range their extremes.
	medians := make([][]float64, len(res.Options))
	for round := 0; round < max(1, o.Rounds); round++ {
		for i := range res.Options {
			m := &res.Options[i]
			name := fmt.Sprintf("%s-%d-r%d", c.Name, i, round+1)
			logf(o.Log, "%s: round %d: training %s (ms-norm %v, %s) in its own process", c.Name, round+1, m.Name, m.MSNorm, m.BlockPlan)
			r, err := o.Runner(c, m.MSNorm, m.BlockPlan, name)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", m.Name, err)
			}
			peak, method := r.PeakBytes, r.PeakMethod
			if r.DevicePeakBytes > 0 {
				peak, method = r.DevicePeakBytes, r.DevicePeakMethod
			}
			m.PeakBytes, m.PeakMethod = memory.LargerPeak(m.PeakBytes, m.PeakMethod, peak, method)
			medians[i] = append(medians[i], r.StepSeconds)
			if round == 0 || r.StepMin < m.StepMin {
				m.StepMin = r.StepMin
			}
			m.StepMax = max(m.StepMax, r.StepMax)
			n := r.PerSecond * r.StepSeconds // examples or tokens per step
			slices.Sort(medians[i])
			m.StepSeconds = medians[i][len(medians[i])/2]
			m.PerSecond, m.Unit = n/m.StepSeconds, r.Unit
			m.Process = filepath.Join("processes", fmt.Sprintf("%s-%d-r*.json", c.Name, i))
		}
	}
	for i := range res.Rows {
		compareRow(&res.Rows[i], res.Options, false)
		compareAlternatives(&res.Rows[i], res.Options, false)
	}
	return res, nil
}

// budgetRow is the row of the budget at fraction f of plain's total: choose gets the budget and the limit (the
// budget less margin) and returns the autopilot's plan, which fills the row; when no plan fits, the row holds the
// autopilot's one line and the plan is nil.
func budgetRow(f float64, plain int64, margin float64, choose func(budget, limit int64) (*plan.Autoplan, error)) (AutopilotRow, *plan.Autoplan, error) {
	budget := int64(f * float64(plain))
	row := AutopilotRow{Fraction: f, BudgetBytes: budget, LimitBytes: int64(float64(budget) * (1 - margin))}
	p, err := choose(budget, row.LimitBytes)
	switch {
	case errors.Is(err, plan.ErrNoPlanFits):
		row.NoFit = err.Error()
		return row, nil, nil
	case err != nil:
		return row, nil, err
	}
	row.Plan, row.PlannedBytes, row.PredictedBytes, row.PredictedSeconds, row.Source = p.Plan, p.PlannedBytes, p.PredictedBytes, p.PredictedSeconds, p.Source
	return row, p, nil
}

// findMeasure returns the index of the configuration with that MS-norm setting and block plan, or -1.
func findMeasure(ms []AutopilotMeasure, msNorm bool, plan string) int {
	for i, m := range ms {
		if m.MSNorm == msNorm && m.BlockPlan == plan {
			return i
		}
	}
	return -1
}

// compareRow fills the row's comparisons from the configurations' figures (planned: the predicted times and the
// planned totals).
func compareRow(row *AutopilotRow, options []AutopilotMeasure, planned bool) {
	if row.Plan == "" {
		return
	}
	i := findMeasure(options, true, row.Plan)
	if i < 0 {
		return
	}
	m := options[i]
	row.Measured = &m
	faster := func(than AutopilotMeasure) float64 { return than.StepSeconds / m.StepSeconds } // same batch: throughput ratio
	if planned {
		row.Fits = row.PlannedBytes <= row.BudgetBytes
	} else {
		row.Fits = m.PeakBytes > 0 && m.PeakBytes <= row.BudgetBytes
	}
	gc := options[1] // grad-ckpt
	row.VsGradCkpt, row.GradCkptFits = faster(gc), gc.PlannedBytes <= row.LimitBytes
	best := -1
	for j, g := range options[:len(GlobalOptions)] {
		if g.PlannedBytes <= row.LimitBytes && (best < 0 || g.StepSeconds < options[best].StepSeconds) {
			best = j
		}
	}
	if best >= 0 {
		row.BestGlobal, row.VsBestGlobal = options[best].Name, faster(options[best])
	}
}

// planAutopilotCase plans a case that is not run: the exact planner's totals, and step times as the sibling's
// measured ratios (each option's step over the sibling's ms-norm step), so the search and the comparisons are in
// units of the ms-norm step.
func planAutopilotCase(o AutopilotOptions, c AutopilotCase, sib *AutopilotResult) (*AutopilotResult, error) {
	logf(o.Log, "%s: planning (step times: %s's measured ratios)", c.Name, sib.Case.Name)
	shaped, blocks, opts, err := planGlobalOptions(o, c)
	if err != nil {
		return nil, err
	}
	unit := sib.Options[2].StepSeconds // the sibling's ms-norm step
	for i := range opts {
		opts[i].StepSeconds, opts[i].Predicted = sib.Options[i].StepSeconds/unit, true
	}
	cfg := c.Config
	cfg.MSNorm = true
	var costs []plan.ModeCost
	for _, mode := range plan.AutopilotModes {
		for _, g := range opts {
			if g.MSNorm && strings.HasPrefix(g.BlockPlan, mode+"*") {
				costs = append(costs, plan.ModeCost{Mode: mode, TotalBytes: g.PlannedBytes, StepSeconds: g.StepSeconds})
			}
		}
	}
	if len(costs) != len(plan.AutopilotModes) {
		return nil, fmt.Errorf("the global options do not cover the autopilot's modes %v", plan.AutopilotModes)
	}
	res := &AutopilotResult{Case: c, Blocks: blocks, Costs: costs, Options: opts}
	plain := opts[0].PlannedBytes
	for _, f := range o.Fractions {
		row, p, err := budgetRow(f, plain, o.Margin, func(budget, limit int64) (*plan.Autoplan, error) {
			logf(o.Log, "%s: the autopilot's search at %.0f%% of plain (%s)", c.Name, 100*f, memory.FormatBytes(budget))
			return plan.ChooseBlockPlan(costs, blocks, limit, func(blockPlan string) (int64, error) {
				return plan.Total(o.Backend, shaped[true], cfg, c.Shape, blockPlan)
			})
		})
		if err != nil {
			return nil, err
		}
		if p != nil && findMeasure(res.Options, true, p.Plan) < 0 {
			res.Options = append(res.Options, AutopilotMeasure{Name: "plan " + p.Plan, MSNorm: true, BlockPlan: p.Plan,
				PlannedBytes: p.PlannedBytes, StepSeconds: p.PredictedSeconds, Predicted: true})
		}
		if row.Alternatives, err = alternatives(o.Log, c.Name, f, row.BudgetBytes, plan.AutopilotOptions{Backend: o.Backend, Model: shaped[true],
			Config: cfg, Shape: c.Shape, Margin: o.Margin, Cache: o.Cache}); err != nil {
			return nil, err
		}
		for _, a := range row.Alternatives {
			if a.Plan != "" && findMeasure(res.Options, true, a.Plan) < 0 {
				// Its step in the sibling's units: the additive model over the same costs.
				res.Options = append(res.Options, AutopilotMeasure{Name: "plan " + a.Plan, MSNorm: true, BlockPlan: a.Plan,
					PlannedBytes: a.Planned, StepSeconds: predictedStep(costs, blocks, a.Plan), Predicted: true})
			}
		}
		res.Rows = append(res.Rows, row)
	}
	for i := range res.Rows {
		compareRow(&res.Rows[i], res.Options, true)
		compareAlternatives(&res.Rows[i], res.Options, true)
	}
	return res, nil
}

// predictedStep is the additive model's step of a block plan ("mode*n,...") over uniform costs.
func predictedStep(costs []plan.ModeCost, blocks int, blockPlan string) float64 {
	s := costs[0].StepSeconds
	for _, entry := range strings.Split(blockPlan, ",") {
		i := strings.LastIndex(entry, "*")
		n, _ := strconv.Atoi(entry[i+1:])
		for _, c := range costs {
			if c.Mode == entry[:i] {
				s += float64(n) * (c.StepSeconds - costs[0].StepSeconds) / float64(blocks)
			}
		}
	}
	return s
}

// autopilotProblems lists the rows whose plan does not fit its budget or runs slower than uniform gradient
// checkpointing or the best fitting global option.
func autopilotProblems(results []AutopilotResult) []string {
	var out []string
	for _, r := range results {
		for _, row := range r.Rows {
			if row.Plan == "" || row.Measured == nil {
				continue
			}
			at := fmt.Sprintf("%s at %.0f%%", r.Case.Name, 100*row.Fraction)
			if !row.Fits {
				out = append(out, fmt.Sprintf("%s: %s peaks at %s, over the budget %s", at, row.Plan,
					memory.FormatBytes(max(row.Measured.PeakBytes, row.PlannedBytes)), memory.FormatBytes(row.BudgetBytes)))
			}
			noise := func(name string) string {
				for _, o := range r.Options {
					if o.Name == name && !o.Predicted && row.Measured.StepMin <= o.StepMax && o.StepMin <= row.Measured.StepMax {
						return " (within the measured step ranges)"
					}
				}
				return ""
			}
			if row.VsGradCkpt < 1 {
				out = append(out, fmt.Sprintf("%s: %s runs at %.3fx uniform gradient checkpointing's throughput%s", at, row.Plan, row.VsGradCkpt, noise(GlobalOptions[1].Name)))
			}
			if row.BestGlobal != "" && row.VsBestGlobal < 1 {
				out = append(out, fmt.Sprintf("%s: %s runs at %.3fx the throughput of %s, which fits too%s", at, row.Plan, row.VsBestGlobal, row.BestGlobal, noise(row.BestGlobal)))
			}
			for _, a := range row.Alternatives {
				switch {
				case a.Plan == "" || a.Measured == nil:
				case !a.Fits:
					out = append(out, fmt.Sprintf("%s: the %s's plan %s peaks at %s, over the budget %s", at, a.Source, a.Plan,
						memory.FormatBytes(max(a.Measured.PeakBytes, a.Planned)), memory.FormatBytes(row.BudgetBytes)))
				case !a.Same && a.VsFull < 1:
					within := ""
					if f, m := row.Measured, a.Measured; !m.Predicted && m.StepMin <= f.StepMax && f.StepMin <= m.StepMax {
						within = " (within the measured step ranges)"
					}
					out = append(out, fmt.Sprintf("%s: the %s's plan %s runs at %.3fx the full calibration's %s%s", at, a.Source, a.Plan, a.VsFull, row.Plan, within))
				}
			}
		}
	}
	return out
}

// StepProcess returns a StepRunner that runs command + `bench step` for each configuration in its own process,
// with its JSON result and log in dir (dir/NAME.json, dir/NAME.log): the run case's folder and shape, method
// Method (a GridMethods name), variant ms-norm or plain, the block plan, steps timed steps, the case's compute
// dtype, attention and LoRA rank.
func StepProcess(command, env []string, dir string, steps int) StepRunner {
	return func(c AutopilotCase, msNorm bool, plan, name string) (StepResult, error) {
		variant := "plain"
		if msNorm {
			variant = "ms-norm"
		}
		out, logPath := filepath.Join(dir, name+".json"), filepath.Join(dir, name+".log")
		os.Remove(out)
		args := append(append([]string(nil), command...), "bench", "step", "--model", c.Model, "--method", c.Method,
			"--variant", variant, "--block-plan", plan, "--batch-size", strconv.Itoa(c.Shape.Batch), "--steps", strconv.Itoa(steps), "--num-labels", strconv.Itoa(max(c.Labels, 1)),
			"--compute-dtype", c.Config.ComputeDType, "--attention", c.Config.Attention,
			"--lora-r", strconv.Itoa(max(c.Config.LoRARank, 1)), "--json", out)
		if c.Shape.Seq > 0 {
			args = append(args, "--seq-len", strconv.Itoa(c.Shape.Seq))
		}
		logFile, err := os.Create(logPath)
		if err != nil {
			return StepResult{}, err
		}
		defer logFile.Close()
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Stdout, cmd.Stderr, cmd.Env = logFile, logFile, env
		if err := cmd.Run(); err != nil {
			return StepResult{}, fmt.Errorf("%s failed (%v): %s (log: %s)", name, err, lastLine(logPath), logPath)
		}
		b, err := readfile.Read(out, readfile.Config)
		if err != nil {
			return StepResult{}, fmt.Errorf("%s wrote no result: %w (log: %s)", name, err, logPath)
		}
		var r StepResult
		if err := json.Unmarshal(b, &r); err != nil {
			return StepResult{}, fmt.Errorf("%s: %s: %w", name, out, err)
		}
		if r.StepSeconds <= 0 || r.PeakBytes <= 0 {
			return StepResult{}, fmt.Errorf("%s: %s has no step time or peak", name, out)
		}
		return r, nil
	}
}

// WriteAutopilotRun prints the benchmark: per case its global options (planned total, measured peak, step time,
// throughput) and per budget the autopilot's plan against uniform gradient checkpointing and the best fitting
// global option; then the problems, if any.
func WriteAutopilotRun(w io.Writer, run AutopilotRun) error {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	m := run.Machine
	p("memory autopilot benchmark (%s), backend %s", run.Date, run.Backend)
	p("machine: %s, %d cores, %s memory, %s", m.CPU, m.Cores, memory.FormatBytesPrec(m.MemBytes, 1), m.OS)
	if run.Command != "" {
		p("command: %s", run.Command)
	}
	p("budgets: fractions of plain's planned total; the autopilot keeps a %.0f%% margin and times each mode with %d steps (two passes)",
		100*run.Margin, run.CalibSteps)
	p("each run configuration trains in its own process, %d rounds over all of them, each 1 warm-up + %d timed steps; step: the median of the rounds' medians (range: every timed step)",
		run.Rounds, run.Steps)
	for _, r := range run.Results {
		c := r.Case
		p("")
		kind := "run"
		if !c.Run {
			kind = fmt.Sprintf("planned only; step times are %s's measured ratios, in units of the ms-norm step", c.Sibling)
		}
		p("== %s (%s): %s, %d blocks, %s", c.Name, kind, c.Describe, r.Blocks, c.Method)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "configuration\tblock plan\tplanned total\tmeasured peak\tstep\tthroughput\t\n")
		for _, o := range r.Options {
			peak, step, thr := "-", fmt.Sprintf("%.3f", o.StepSeconds), "-"
			if o.PeakBytes > 0 || o.PeakMethod != "" {
				peak = memory.FormatPeakCell(o.PeakBytes, o.PeakMethod, 3)
			}
			if !o.Predicted {
				step = fmt.Sprintf("%.3f s (%.3f-%.3f)", o.StepSeconds, o.StepMin, o.StepMax)
				thr = fmt.Sprintf("%.1f %s", o.PerSecond, o.Unit)
			} else {
				step += "x"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", o.Name, o.BlockPlan, memory.FormatBytes(o.PlannedBytes), peak, step, thr)
		}
		tw.Flush()
		p("")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "budget\tplan\tplanned\tpeak\tfits\tstep\tx grad-ckpt\tbest global that fits\tx best\t\n")
		for _, row := range r.Rows {
			b := fmt.Sprintf("%.0f%% = %s", 100*row.Fraction, memory.FormatBytes(row.BudgetBytes))
			if row.Plan == "" {
				fmt.Fprintf(tw, "%s\t%s\t\t\t\t\t\t\t\t\n", b, row.NoFit)
				continue
			}
			mm := row.Measured
			peak, step := "-", fmt.Sprintf("%.3fx", mm.StepSeconds)
			if mm.PeakBytes > 0 || mm.PeakMethod != "" {
				peak = memory.FormatPeakCell(mm.PeakBytes, mm.PeakMethod, 3)
			}
			if !mm.Predicted {
				step = fmt.Sprintf("%.3f s", mm.StepSeconds)
			}
			gc := fmt.Sprintf("%.3f", row.VsGradCkpt)
			if !row.GradCkptFits {
				gc += " (does not fit)"
			}
			best, vs := "none", "-"
			if row.BestGlobal != "" {
				best, vs = row.BestGlobal, fmt.Sprintf("%.3f", row.VsBestGlobal)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", b, row.Plan, memory.FormatBytes(row.PlannedBytes), peak,
				yesNo(row.Fits), step, gc, best, vs)
		}
		tw.Flush()
		writeAlternatives(w, r)
	}
	p("")
	if len(run.Results) > 0 && len(run.Results[0].Options) > 0 && run.Results[0].Options[0].PeakMethod != "" {
		p("peak: %s", run.Results[0].Options[0].PeakMethod)
	}
	p("planned total: the exact planner's step peak + optimizer state (what the autopilot checks every plan with)")
	if len(run.Problems) == 0 {
		p("every plan fits its budget and runs at least as fast as uniform gradient checkpointing and every global option that fits")
	}
	for _, pr := range run.Problems {
		p("PROBLEM: %s", pr)
	}
	return nil
}

// writeAlternatives prints, per budget, the plans of the fast calibration and the cost model beside the full
// calibration's: the same plan, or the other plan's step against the full one's, whether it fits, and how long
// the autopilot took.
func writeAlternatives(w io.Writer, r AutopilotResult) {
	if len(r.Rows) == 0 || len(r.Rows[0].Alternatives) == 0 {
		return
	}
	fmt.Fprintf(w, "\nthe same budgets planned from other step times (x full: the full calibration plan's step over this plan's, %s):\n",
		map[bool]string{true: "measured", false: "predicted from the sibling's ratios"}[r.Case.Run])
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "budget\tfull calibration\t")
	for _, a := range r.Rows[0].Alternatives {
		fmt.Fprintf(tw, "%s\tx full\tfits\ttook\t", a.Source)
	}
	fmt.Fprintf(tw, "\n")
	for _, row := range r.Rows {
		full := row.Plan
		if full == "" {
			full = "none fits"
		}
		fmt.Fprintf(tw, "%.0f%%\t%s\t", 100*row.Fraction, full)
		for _, a := range row.Alternatives {
			switch {
			case a.Plan == "":
				fmt.Fprintf(tw, "none fits\t-\t-\t%.1f s\t", a.Seconds)
			case a.Same:
				fmt.Fprintf(tw, "same\t1.000\t%s\t%.1f s\t", yesNo(a.Fits), a.Seconds)
			default:
				fmt.Fprintf(tw, "%s\t%.3f\t%s\t%.1f s\t", a.Plan, a.VsFull, yesNo(a.Fits), a.Seconds)
			}
		}
		fmt.Fprintf(tw, "\n")
	}
	tw.Flush()
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "NO"
}
