package plan_test

import (
	"fmt"
	"math"
	"strings"
	"testing"

	vitfam "github.com/memfit/memfit/family/vit"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models/vit"
	"github.com/memfit/memfit/plan"
)

// TestChooseBlockPlanIsOptimal: on synthetic mode costs, the autopilot's choice has the lowest time among all
// 4^6 per-block assignments whose additive total fits, for budgets from loose to impossible.
func TestChooseBlockPlanIsOptimal(t *testing.T) {
	const blocks = 6
	costs := []plan.ModeCost{
		{Mode: "plain", TotalBytes: 1000, StepSeconds: 1.0},
		{Mode: "approx-act", TotalBytes: 880, StepSeconds: 1.01},
		{Mode: "approx-act+mesa", TotalBytes: 700, StepSeconds: 1.12},
		{Mode: "grad-ckpt", TotalBytes: 520, StepSeconds: 1.30},
	}
	additive := func(plan string) (int64, error) {
		total := float64(costs[0].TotalBytes)
		for _, entry := range strings.Split(plan, ",") {
			var mode string
			var n int
			i := strings.LastIndex(entry, "*")
			mode, _ = entry[:i], 0
			fmt.Sscanf(entry[i+1:], "%d", &n)
			for _, c := range costs {
				if c.Mode == mode {
					total -= float64(n) * float64(costs[0].TotalBytes-c.TotalBytes) / blocks
				}
			}
		}
		return int64(math.Round(total)), nil
	}
	for _, limit := range []int64{1000, 950, 900, 800, 700, 600, 530, 519} {
		best := math.Inf(1)
		assignment := make([]int, blocks)
		for code := 0; code < 1<<(2*blocks); code++ {
			bytes, secs := float64(costs[0].TotalBytes), costs[0].StepSeconds
			for b := range assignment {
				m := (code >> (2 * b)) & 3
				bytes -= float64(costs[0].TotalBytes-costs[m].TotalBytes) / blocks
				secs += (costs[m].StepSeconds - costs[0].StepSeconds) / blocks
			}
			if bytes <= float64(limit)+1e-9 && secs < best {
				best = secs
			}
		}
		got, err := plan.ChooseBlockPlan(costs, blocks, limit, additive)
		if math.IsInf(best, 1) {
			if err == nil || !strings.Contains(err.Error(), "smallest total reachable is 520 B") {
				t.Errorf("limit %d: nothing fits, got %v / %v", limit, got, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("limit %d: %v", limit, err)
		}
		if math.Abs(got.PredictedSeconds-best) > 1e-12 || got.PlannedBytes > limit {
			t.Errorf("limit %d: chose %s (%.4f s, %d B), the best assignment takes %.4f s", limit, got.Plan, got.PredictedSeconds, got.PlannedBytes, best)
		}
	}
}

// TestAutopilotOnThePlanner: for a tiny ViT's real step (exact planner), budgets at 95%, 80%, 65% and 50% of the
// plain total each get a plan whose exact total fits, predicted no slower than checkpointing every block; the
// calibration measures each mode and leaves the model's options as they were.
func TestAutopilotOnThePlanner(t *testing.T) {
	model, data := imageTask(t, vit.Options{})
	cfg := config(finetune.MethodLoRA, 1)
	cfg.TrainModules = []string{"classifier"}
	in := finetune.Shape{Batch: 6}
	backend := gtest.Backend(t)
	costs, err := plan.ModeCosts(backend, model, cfg, in, plan.AutopilotModes)
	if err != nil {
		t.Fatal(err)
	}
	loader, _ := finetune.NewLoader(data, 6, 1, false)
	batch, _ := loader.Next()
	if err := plan.CalibrateModes(plan.AutopilotOptions{Backend: backend, Model: model, Config: cfg, Batch: batch, CalibSteps: 2}, costs); err != nil {
		t.Fatal(err)
	}
	if blocks := model.(vitfam.Model).Options.Blocks; blocks != nil {
		t.Errorf("calibration left the plan %v on the model", blocks)
	}
	for _, c := range costs {
		if !(c.StepSeconds > 0) || c.TotalBytes <= 0 {
			t.Fatalf("mode %s: %+v", c.Mode, c)
		}
	}
	if !(costs[3].TotalBytes < costs[0].TotalBytes) {
		t.Fatalf("grad-ckpt plans %d bytes, plain %d", costs[3].TotalBytes, costs[0].TotalBytes)
	}
	verify := func(p string) (int64, error) { return plan.Total(backend, model, cfg, in, p) }
	smallest := costs[0].TotalBytes
	for _, c := range costs {
		smallest = min(smallest, c.TotalBytes)
	}
	for _, frac := range []float64{0.95, 0.80, 0.65, 0.50} {
		limit := int64(frac * float64(costs[0].TotalBytes))
		got, err := plan.ChooseBlockPlan(costs, 2, limit, verify)
		if limit < smallest && err != nil {
			continue // below what any mode on every block reaches: may be refused with the smallest total
		}
		if err != nil {
			t.Fatalf("%.0f%%: %v", 100*frac, err)
		}
		if got.PlannedBytes > limit {
			t.Errorf("%.0f%%: %s plans %d bytes over the limit %d", 100*frac, got.Plan, got.PlannedBytes, limit)
		}
		for _, c := range costs {
			if c.TotalBytes <= limit && got.PredictedSeconds > c.StepSeconds+1e-12 {
				t.Errorf("%.0f%%: %s predicted slower than %s on every block, which fits too", 100*frac, got.Plan, c.Mode)
			}
		}
		t.Logf("%.0f%% of %d: %s, planned %d bytes, predicted %.4f s", 100*frac, costs[0].TotalBytes, got.Plan, got.PlannedBytes, got.PredictedSeconds)
	}
	if _, err := plan.ChooseBlockPlan(costs, 2, smallest/2, verify); err == nil || !strings.Contains(err.Error(), "smallest total reachable") {
		t.Errorf("an impossible budget: %v", err)
	}
}

// TestAutopilotBatch: with a budget that no plan of the full micro-batch fits but a smaller one does, the
// autopilot takes a divisor of the effective batch with accumulation making up the rest, and its plan fits.
func TestAutopilotBatch(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	model, _ := imageTask(t, vit.Options{})
	cfg := config(finetune.MethodLoRA, 1)
	cfg.TrainModules = []string{"classifier"}
	cfg.BatchSize = 12
	backend := gtest.Backend(t)
	lightest := func(b int) int64 {
		c := cfg
		c.BatchSize = b
		costs, err := plan.ModeCosts(backend, model, c, finetune.Shape{Batch: b}, plan.AutopilotModes)
		if err != nil {
			t.Fatal(err)
		}
		out := costs[0].TotalBytes
		for _, m := range costs {
			out = min(out, m.TotalBytes)
		}
		return out
	}
	full, half := lightest(12), lightest(6)
	if half >= full {
		t.Fatalf("a micro-batch of 6 plans %d bytes at the least, 12 plans %d", half, full)
	}
	budget := (full + half) / 2 // margin 0: the limit is the budget
	p, err := plan.AutopilotBatch(plan.AutopilotOptions{Backend: backend, Model: model, Config: cfg, Budget: budget, CalibSteps: 1, Cache: plan.DefaultCalibrationCache()})
	if err != nil {
		t.Fatal(err)
	}
	if p.BatchSize >= 12 || 12%p.BatchSize != 0 || p.BatchSize*p.AccumSteps != 12 || p.PlannedBytes > budget {
		t.Errorf("micro-batch %d x %d, plan %s planned %d bytes, budget %d", p.BatchSize, p.AccumSteps, p.Plan, p.PlannedBytes, budget)
	}
	if _, err := plan.AutopilotBatch(plan.AutopilotOptions{Backend: backend, Model: model, Config: cfg, Budget: lightest(1) / 2, CalibSteps: 1}); err == nil || !strings.Contains(err.Error(), "no micro-batch dividing the effective batch 12") {
		t.Errorf("an impossible budget: %v", err)
	}
}
