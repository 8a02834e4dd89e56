package bench

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/plan"
)

// TestRunAutopilot runs the autopilot benchmark on a tiny LLaMA (run, its configurations trained in this process
// instead of their own) and the same model at a larger shape (planned from the run case's ratios), and checks
// what the table claims: the budgets are fractions of plain's total, every plan's exact total is within its
// limit and its peak within the budget, the comparisons are the figures' ratios, and a budget nothing fits is one
// line naming the smallest total.
func TestRunAutopilot(t *testing.T) {
	// One matmul worker: on the default pool the simulation counts every worker's large-product buffers (with
	// compute v0.1.14's AVX-512 kernels, four 4.5 MiB sets), which on these tiny steps outweigh everything the
	// block plans can save, so no middle budget would be reachable.
	backend, err := engine.NewBackend("go:parallelism=1")
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	dir := t.TempDir()
	ckpt, err := PresetCheckpoint("llama:tiny", 0, dir)
	if err != nil {
		t.Fatal(err)
	}
	method, _ := GridMethodByName("lora-all")
	cfg := method.Apply(finetune.Defaults())
	cases := []AutopilotCase{
		{Name: "run", Model: ckpt, Shape: finetune.Shape{Batch: 2, Seq: 32}, Config: cfg, Method: method.Name, Run: true},
		{Name: "planned", Model: "llama:tiny", Shape: finetune.Shape{Batch: 4, Seq: 64}, Config: cfg, Method: method.Name, Sibling: "run"},
	}
	var ran []string
	runner := func(c AutopilotCase, msNorm bool, plan, name string) (StepResult, error) {
		ran = append(ran, name)
		base := c.Config
		base.BlockPlan = plan
		v, _ := finetune.VariantByName("plain")
		if msNorm {
			v, _ = finetune.VariantByName("ms-norm")
		}
		return RunStep(backend, c.Model, c.Shape, base, method, v, 1, nil)
	}
	fractions := []float64{0.95, 0.85, 0.05}
	run, err := RunAutopilot(AutopilotOptions{Backend: backend, Cases: cases, Fractions: fractions, Margin: 0.05, CalibSteps: 1, Steps: 1,
		Runner: runner, Cache: &plan.CalibrationCache{Path: filepath.Join(dir, "calibration.json")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(run.Results) != 2 {
		t.Fatalf("%d results", len(run.Results))
	}
	for _, r := range run.Results {
		if r.Blocks != 2 || len(r.Rows) != len(fractions) || len(r.Options) < len(GlobalOptions) {
			t.Fatalf("%s: %d blocks, %d rows, %d options", r.Case.Name, r.Blocks, len(r.Rows), len(r.Options))
		}
		plain := r.Options[0]
		for i, o := range r.Options {
			if o.PlannedBytes <= 0 || o.StepSeconds <= 0 || o.Predicted == r.Case.Run {
				t.Errorf("%s %s: %+v", r.Case.Name, o.Name, o)
			}
			if i < len(GlobalOptions) && (o.Name != GlobalOptions[i].Name || o.PlannedBytes > plain.PlannedBytes) {
				t.Errorf("%s: option %d is %s with %d bytes (plain %d)", r.Case.Name, i, o.Name, o.PlannedBytes, plain.PlannedBytes)
			}
			if r.Case.Run && (o.PeakBytes <= 0 || o.PeakMethod == "") {
				t.Errorf("%s %s: no peak", r.Case.Name, o.Name)
			}
		}
		if r.Case.Run && r.Options[2].StepSeconds <= 0 {
			t.Fatal("no ms-norm step")
		}
		for i, row := range r.Rows {
			if want := int64(fractions[i] * float64(plain.PlannedBytes)); row.BudgetBytes != want || row.LimitBytes != int64(0.95*float64(want)) {
				t.Errorf("%s row %d: budget %d limit %d, want %d", r.Case.Name, i, row.BudgetBytes, row.LimitBytes, want)
			}
			if fractions[i] == 0.05 {
				if row.Plan != "" || !strings.Contains(row.NoFit, "smallest total reachable") {
					t.Errorf("%s at 5%%: plan %q, no-fit line %q", r.Case.Name, row.Plan, row.NoFit)
				}
				continue
			}
			if row.Plan == "" || row.Measured == nil {
				t.Fatalf("%s row %d: no plan (%s)", r.Case.Name, i, row.NoFit)
			}
			if row.PlannedBytes > row.LimitBytes || row.Measured.BlockPlan != row.Plan || row.Measured.PlannedBytes != row.PlannedBytes {
				t.Errorf("%s row %d: plan %s total %d over the limit %d, or measured %+v", r.Case.Name, i, row.Plan, row.PlannedBytes, row.LimitBytes, row.Measured)
			}
			peak := row.Measured.PeakBytes
			if !r.Case.Run {
				peak = row.PlannedBytes
			}
			if row.Fits != (peak <= row.BudgetBytes) {
				t.Errorf("%s row %d: fits %v with peak %d, budget %d", r.Case.Name, i, row.Fits, peak, row.BudgetBytes)
			}
			gc := r.Options[1]
			if got, want := row.VsGradCkpt, gc.StepSeconds/row.Measured.StepSeconds; got != want || row.GradCkptFits != (gc.PlannedBytes <= row.LimitBytes) {
				t.Errorf("%s row %d: x grad-ckpt %g, want %g", r.Case.Name, i, got, want)
			}
			if row.BestGlobal == "" {
				t.Errorf("%s row %d: no global option fits %d bytes", r.Case.Name, i, row.LimitBytes)
			}
			// The fast calibration's and the cost model's plans at the same budget: measured (run case) or
			// predicted, their exact totals within the limit, compared with the full calibration's plan.
			if r.Case.Run && row.Source != plan.SourceFull {
				t.Errorf("%s row %d: the reference plan's step times came from %q, want the full calibration", r.Case.Name, i, row.Source)
			}
			if len(row.Alternatives) != 2 || row.Alternatives[0].Source != plan.SourceFast || row.Alternatives[1].Source != plan.SourceCostModel {
				t.Fatalf("%s row %d: alternatives %+v", r.Case.Name, i, row.Alternatives)
			}
			for _, a := range row.Alternatives {
				if a.Plan == "" || a.Measured == nil || a.Planned > row.LimitBytes || a.Same != (a.Plan == row.Plan) || !(a.Seconds > 0) {
					t.Errorf("%s row %d, %s: %+v", r.Case.Name, i, a.Source, a)
					continue
				}
				if want := row.Measured.StepSeconds / a.Measured.StepSeconds; a.VsFull != want {
					t.Errorf("%s row %d, %s: x full %g, want %g", r.Case.Name, i, a.Source, a.VsFull, want)
				}
				if r.Case.Run && a.Fits != (a.Measured.PeakBytes <= row.BudgetBytes) {
					t.Errorf("%s row %d, %s: fits %v with peak %d, budget %d", r.Case.Name, i, a.Source, a.Fits, a.Measured.PeakBytes, row.BudgetBytes)
				}
			}
		}
	}
	// The planned case's times are the run case's ratios to its ms-norm step.
	rc, pc := run.Results[0], run.Results[1]
	for i := range GlobalOptions {
		if got, want := pc.Options[i].StepSeconds, rc.Options[i].StepSeconds/rc.Options[2].StepSeconds; got != want {
			t.Errorf("planned %s: %g, want the ratio %g", pc.Options[i].Name, got, want)
		}
	}
	if len(ran) != len(rc.Options) { // every alternative plan that is no other configuration is run too
		t.Errorf("%d processes for %d configurations", len(ran), len(rc.Options))
	}
	var out bytes.Buffer
	if err := WriteAutopilotRun(&out, run); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"== run (run)", "== planned (planned only", "x grad-ckpt", "smallest total reachable", "grad-ckpt+ms-norm",
		"the same budgets planned from other step times", "fast calibration", "cost model"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the table has no %q:\n%s", want, out.String())
		}
	}
}
