package cli_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/plan"
)

// TestMemoryPlan: memory --budget --plan prints the modes' figures and a plan whose exact total fits the budget
// less its margin; the JSON form carries the same plan; a second run reads the calibration from the cache. The
// first run shows its progress (a line per mode and step of the fast calibration), says where its step times
// came from and prints each block's mode, saving and extra time, and the next-best plan; --calibrate=false and
// --for-backend xla:cuda plan from the cost model without timing.
func TestMemoryPlan(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	args := []string{"memory", "--model", "vit:tiny", "--num-labels", "10", "--lora-targets", "q,v", "--train-modules", "classifier",
		"--batch-size", "4", "--budget", "1.2MiB", "--plan"}
	out, firstErr, code := run(t, args...)
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, firstErr)
	}
	for _, want := range []string{"memory autopilot: budget 1.200 MiB less 5% margin", "approx-act+mesa", "grad-ckpt", "plan: "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	js, stderr, code := run(t, append(args, "--json")...)
	if code != 0 {
		t.Fatalf("--json: exit %d\n%s", code, stderr)
	}
	var got struct {
		Autoplan plan.Autoplan `json:"autoplan"`
	}
	if err := json.Unmarshal([]byte(js), &got); err != nil {
		t.Fatal(err)
	}
	p := got.Autoplan
	if p.PlannedBytes > p.Limit || p.Limit != limitOf(1.2*(1<<20), 0.05) || !strings.Contains(out, "plan: "+p.Plan+"\n") {
		t.Errorf("plan %q: planned %d, limit %d", p.Plan, p.PlannedBytes, p.Limit)
	}
	// The first run timed the modes (fast calibration, progress on stderr), the JSON run read them from the cache.
	for _, want := range []string{"memory autopilot: planning 4 modes on 2 blocks", "fast calibration: plain           on 1 block(s), batch 4: warm-up",
		"fast calibration: grad-ckpt       on 1 block(s), batch 4: step 2/2", "fast calibration: plain           on 2 block(s)", "candidates checked by the exact planner"} {
		if !strings.Contains(firstErr, want) {
			t.Errorf("progress lacks %q:\n%s", want, firstErr)
		}
	}
	for _, want := range []string{"step times: fast calibration: [1 2] block(s) of the real width, batch 4, 2 timed steps per mode (the real shape)",
		"per block (the backward reaches block 0 last):", "  blocks", "next-best plan"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if p.Source != plan.SourceFast || !p.Cached || len(p.Blocks) != 2 || p.Blocks[0].Mode == "" {
		t.Errorf("JSON plan: source %q cached %v blocks %+v", p.Source, p.Cached, p.Blocks)
	}
	for i, b := range p.Blocks {
		c := p.Costs[slices.IndexFunc(p.Costs, func(c plan.ModeCost) bool { return c.Mode == b.Mode })]
		if b.Block != i || b.SavedBytes != (p.Costs[0].TotalBytes-c.TotalBytes)/2 {
			t.Errorf("block %d: %+v, its mode saves %d bytes a block", i, b, (p.Costs[0].TotalBytes-c.TotalBytes)/2)
		}
	}
	if n := p.NextBest; n != nil && !(n.TotalBytes > p.Limit && n.PredictedSeconds < p.PredictedSeconds) {
		t.Errorf("the next-best plan %+v fits %d or is not faster than %g s", n, p.Limit, p.PredictedSeconds)
	}
	// The cost model: --calibrate=false (this machine's profile) and --for-backend (a GPU's), no step timed.
	for _, extra := range [][]string{{"--calibrate=false"}, {"--for-backend", "xla:cuda"}} {
		js, stderr, code := run(t, append(append(args, extra...), "--json")...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s", extra, code, stderr)
		}
		var cm struct {
			Autoplan plan.Autoplan `json:"autoplan"`
		}
		if err := json.Unmarshal([]byte(js), &cm); err != nil {
			t.Fatal(err)
		}
		q := cm.Autoplan
		if q.Source != plan.SourceCostModel || q.Profile == nil || q.Why == "" || q.PlannedBytes > q.Limit || strings.Contains(stderr, "fast calibration:") {
			t.Errorf("%v: source %q profile %+v why %q, planned %d limit %d\n%s", extra, q.Source, q.Profile, q.Why, q.PlannedBytes, q.Limit, stderr)
		}
		if extra[0] == "--for-backend" && (q.Profile.Backend != "xla:cuda" || !strings.Contains(q.Why, "H100")) {
			t.Errorf("--for-backend xla:cuda planned with %+v (%s)", q.Profile, q.Why)
		}
		// A plan for XLA made on this backend takes only the modes measured to lower XLA's device peak
		// (plan.XLACUDAModes, with its reason and how to lift it): the pure-Go planner's Mesa and checkpointing
		// savings did not hold on an H200 (plancheck-h200).
		if extra[0] == "--for-backend" {
			var modes []string
			for _, c := range q.Costs {
				modes = append(modes, c.Mode)
			}
			if !slices.Equal(modes, plan.XLACUDAModes.Modes) || strings.Contains(q.Plan, "mesa") || strings.Contains(q.Plan, "grad-ckpt") ||
				!strings.Contains(q.Why, plan.XLACUDAModes.Reason) || q.Profile.Restrict == nil || q.Profile.Restrict.Lift == "" {
				t.Errorf("--for-backend xla:cuda: modes %v, plan %s (%s)", modes, q.Plan, q.Why)
			}
		}
	}
	if _, stderr, code := run(t, "memory", "--model", "vit:tiny", "--plan"); code != 2 || !strings.Contains(stderr, "--budget") {
		t.Errorf("--plan without --budget: exit %d %s", code, stderr)
	}
	if _, stderr, code := run(t, append(args[:len(args)-3], "--budget", "10KiB", "--plan")...); code != 1 || !strings.Contains(stderr, "smallest total reachable") {
		t.Errorf("an impossible budget: exit %d %s", code, stderr)
	}
}

// TestTrainBudget: train --budget chooses the per-block plan before training, prints it, saves it as block_plan
// in run.yaml, and trains with it; --budget with a model-wide option it would choose is refused.
func TestTrainBudget(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	tmp, model, data := vitFixture(t)
	out := filepath.Join(tmp, "run")
	_, stderr, code := run(t, "train", "--model", model, "--data", data, "--out", out, "--steps", "2", "--batch-size", "4",
		"--train-modules", "classifier", "--budget", "1.2MiB")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "memory autopilot: budget 1.200 MiB") || !strings.Contains(stderr, "plan: ") {
		t.Errorf("the plan is not printed:\n%s", stderr)
	}
	raw, err := os.ReadFile(filepath.Join(out, finetune.RunFile))
	if err != nil {
		t.Fatal(err)
	}
	var spec finetune.RunSpec
	if err := yaml.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	if spec.Config.BlockPlan == "" || !strings.Contains(stderr, "plan: "+spec.Config.BlockPlan+"\n") {
		t.Errorf("run.yaml block_plan %q is not the printed plan", spec.Config.BlockPlan)
	}
	out3 := filepath.Join(tmp, "run3")
	_, stderr, code = run(t, "train", "--model", model, "--data", data, "--out", out3, "--steps", "1", "--batch-size", "4",
		"--train-modules", "classifier", "--budget", "1.2MiB", "--budget-batch")
	if code != 0 {
		t.Fatalf("--budget-batch: exit %d\n%s", code, stderr)
	}
	raw, _ = os.ReadFile(filepath.Join(out3, finetune.RunFile))
	var spec3 finetune.RunSpec
	if err := yaml.Unmarshal(raw, &spec3); err != nil {
		t.Fatal(err)
	}
	if c := spec3.Config; c.BatchSize*c.AccumSteps != 4 || !strings.Contains(stderr, fmt.Sprintf("micro-batch %d x %d", c.BatchSize, c.AccumSteps)) {
		t.Errorf("--budget-batch saved micro-batch %d x %d, printed:\n%s", c.BatchSize, c.AccumSteps, stderr)
	}
	if _, stderr, code := run(t, "train", "--model", model, "--data", data, "--out", filepath.Join(tmp, "run4"), "--budget-batch"); code != 2 || !strings.Contains(stderr, "go with --budget") {
		t.Errorf("--budget-batch without --budget: exit %d %s", code, stderr)
	}
	_, stderr, code = run(t, "train", "--model", model, "--data", data, "--out", filepath.Join(tmp, "run2"), "--steps", "1",
		"--budget", "1.2MiB", "--approx-act")
	if code == 0 || !strings.Contains(stderr, "leave --approx-act") {
		t.Errorf("--budget with --approx-act: exit %d %s", code, stderr)
	}
}

// limitOf is the autopilot's limit for a budget and margin, computed as it does.
func limitOf(budget float64, margin float64) int64 {
	b := int64(budget)
	return int64(float64(b) * (1 - margin))
}
