package finetune_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/family/lm"
	vitfam "github.com/memfit/memfit/family/vit"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/vit"
)

// imageTask returns a tiny ViT classifier and a synthetic 3-class image set (class c = channel c brighter).
func imageTask(t *testing.T, opts vit.Options) (finetune.Model, finetune.Examples) {
	cfg, err := vit.Preset("tiny", 3)
	if err != nil {
		t.Fatal(err)
	}
	m, err := vit.New(cfg, vit.RandomParams(cfg, 1), opts)
	if err != nil {
		t.Fatal(err)
	}
	const n = 24
	r := rand.New(rand.NewPCG(5, 6))
	px := make([]float32, n*3*32*32)
	labels := make([]int32, n)
	for i := 0; i < n; i++ {
		c := i % 3
		labels[i] = int32(c)
		for ch := 0; ch < 3; ch++ {
			for k := 0; k < 32*32; k++ {
				v := float32(r.NormFloat64() * 0.3)
				if ch == c {
					v += 1
				}
				px[(i*3+ch)*1024+k] = v
			}
		}
	}
	return vitfam.Model{Model: m}, finetune.Examples{
		"pixel_values": tensors.FromFlatDataAndDimensions(px, n, 3, 32, 32),
		"labels":       tensors.FromFlatDataAndDimensions(labels, n),
	}
}

// textTask returns a tiny causal LM and sequences following t[i+1] = (5 t[i] + 3) mod 64.
func textTask(t *testing.T, opts decoder.Options) (finetune.Model, finetune.Examples) {
	cfg, err := llama.Preset("tiny", 0)
	if err != nil {
		t.Fatal(err)
	}
	m, err := decoder.New(cfg, decoder.RandomParams(cfg, 2), opts)
	if err != nil {
		t.Fatal(err)
	}
	const n, seq = 16, 12
	ids := make([]int32, n*seq)
	mask := make([]int32, n*seq)
	for i := 0; i < n; i++ {
		tok := int32(i*3 + 1)
		for j := 0; j < seq; j++ {
			ids[i*seq+j] = tok
			mask[i*seq+j] = 1
			tok = (5*tok + 3) % 64
		}
	}
	idsT := tensors.FromFlatDataAndDimensions(ids, n, seq)
	return lm.Model{Model: m, Spec: llama.Spec}, finetune.Examples{
		"input_ids": idsT, "attention_mask": tensors.FromFlatDataAndDimensions(mask, n, seq),
		"labels": tensors.FromFlatDataAndDimensions(append([]int32(nil), ids...), n, seq),
	}
}

func config(method string, steps int) finetune.Config {
	c := finetune.Defaults()
	c.Method = method
	c.Steps = steps
	c.LR = 3e-3
	c.LoRATarget = []string{"all-linear"}
	c.LogEvery = 1 // the tests read every step's loss: Fit reads it back at logging steps
	if method == finetune.MethodFull {
		c.LoRARank, c.LoRATarget, c.LR = 0, nil, 1e-3
	}
	return c
}

func fit(t *testing.T, model finetune.Model, data finetune.Examples, cfg finetune.Config, batch int) ([]finetune.StepStats, *finetune.Trainer) {
	t.Helper()
	tr, err := finetune.New(model, cfg, gtest.Backend(t))
	if err != nil {
		t.Fatal(err)
	}
	loader, err := finetune.NewLoader(data, batch, cfg.Seed, true)
	if err != nil {
		t.Fatal(err)
	}
	var stats []finetune.StepStats
	err = tr.Fit(context.Background(), loader, "", nil, finetune.Hooks{OnStep: func(s finetune.StepStats) { stats = append(stats, s) }})
	if err != nil {
		t.Fatal(err)
	}
	return stats, tr
}

func firstLast(stats []finetune.StepStats, k int) (float64, float64) {
	var a, b float64
	for i := 0; i < k; i++ {
		a += stats[i].Loss / float64(k)
		b += stats[len(stats)-1-i].Loss / float64(k)
	}
	return a, b
}

// TestLossGoesDown: for each method, plain and with the approximate activation + MS-norm, the loss of a tiny
// model on a tiny task falls clearly.
func TestLossGoesDown(t *testing.T) {
	for _, method := range []string{finetune.MethodFull, finetune.MethodLoRA, finetune.MethodLoRAFA} {
		for _, saving := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/saving=%v", method, saving), func(t *testing.T) {
				cfg := config(method, 30)
				if method != finetune.MethodFull {
					cfg.TrainModules = []string{"classifier"} // a new head trains next to the adapters
				}
				model, data := imageTask(t, vit.Options{ApproxActivation: saving, MSNorm: saving})
				stats, _ := fit(t, model, data, cfg, 6)
				a, b := firstLast(stats, 4)
				t.Logf("vit loss %.3f -> %.3f, saved %d bytes", a, b, stats[0].SavedActivationBytes)
				if b > 0.5*a {
					t.Errorf("ViT loss %.3f -> %.3f: did not fall by half", a, b)
				}
				cfg = config(method, 30)
				if method != finetune.MethodFull {
					cfg.TrainModules = []string{"lm_head"} // the output layer trains next to the adapters
				}
				lm, text := textTask(t, decoder.Options{ApproxActivation: saving, MSNorm: saving})
				stats, _ = fit(t, lm, text, cfg, 4)
				a, b = firstLast(stats, 4)
				t.Logf("llama loss %.3f -> %.3f", a, b)
				if b > 0.8*a {
					t.Errorf("LLaMA loss %.3f -> %.3f: did not fall by a fifth", a, b)
				}
			})
		}
	}
}

func tensorsEqual(t *testing.T, a, b *tensors.Tensor) bool {
	var x, y []byte
	_ = a.ConstBytes(func(d []byte) { x = append([]byte(nil), d...) })
	_ = b.ConstBytes(func(d []byte) { y = append([]byte(nil), d...) })
	return bytes.Equal(x, y)
}

// TestResumeIsExact: N steps in one go and N/2 + save + resume + N/2 give identical losses and weights, with
// gradient accumulation, a schedule and clipping in play.
func TestResumeIsExact(t *testing.T) {
	cfg := config(finetune.MethodLoRA, 8)
	cfg.AccumSteps, cfg.Schedule, cfg.WarmupSteps, cfg.ClipNorm, cfg.WeightDecay = 2, "cosine", 2, 0.5, 0.01
	cfg.LoRADropout = 0.2 // the random-number state must resume too
	cfg.TrainModules = []string{"classifier"}
	model, data := imageTask(t, vit.Options{})
	whole, trWhole := fit(t, model, data, cfg, 4)

	out := t.TempDir()
	half := cfg
	half.Steps = 4
	tr, _ := finetune.New(model, cfg, gtest.Backend(t))
	loader, _ := finetune.NewLoader(data, 4, cfg.Seed, true)
	var stats []finetune.StepStats
	hooks := finetune.Hooks{OnStep: func(s finetune.StepStats) { stats = append(stats, s) }}
	ctx, cancel := context.WithCancel(context.Background())
	hooks2 := hooks
	hooks2.OnStep = func(s finetune.StepStats) {
		stats = append(stats, s)
		if s.Step == 4 {
			cancel() // stop after step 4, with a checkpoint
		}
	}
	if err := tr.Fit(ctx, loader, out, nil, hooks2); !errors.Is(err, context.Canceled) {
		t.Fatalf("first half: %v", err)
	}
	loader2, _ := finetune.NewLoader(data, 4, cfg.Seed, true)
	tr2, err := finetune.Resume(out, model, gtest.Backend(t), loader2)
	if err != nil {
		t.Fatal(err)
	}
	if tr2.Step != 4 {
		t.Fatalf("resumed at step %d", tr2.Step)
	}
	if err := tr2.Fit(context.Background(), loader2, out, nil, hooks); err != nil {
		t.Fatal(err)
	}
	if len(stats) != len(whole) {
		t.Fatalf("%d steps, want %d", len(stats), len(whole))
	}
	for i := range whole {
		if stats[i].Loss != whole[i].Loss || stats[i].LR != whole[i].LR {
			t.Errorf("step %d: loss %v lr %v, uninterrupted run %v %v", i+1, stats[i].Loss, stats[i].LR, whole[i].Loss, whole[i].LR)
		}
	}
	for n, p := range trWhole.Train {
		if !tensorsEqual(t, p, tr2.Train[n]) {
			t.Errorf("%s differs after resume", n)
		}
	}
	for n, m := range trWhole.M {
		if !tensorsEqual(t, m, tr2.M[n]) {
			t.Errorf("optimizer moment of %s differs after resume", n)
		}
	}
}

// failingIterator is a loader whose position cannot be saved: Save fails after writing some files.
type failingIterator struct{ *finetune.Loader }

func (failingIterator) State() (json.RawMessage, error) { return nil, errors.New("disk full") }

// TestInterruptedSaveKeepsPrevious: a save that fails half-way leaves no partial checkpoint, the previous one
// still loads and "latest" still names it.
func TestInterruptedSaveKeepsPrevious(t *testing.T) {
	cfg := config(finetune.MethodLoRA, 2)
	cfg.TrainModules = []string{"classifier"}
	model, data := imageTask(t, vit.Options{})
	out := t.TempDir()
	tr, _ := finetune.New(model, cfg, gtest.Backend(t))
	loader, _ := finetune.NewLoader(data, 4, cfg.Seed, true)
	if err := tr.Fit(context.Background(), loader, out, nil, finetune.Hooks{}); err != nil {
		t.Fatal(err)
	}
	good, err := finetune.LatestCheckpoint(out)
	if err != nil {
		t.Fatal(err)
	}
	tr.Config.Steps = 3
	err = tr.Fit(context.Background(), failingIterator{loader}, out, nil, finetune.Hooks{})
	if err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("save error %v", err)
	}
	entries, _ := os.ReadDir(out)
	for _, e := range entries {
		if strings.Contains(e.Name(), "checkpoint-3") || strings.Contains(e.Name(), "tmp") {
			t.Errorf("partial checkpoint left behind: %s", e.Name())
		}
	}
	if latest, _ := finetune.LatestCheckpoint(out); latest != good {
		t.Errorf("latest is %s, want %s", latest, good)
	}
	if _, err := finetune.Resume(out, model, gtest.Backend(t), nil); err != nil {
		t.Errorf("previous checkpoint no longer loads: %v", err)
	}
	if _, err := os.Stat(filepath.Join(good, finetune.TrainableFile)); err != nil {
		t.Error(err)
	}
}

// TestNonFiniteLossStops: a diverging run stops with ErrNonFinite and a clear message naming the failed step,
// parameters untouched, whether the loss is read back every step or (LogEvery 7) only some steps later: the
// device-resident step keeps the parameters as they were from the failed step on, and Sync finds it.
func TestNonFiniteLossStops(t *testing.T) {
	for _, every := range []int{1, 7} {
		cfg := config(finetune.MethodFull, 50)
		cfg.LR = 1e6
		cfg.Optimizer = "sgd"
		cfg.LogEvery = every
		cfg.DivergenceFactor = 0 // this test is about the non-finite stop; TestDivergenceStops about the other
		model, data := imageTask(t, vit.Options{})
		tr, _ := finetune.New(model, cfg, gtest.Backend(t))
		loader, _ := finetune.NewLoader(data, 6, 1, true)
		// The values after every step the hook saw: the failed step and any after it must leave them as they
		// were (the tensors themselves are new: the device-resident step writes Where(ok, updated, old)).
		before := map[string][]float32{}
		last := 0
		err := tr.Fit(context.Background(), loader, "", nil, finetune.Hooks{OnStep: func(s finetune.StepStats) {
			last = s.Step
			for n, p := range tr.Train {
				before[n] = gtest.Float32s(p)
			}
		}})
		if !errors.Is(err, finetune.ErrNonFinite) || !strings.Contains(err.Error(), "lower the learning rate") {
			t.Fatalf("log every %d: error %v, want a non-finite loss error", every, err)
		}
		if len(before) == 0 {
			t.Fatalf("log every %d: the first step already failed: nothing to compare", every)
		}
		for n, want := range before {
			if d := gtest.MaxAbsDiff(want, gtest.Float32s(tr.Train[n])); d != 0 {
				t.Errorf("log every %d: %s changed in the failed step (by %g)", every, n, d)
			}
		}
		if !strings.Contains(err.Error(), fmt.Sprintf("step %d ", tr.Step+1)) || tr.Step > last {
			t.Errorf("log every %d: error %q; the trainer is back at step %d, the hook saw step %d", every, err, tr.Step, last)
		}
		t.Logf("log every %d: %v (found after step %d)", every, err, last)
	}
}

// TestAccumulationMatchesBigBatch: two accumulated batches of 3 give the same step as one batch of 6.
func TestAccumulationMatchesBigBatch(t *testing.T) {
	model, data := imageTask(t, vit.Options{})
	cfg := config(finetune.MethodFull, 1)
	// AdamW's first update is lr * g / (|g| + eps): for gradients near eps it turns summation-order rounding
	// (two batches of 3 against one of 6) into a visible difference (up to 9e-6 on GoMLX v0.28.16; the key bias,
	// whose gradient the softmax cancels to rounding noise, is one such). A larger eps compares the
	// accumulated gradients themselves.
	cfg.Eps = 1e-3
	big, _ := finetune.New(model, cfg, gtest.Backend(t))
	l6, _ := finetune.NewLoader(data, 6, 9, false)
	b6, _ := l6.Next()
	s6, err := big.TrainStep([]finetune.Batch{b6})
	if err != nil {
		t.Fatal(err)
	}
	cfg.AccumSteps = 2
	small, _ := finetune.New(model, cfg, gtest.Backend(t))
	l3, _ := finetune.NewLoader(data, 3, 9, false)
	b3a, _ := l3.Next()
	b3b, _ := l3.Next()
	s3, err := small.TrainStep([]finetune.Batch{b3a, b3b})
	if err != nil {
		t.Fatal(err)
	}
	if math.Abs(s3.Loss-s6.Loss) > 1e-5 || math.Abs(s3.GradNorm-s6.GradNorm) > 1e-4*s6.GradNorm {
		t.Errorf("accumulated loss %g / norm %g, big batch %g / %g", s3.Loss, s3.GradNorm, s6.Loss, s6.GradNorm)
	}
	for n, p := range big.Train {
		if d := gtest.MaxAbsDiff(gtest.Float32s(p), gtest.Float32s(small.Train[n])); d > 1e-6 {
			t.Errorf("%s differs by %g", n, d)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		edit func(*finetune.Config)
		want string
	}{
		{func(c *finetune.Config) { c.Method = "qlora2" }, "method"},
		{func(c *finetune.Config) { c.LoRARank = 0 }, "rank"},
		{func(c *finetune.Config) { c.Method = finetune.MethodFull }, "takes no lora_r"},
		{func(c *finetune.Config) { c.LR = -1 }, "lr"},
		{func(c *finetune.Config) { c.Schedule = "step" }, "schedule"},
		{func(c *finetune.Config) { c.WarmupSteps = 1000 }, "warmup_steps"},
		{func(c *finetune.Config) { c.ComputeDType = "float16" }, "compute_dtype"},
		{func(c *finetune.Config) { c.LoRATarget = nil }, "lora_targets"},
	} {
		c := finetune.Defaults()
		tc.edit(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("error %v, want one line mentioning %q", err, tc.want)
		}
	}
	model, _ := imageTask(t, vit.Options{})
	c := finetune.Defaults()
	c.LoRATarget = []string{"self_attn.q_proj"} // a LLaMA name on a ViT
	if _, err := finetune.New(model, c, gtest.Backend(t)); err == nil || !strings.Contains(err.Error(), "matches no linear layer") {
		t.Errorf("LLaMA target on a ViT: %v", err)
	}
	c = finetune.Defaults()
	c.TrainModules = []string{"head"}
	if _, err := finetune.New(model, c, gtest.Backend(t)); err == nil {
		t.Error("unknown train module accepted")
	}
}

func TestSchedules(t *testing.T) {
	c := finetune.Defaults()
	c.LR, c.Steps, c.WarmupSteps = 1, 10, 2
	for _, tc := range []struct {
		schedule string
		step     int
		want     float64
	}{
		{"constant", 0, 0.5}, {"constant", 1, 1}, {"constant", 9, 1},
		{"linear", 2, 1}, {"linear", 6, 0.5}, {"linear", 9, 0.125},
		{"cosine", 2, 1}, {"cosine", 6, 0.5}, {"cosine", 10, 0},
	} {
		c.Schedule = tc.schedule
		if got := c.LearningRate(tc.step); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("%s step %d: lr %g, want %g", tc.schedule, tc.step, got, tc.want)
		}
	}
}

// TestOptionsTrain: bf16 compute (float32 master weights) learns; gradient checkpointing gives the same losses
// as plain training; dropout changes the trajectory and is reproducible from the seed.
func TestOptionsTrain(t *testing.T) {
	cfg := config(finetune.MethodLoRA, 12)
	cfg.TrainModules = []string{"classifier"}
	run := func(c finetune.Config, opts vit.Options) []finetune.StepStats {
		model, data := imageTask(t, opts)
		stats, _ := fit(t, model, data, c, 6)
		return stats
	}
	bf := cfg
	bf.ComputeDType = "bfloat16"
	bfStats := run(bf, vit.Options{})
	if a, b := firstLast(bfStats, 3); b > 0.7*a {
		t.Errorf("bf16 compute: loss %.3f -> %.3f", a, b)
	}
	plain := run(cfg, vit.Options{})
	ckpt := run(cfg, vit.Options{GradCheckpoint: true})
	for i := range plain {
		if math.Abs(plain[i].Loss-ckpt[i].Loss) > 1e-5*math.Abs(plain[i].Loss) {
			t.Errorf("step %d: checkpointed loss %v, plain %v", i+1, ckpt[i].Loss, plain[i].Loss)
		}
	}
	if ckpt[0].SavedActivationBytes >= plain[0].SavedActivationBytes {
		t.Errorf("checkpointing keeps %d bytes, plain %d", ckpt[0].SavedActivationBytes, plain[0].SavedActivationBytes)
	}
	drop := cfg
	drop.LoRADropout = 0.3
	d1, d2 := run(drop, vit.Options{}), run(drop, vit.Options{})
	if d1[5].Loss == plain[5].Loss {
		t.Error("dropout did not change the losses")
	}
	for i := range d1 {
		if d1[i].Loss != d2[i].Loss {
			t.Errorf("step %d: dropout runs with one seed differ (%v, %v)", i+1, d1[i].Loss, d2[i].Loss)
		}
	}
}

// TestGPUDefaults: on XLA's CUDA plugin the defaults become bfloat16 compute and flash attention unless the user
// set them; every other backend keeps the config as it is.
func TestGPUDefaults(t *testing.T) {
	none := func(string) bool { return false }
	for _, c := range []struct {
		spec, dtype, attention string
		explicit               func(string) bool
	}{
		{"xla:cuda", "bfloat16", "flash", none},
		{"xla:/opt/jax/pjrt_c_api_cuda_plugin.so", "bfloat16", "flash", none},
		{"xla:cuda", "float32", "flash", func(k string) bool { return k == "compute_dtype" }},
		{"xla:cuda", "bfloat16", "standard", func(k string) bool { return k == "attention" }},
		{"go", "float32", "standard", none},
		{"", "float32", "standard", none},
		{"xla:cpu", "float32", "standard", none},
	} {
		got := finetune.GPUDefaults(finetune.Defaults(), c.spec, c.explicit)
		if got.ComputeDType != c.dtype || got.Attention != c.attention {
			t.Errorf("%q: compute %s, attention %s; want %s, %s", c.spec, got.ComputeDType, got.Attention, c.dtype, c.attention)
		}
	}
}

// TestDivergenceStops: a run whose loss explodes without reaching NaN stops with ErrDiverged, naming the loss,
// its step and the last checkpoint.
func TestDivergenceStops(t *testing.T) {
	cfg := config(finetune.MethodFull, 50)
	cfg.LR, cfg.Optimizer = 1e6, "sgd"
	model, data := imageTask(t, vit.Options{})
	tr, _ := finetune.New(model, cfg, gtest.Backend(t))
	loader, _ := finetune.NewLoader(data, 6, 1, true)
	err := tr.Fit(context.Background(), loader, "", nil, finetune.Hooks{})
	if !errors.Is(err, finetune.ErrDiverged) || !strings.Contains(err.Error(), "lower the learning rate") || !strings.Contains(err.Error(), "at step 2") {
		t.Errorf("error %v, want ErrDiverged at step 2", err)
	}
}

// breakingIterator fails its Next call number failAt (1-based) once.
type breakingIterator struct {
	*finetune.Loader
	calls, failAt int
}

func (b *breakingIterator) Next() (finetune.Batch, error) {
	b.calls++
	if b.calls == b.failAt {
		return nil, errors.New("corrupt image cat/17.jpg")
	}
	return b.Loader.Next()
}

// TestDataErrorCheckpoints: a data error in the middle of a run (with gradient accumulation: half-way through a
// step's micro-batches) writes a checkpoint of the steps done before it stops, with the data position from
// before the failed step, so the resumed run trains exactly as the uninterrupted one.
func TestDataErrorCheckpoints(t *testing.T) {
	cfg := config(finetune.MethodLoRA, 5)
	cfg.AccumSteps = 2
	model, data := imageTask(t, vit.Options{})
	whole, _ := fit(t, model, data, cfg, 3)

	out := t.TempDir()
	tr, _ := finetune.New(model, cfg, gtest.Backend(t))
	loader, _ := finetune.NewLoader(data, 3, cfg.Seed, true)
	var stats []finetune.StepStats
	hooks := finetune.Hooks{OnStep: func(s finetune.StepStats) { stats = append(stats, s) }}
	err := tr.Fit(context.Background(), &breakingIterator{Loader: loader, failAt: 6}, out, nil, hooks) // step 3's second batch
	if err == nil || !strings.Contains(err.Error(), "corrupt image") || !strings.Contains(err.Error(), "checkpoint written at step 2") {
		t.Fatalf("error %v", err)
	}
	loader2, _ := finetune.NewLoader(data, 3, cfg.Seed, true)
	tr2, err := finetune.Resume(out, model, gtest.Backend(t), loader2)
	if err != nil || tr2.Step != 2 {
		t.Fatalf("resume: step %v, %v", tr2, err)
	}
	if err := tr2.Fit(context.Background(), loader2, out, nil, hooks); err != nil {
		t.Fatal(err)
	}
	if len(stats) != len(whole) {
		t.Fatalf("%d steps, want %d", len(stats), len(whole))
	}
	for i := range whole {
		if stats[i].Loss != whole[i].Loss {
			t.Errorf("step %d: loss %v, uninterrupted %v", i+1, stats[i].Loss, whole[i].Loss)
		}
	}
}

// TestConfigDiff: every differing setting is named with both values; steps is not a difference.
func TestConfigDiff(t *testing.T) {
	a := finetune.Defaults()
	b := a
	b.Steps, b.LR, b.Method = 999, a.LR*10, finetune.MethodFull
	d := finetune.ConfigDiff(a, b)
	if len(d) != 2 || !strings.HasPrefix(d[0], "lr: ") || !strings.HasPrefix(d[1], "method: lora here, full there") {
		t.Errorf("diff %q", d)
	}
	if d := finetune.ConfigDiff(a, a); len(d) != 0 {
		t.Errorf("a config differs from itself: %q", d)
	}
}
