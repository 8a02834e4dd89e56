package finetune_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/vit"
)

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol*math.Max(1, math.Abs(b)) }

// TestEvaluateMatchesReference: the whole-set validation numbers equal independent references: a classifier's
// loss is the mean cross entropy over examples (Trainer.MeanLoss in one batch) and its accuracy finetune.Accuracy;
// a language model's loss is the mean over target tokens (each example's loss times its targets, labels -100
// left out), its perplexity exp(loss); uneven last batches change nothing.
func TestEvaluateMatchesReference(t *testing.T) {
	t.Run("classifier", func(t *testing.T) {
		cfg := config(finetune.MethodLoRA, 4)
		cfg.TrainModules = []string{"classifier"}
		model, data := imageTask(t, vit.Options{})
		_, tr := fit(t, model, data, cfg, 6)
		tr.Config.BatchSize = 5 // 24 examples: 5, 5, 5, 5, 4
		got, err := tr.Evaluate(finetune.ExamplesEval{Examples: data})
		if err != nil {
			t.Fatal(err)
		}
		wantLoss, err := tr.MeanLoss(data, data.Len())
		if err != nil {
			t.Fatal(err)
		}
		wantAcc, err := finetune.Accuracy(tr.Logits, data, data.Len())
		if err != nil {
			t.Fatal(err)
		}
		if !near(got.Loss, wantLoss, 1e-5) || got.Accuracy == nil || *got.Accuracy != wantAcc || got.Examples != 24 || got.Perplexity != 0 {
			t.Errorf("evaluation %+v (accuracy %v), want loss %v accuracy %v over 24 examples", got, got.Accuracy, wantLoss, wantAcc)
		}
		t.Logf("loss %.5f accuracy %.3f", got.Loss, *got.Accuracy)
	})
	t.Run("language model", func(t *testing.T) {
		cfg := config(finetune.MethodLoRA, 4)
		model, data := textTask(t, decoder.Options{})
		// Leave out the first 5 label positions of every other example: the examples weigh by their targets.
		var labels []int32
		data["labels"].MustConstFlatData(func(f any) { labels = slices.Clone(f.([]int32)) })
		n, seq := data["labels"].Shape().Dim(0), data["labels"].Shape().Dim(1)
		for i := 0; i < n; i += 2 {
			for j := 0; j < 5; j++ {
				labels[i*seq+j] = -100
			}
		}
		data["labels"] = tensors.FromFlatDataAndDimensions(labels, n, seq)
		_, tr := fit(t, model, data, cfg, 4)
		tr.Config.BatchSize = 3 // 16 examples: 3, 3, 3, 3, 3, 1
		got, err := tr.Evaluate(finetune.ExamplesEval{Examples: data})
		if err != nil {
			t.Fatal(err)
		}
		params, set := tr.Current()
		var sum float64
		targets := 0
		for i := 0; i < n; i++ {
			one := finetune.Examples{}
			for name, x := range data {
				one[name] = rowOf(t, x, i)
			}
			l, err := finetune.Loss(tr.Backend, tr.Model, params, set, finetune.Batch(one))
			if err != nil {
				t.Fatal(err)
			}
			k := 0
			for j := 1; j < seq; j++ {
				if labels[i*seq+j] != -100 {
					k++
				}
			}
			sum += l * float64(k)
			targets += k
		}
		want := sum / float64(targets)
		if !near(got.Loss, want, 1e-5) || got.Tokens != targets || !near(got.Perplexity, math.Exp(want), 1e-5) || got.Accuracy != nil {
			t.Errorf("evaluation %+v, want loss %v over %d tokens, perplexity %v", got, want, targets, math.Exp(want))
		}
		t.Logf("loss %.5f perplexity %.3f over %d tokens", got.Loss, got.Perplexity, got.Tokens)
	})
}

// rowOf returns row i of x as a one-row tensor.
func rowOf(t *testing.T, x *tensors.Tensor, i int) *tensors.Tensor {
	t.Helper()
	dims := slices.Clone(x.Shape().Dimensions)
	per := 1
	for _, d := range dims[1:] {
		per *= d
	}
	dims[0] = 1
	var out *tensors.Tensor
	x.MustConstFlatData(func(f any) {
		switch v := f.(type) {
		case []int32:
			out = tensors.FromFlatDataAndDimensions(slices.Clone(v[i*per:(i+1)*per]), dims...)
		case []float32:
			out = tensors.FromFlatDataAndDimensions(slices.Clone(v[i*per:(i+1)*per]), dims...)
		default:
			t.Fatalf("dtype %s", x.DType())
		}
	})
	return out
}

// indexed returns n examples whose "x" is their index, labelled i mod 3.
func indexed(n int) finetune.Examples {
	x := make([]float32, n)
	l := make([]int32, n)
	for i := range x {
		x[i], l[i] = float32(i), int32(i%3)
	}
	return finetune.Examples{"x": tensors.FromFlatDataAndDimensions(x, n, 1), "labels": tensors.FromFlatDataAndDimensions(l, n)}
}

func indices(t *testing.T, ex finetune.Examples) []int {
	t.Helper()
	var out []int
	ex["x"].MustConstFlatData(func(f any) {
		for _, v := range f.([]float32) {
			out = append(out, int(v))
		}
	})
	return out
}

// TestHoldOut: --eval-split holds out ceil(frac x N) examples drawn from the seed, disjoint from the training
// part (which never yields one of them, over several epochs), the same for the same seed, other for another; a
// split that leaves less than a batch is refused in one line.
func TestHoldOut(t *testing.T) {
	split := func(seed uint64) (*finetune.Loader, []int) {
		l, err := finetune.NewLoader(indexed(20), 4, seed, true)
		if err != nil {
			t.Fatal(err)
		}
		it, ev, err := finetune.HoldOut(l, 0.22, seed, 4)
		if err != nil {
			t.Fatal(err)
		}
		return it.(*finetune.Loader), indices(t, ev.(finetune.ExamplesEval).Examples)
	}
	train, held := split(7)
	if len(held) != 5 || train.Data.Len() != 15 {
		t.Fatalf("held out %v, %d left: want 5 (ceil(0.22 x 20)) and 15", held, train.Data.Len())
	}
	all := append(indices(t, train.Data), held...)
	slices.Sort(all)
	for i, v := range all {
		if v != i {
			t.Fatalf("training part and hold-out together are %v, want 0..19 once each", all)
		}
	}
	for step := 0; step < 12; step++ { // three epochs
		b, err := train.Next()
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range indices(t, finetune.Examples(b)) {
			if slices.Contains(held, v) {
				t.Fatalf("the training loader yielded held-out example %d", v)
			}
		}
	}
	if _, again := split(7); !slices.Equal(again, held) {
		t.Errorf("seed 7 held out %v, then %v", held, again)
	}
	if _, other := split(8); slices.Equal(other, held) {
		t.Errorf("seeds 7 and 8 hold out the same examples %v", held)
	}
	l, _ := finetune.NewLoader(indexed(8), 4, 1, true)
	if _, _, err := finetune.HoldOut(l, 0.45, 1, 5); err == nil || !strings.Contains(err.Error(), "fewer than a batch") || strings.Contains(err.Error(), "\n") {
		t.Errorf("a split leaving 4 examples for batches of 5: %v", err)
	}
}

// evalRecords returns the "eval" records of a metrics log without their timings.
func evalRecords(t *testing.T, log []byte) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(log)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		if m["kind"] == "eval" {
			delete(m, "eval_seconds")
			out = append(out, m)
		}
	}
	return out
}

// mislabelled returns the first n examples of data with each label moved to the next class: a validation set
// whose loss rises as the model learns the training labels, so its best evaluation comes early.
func mislabelled(t *testing.T, data finetune.Examples, n int) finetune.Examples {
	t.Helper()
	out := finetune.Examples{}
	for name, x := range data {
		rows := make([]*tensors.Tensor, n)
		for i := range rows {
			rows[i] = rowOf(t, x, i)
		}
		out[name] = concatRows(t, rows)
	}
	var l []int32
	out["labels"].MustConstFlatData(func(f any) { l = slices.Clone(f.([]int32)) })
	for i := range l {
		l[i] = (l[i] + 1) % 3
	}
	out["labels"] = tensors.FromFlatDataAndDimensions(l, n)
	return out
}

func concatRows(t *testing.T, rows []*tensors.Tensor) *tensors.Tensor {
	t.Helper()
	dims := slices.Clone(rows[0].Shape().Dimensions)
	dims[0] = len(rows)
	var i32 []int32
	var f32 []float32
	for _, r := range rows {
		r.MustConstFlatData(func(f any) {
			switch v := f.(type) {
			case []int32:
				i32 = append(i32, v...)
			case []float32:
				f32 = append(f32, v...)
			}
		})
	}
	if i32 != nil {
		return tensors.FromFlatDataAndDimensions(i32, dims...)
	}
	return tensors.FromFlatDataAndDimensions(f32, dims...)
}

// TestValidationResumeIsExact: a run with evaluations every 2 steps, a best checkpoint and early stopping,
// interrupted after step 5 and resumed, logs the same evaluations (losses, accuracies, best, patience count) and
// stops at the same step as the run done in one go; the best checkpoint is an earlier step than the last and is
// kept though --keep-checkpoints 1 prunes the others.
func TestValidationResumeIsExact(t *testing.T) {
	cfg := config(finetune.MethodLoRA, 16)
	cfg.TrainModules = []string{"classifier"}
	cfg.EvalEvery, cfg.EarlyStoppingPatience, cfg.KeepCheckpoints, cfg.CheckpointEvery = 2, 3, 1, 3
	model, data := imageTask(t, vit.Options{})
	eval := finetune.ExamplesEval{Examples: mislabelled(t, data, 9)}
	run := func(out string, stopAt int) (*finetune.Trainer, []byte, error) {
		tr, err := finetune.New(model, cfg, gtest.Backend(t))
		if err != nil {
			t.Fatal(err)
		}
		tr.Validation = eval
		loader, _ := finetune.NewLoader(data, 6, cfg.Seed, true)
		var log bytes.Buffer
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		hooks := finetune.Hooks{OnStep: func(s finetune.StepStats) {
			if s.Step == stopAt {
				cancel()
			}
		}}
		err = tr.Fit(ctx, loader, out, &log, hooks)
		return tr, log.Bytes(), err
	}
	whole, wholeLog, err := run(t.TempDir(), -1)
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	_, firstLog, err := run(out, 5)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("first part: %v", err)
	}
	loader, _ := finetune.NewLoader(data, 6, cfg.Seed, true)
	tr, err := finetune.Resume(out, model, gtest.Backend(t), loader)
	if err != nil {
		t.Fatal(err)
	}
	tr.Validation = eval
	var log bytes.Buffer
	if err := tr.Fit(context.Background(), loader, out, &log, finetune.Hooks{}); err != nil {
		t.Fatal(err)
	}
	want, got := evalRecords(t, wholeLog), evalRecords(t, append(firstLog, log.Bytes()...))
	if len(want) == 0 || len(got) != len(want) {
		t.Fatalf("%d evaluations resumed, %d in one go", len(got), len(want))
	}
	for i := range want {
		a, _ := json.Marshal(got[i])
		b, _ := json.Marshal(want[i])
		if !bytes.Equal(a, b) {
			t.Errorf("evaluation %d resumed:\n%s\nin one go:\n%s", i, a, b)
		}
	}
	st := tr.EvalState
	if st != whole.EvalState || tr.Step != whole.Step {
		t.Errorf("resumed run ends at step %d with %+v, the run in one go at %d with %+v", tr.Step, st, whole.Step, whole.EvalState)
	}
	if !st.Stopped || tr.Step >= cfg.Steps || st.BestStep >= tr.Step {
		t.Fatalf("want early stopping before step %d with the best evaluation earlier than the last: step %d, %+v", cfg.Steps, tr.Step, st)
	}
	t.Logf("stopped at step %d, best validation loss %.4f at step %d", tr.Step, st.BestLoss, st.BestStep)
	// best/ holds the best step's checkpoint, next to the last one; the others are pruned.
	var saved struct {
		Step int                `json:"step"`
		Eval finetune.EvalState `json:"eval"`
	}
	raw, err := os.ReadFile(filepath.Join(out, finetune.BestDir, finetune.StateFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &saved); err != nil || saved.Step != st.BestStep || saved.Eval.BestStep != st.BestStep {
		t.Errorf("best/ holds step %d (%+v, %v), want %d", saved.Step, saved.Eval, err, st.BestStep)
	}
	entries, _ := os.ReadDir(out)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{"best", "checkpoint-" + itoa(tr.Step), "latest"}; !slices.Equal(names, want) {
		t.Errorf("output folder holds %v, want %v", names, want)
	}
	// The best checkpoint resumes (and so exports) as the best step's weights: its validation loss is the best.
	best, err := finetune.Resume(filepath.Join(out, finetune.BestDir), model, gtest.Backend(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	if ev, err := best.Evaluate(eval); err != nil || ev.Loss != st.BestLoss {
		t.Errorf("the best checkpoint evaluates to %v (%v), want %v", ev.Loss, err, st.BestLoss)
	}
	// A resume of the stopped run trains no further.
	again, _ := finetune.Resume(out, model, gtest.Backend(t), nil)
	again.Validation = eval
	loader2, _ := finetune.NewLoader(data, 6, cfg.Seed, true)
	if err := again.Fit(context.Background(), loader2, "", nil, finetune.Hooks{}); err != nil || again.Step != tr.Step {
		t.Errorf("a resumed stopped run went on to step %d (%v)", again.Step, err)
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// TestBestFolderGuards: best/ counts as a run file (a new run refuses the folder, --overwrite removes it), and a
// kill while it was being replaced is cleaned up as for checkpoint-N: an aside best/ whose replacement never
// arrived is put back, a temporary one removed.
func TestBestFolderGuards(t *testing.T) {
	out := t.TempDir()
	mk := func(d string) {
		os.MkdirAll(filepath.Join(out, d), 0o755)
		os.WriteFile(filepath.Join(out, d, finetune.StateFile), []byte("{}"), 0o644)
	}
	mk(".best.old-1")
	mk(".best.tmp-2")
	if err := finetune.CleanStale(out); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(list(t, out), ","); got != "best" {
		t.Fatalf("after CleanStale: %s, want best (put back)", got)
	}
	if err := finetune.CheckFreshRun(out, false); err == nil || !strings.Contains(err.Error(), "best") {
		t.Errorf("a folder holding best/: %v", err)
	}
	if err := finetune.CheckFreshRun(out, true); err != nil || len(list(t, out)) != 0 {
		t.Errorf("--overwrite left %v (%v)", list(t, out), err)
	}
}
