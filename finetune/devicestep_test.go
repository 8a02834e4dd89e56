package finetune_test

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/shapes"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/vit"
)

// countingBackend wraps a backend and counts the bytes that cross its buffer API between host and backend:
// uploads (BufferFromFlatData, NewSharedBuffer) and reads of program outputs (Buffer.Data, Buffer.ToFlatData).
// Programs compiled through it return their outputs wrapped, so every read of a step's result is seen; inputs
// are unwrapped before the real executable runs.
type countingBackend struct {
	compute.Backend
	uploads, reads, readCalls atomic.Int64
}

func (c *countingBackend) BufferFromFlatData(dev compute.DeviceNum, flat any, shape shapes.Shape) (compute.Buffer, error) {
	c.uploads.Add(int64(shape.Memory()))
	return c.Backend.BufferFromFlatData(dev, flat, shape)
}

func (c *countingBackend) NewSharedBuffer(dev compute.DeviceNum, shape shapes.Shape) (compute.Buffer, any, error) {
	c.uploads.Add(int64(shape.Memory()))
	return c.Backend.NewSharedBuffer(dev, shape)
}

func (c *countingBackend) Builder(name string) compute.Builder {
	return countingBuilder{c.Backend.Builder(name), c}
}

type countingBuilder struct {
	compute.Builder
	c *countingBackend
}

func (b countingBuilder) Compile() (compute.Executable, error) {
	e, err := b.Builder.Compile()
	if err != nil {
		return nil, err
	}
	return countingExec{e, b.c}, nil
}

type countingExec struct {
	compute.Executable
	c *countingBackend
}

func (e countingExec) Execute(inputs []compute.Buffer, donate []bool, dev compute.DeviceNum) ([]compute.Buffer, error) {
	in := make([]compute.Buffer, len(inputs))
	for i, b := range inputs {
		if cb, ok := b.(countingBuffer); ok {
			b = cb.Buffer
		}
		in[i] = b
	}
	outs, err := e.Executable.Execute(in, donate, dev)
	for i, b := range outs {
		outs[i] = countingBuffer{b, e.c}
	}
	return outs, err
}

type countingBuffer struct {
	compute.Buffer
	c *countingBackend
}

func (b countingBuffer) Backend() compute.Backend { return b.c }

func (b countingBuffer) count() {
	s, _ := b.Buffer.Shape()
	b.c.reads.Add(int64(s.Memory()))
	b.c.readCalls.Add(1)
}

func (b countingBuffer) Data() (any, error) { b.count(); return b.Buffer.Data() }

func (b countingBuffer) ToFlatData(flat any) error { b.count(); return b.Buffer.ToFlatData(flat) }

func batchBytes(b finetune.Batch) int64 {
	var n int64
	for _, x := range b {
		n += int64(x.Shape().Memory())
	}
	return n
}

func trainBytes(tr *finetune.Trainer) int64 {
	var n int64
	for _, p := range tr.Train {
		n += int64(p.Shape().Memory())
	}
	return n
}

// TestDeviceStepStaysOnDevice: N optimizer steps compile their program once, send up only the batch and three
// scalars per step (no trainable tensor or gradient), read nothing back until Sync (then the loss, gradient
// norm and ok flag: 9 bytes), and keep the process's heap flat after the first steps; the host-side step, for
// contrast, reads and uploads every gradient.
func TestDeviceStepStaysOnDevice(t *testing.T) {
	model, data := imageTask(t, vit.Options{})
	cfg := config(finetune.MethodFull, 40)
	cb := &countingBackend{Backend: gtest.Backend(t)}
	tr, err := finetune.New(model, cfg, cb)
	if err != nil {
		t.Fatal(err)
	}
	loader, _ := finetune.NewLoader(data, 6, 1, true)
	next := func() finetune.Batch {
		b, err := loader.Next()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	// Warm-up: the first step uploads the initial weights and moments, the second donates them, and the
	// backend's buffer pool fills over the first few.
	for range 10 {
		if _, err := tr.TrainStepAsync([]finetune.Batch{next()}); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := tr.Sync(); err != nil {
		t.Fatal(err)
	}
	heapBefore := settledHeap()
	const n = 30
	cb.uploads.Store(0)
	cb.reads.Store(0)
	var want int64
	for range n {
		b := next()
		want += batchBytes(b) + 3*4 // the batch, lr and the two bias corrections
		st, err := tr.TrainStepAsync([]finetune.Batch{b})
		if err != nil {
			t.Fatal(err)
		}
		if st.Synced || st.Loss != 0 {
			t.Fatalf("step %d: an async step came back synced: %+v", st.Step, st)
		}
	}
	if got := cb.reads.Load(); got != 0 {
		t.Errorf("%d steps read %d bytes back before any Sync, want 0", n, got)
	}
	if got := cb.uploads.Load(); got != want {
		t.Errorf("%d steps uploaded %d bytes, want %d (batches and scalars only; the trainable tensors are %d bytes)", n, got, want, trainBytes(tr))
	}
	loss, norm, err := tr.Sync()
	if err != nil || loss <= 0 || norm <= 0 {
		t.Fatalf("Sync: loss %g, norm %g, %v", loss, norm, err)
	}
	if got := cb.reads.Load(); got != 4+4+1 {
		t.Errorf("Sync read %d bytes, want 9 (ok flag, loss and norm)", got)
	}
	if tr.Compiles != 1 || tr.Step != n+10 {
		t.Errorf("%d steps compiled %d programs (want 1), trainer at step %d", n+10, tr.Compiles, tr.Step)
	}
	grown := int64(settledHeap()) - int64(heapBefore)
	if grown > 1<<20 { // a copy of the trainable tensors kept per step would be 30x193 KB
		t.Errorf("the heap grew by %d bytes over %d steps (trainable tensors: %d bytes)", grown, n, trainBytes(tr))
	}
	t.Logf("%d steps: uploaded %d bytes (batches + scalars), read 0 until Sync, Sync read %d; heap %+d bytes; trainable %d bytes",
		n, cb.uploads.Load(), cb.reads.Load(), grown, trainBytes(tr))

	// The host-side step moves every gradient both ways (same backend: the model's tensors live on it now).
	hb := cb
	host, err := finetune.New(model, cfg, hb)
	if err != nil {
		t.Fatal(err)
	}
	hs := finetune.NewHostStep(host)
	defer hs.Release()
	if _, err := hs.TrainStep([]finetune.Batch{next()}); err != nil {
		t.Fatal(err)
	}
	hb.uploads.Store(0)
	hb.reads.Store(0)
	if _, err := hs.TrainStep([]finetune.Batch{next()}); err != nil {
		t.Fatal(err)
	}
	if hb.reads.Load() < trainBytes(host) || hb.uploads.Load() < trainBytes(host) {
		t.Errorf("the host-side step read %d and uploaded %d bytes; its gradients are %d bytes", hb.reads.Load(), hb.uploads.Load(), trainBytes(host))
	}
}

// TestDeviceStepMatchesHostStep: the device-resident step and the host-side step train to the same losses and
// weights, for full fine-tuning and LoRA, with gradient accumulation, clipping, weight decay and a schedule in
// play, on the ViT and the LLaMA.
func TestDeviceStepMatchesHostStep(t *testing.T) {
	vitModel, vitData := imageTask(t, vit.Options{})
	llamaModel, llamaData := textTask(t, decoder.Options{})
	for _, c := range []struct {
		name   string
		model  finetune.Model
		data   finetune.Examples
		method string
		opt    string
		accum  int
	}{
		{"vit/full/adamw", vitModel, vitData, finetune.MethodFull, "adamw", 1},
		{"vit/lora/adamw/accum3", vitModel, vitData, finetune.MethodLoRA, "adamw", 3},
		{"llama/lora/sgd/accum2", llamaModel, llamaData, finetune.MethodLoRA, "sgd", 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := config(c.method, 6)
			cfg.Optimizer, cfg.AccumSteps, cfg.ClipNorm, cfg.WeightDecay = c.opt, c.accum, 0.5, 0.01
			cfg.Schedule, cfg.WarmupSteps, cfg.Momentum = "cosine", 2, 0.9
			if c.opt == "adamw" {
				cfg.Momentum = 0
			}
			// The device-resident step through the loop; the host-side step (hoststep_test.go) on the same
			// batches, one optimizer step of AccumSteps micro-batches at a time, as the loop draws them.
			run := func(host bool) ([]finetune.StepStats, *finetune.Trainer) {
				tr, err := finetune.New(c.model, cfg, gtest.Backend(t))
				if err != nil {
					t.Fatal(err)
				}
				loader, _ := finetune.NewLoader(c.data, 4, cfg.Seed, true)
				var stats []finetune.StepStats
				if !host {
					if err := tr.Fit(context.Background(), loader, "", nil, finetune.Hooks{OnStep: func(s finetune.StepStats) { stats = append(stats, s) }}); err != nil {
						t.Fatal(err)
					}
					return stats, tr
				}
				hs := finetune.NewHostStep(tr)
				defer hs.Release()
				for tr.Step < cfg.Steps {
					batches := make([]finetune.Batch, cfg.AccumSteps)
					for i := range batches {
						if batches[i], err = loader.Next(); err != nil {
							t.Fatal(err)
						}
					}
					s, err := hs.TrainStep(batches)
					if err != nil {
						t.Fatal(err)
					}
					stats = append(stats, s)
				}
				return stats, tr
			}
			dev, dtr := run(false)
			host, htr := run(true)
			for i := range dev {
				if d := dev[i].Loss - host[i].Loss; d > 1e-5 || d < -1e-5 || !dev[i].Synced {
					t.Errorf("step %d: loss %.7g (device) vs %.7g (host)", i+1, dev[i].Loss, host[i].Loss)
				}
				if d := (dev[i].GradNorm - host[i].GradNorm) / host[i].GradNorm; d > 1e-4 || d < -1e-4 {
					t.Errorf("step %d: gradient norm %.7g (device) vs %.7g (host)", i+1, dev[i].GradNorm, host[i].GradNorm)
				}
			}
			for n, p := range htr.Train {
				if d := gtest.MaxAbsDiff(gtest.Float32s(p), gtest.Float32s(dtr.Train[n])); d > 1e-5 {
					t.Errorf("%s differs by %g", n, d)
				}
			}
			for n, m := range htr.M {
				if d := gtest.MaxAbsDiff(gtest.Float32s(m), gtest.Float32s(dtr.M[n])); d > 1e-5 {
					t.Errorf("moment of %s differs by %g", n, d)
				}
			}
			want := 1
			if c.accum > 1 {
				want = 2 // the first micro-batch's program and the last one's (a third, the middle, from 3 on)
				if c.accum > 2 {
					want = 3
				}
			}
			if dtr.Compiles != want {
				t.Errorf("%d programs compiled, want %d", dtr.Compiles, want)
			}
		})
	}
}

// TestRelease: a trainer's Release finalizes the tensors its steps produced and leaves the model's own alone.
func TestRelease(t *testing.T) {
	model, data := imageTask(t, vit.Options{})
	tr, err := finetune.New(model, config(finetune.MethodLoRA, 2), gtest.Backend(t))
	if err != nil {
		t.Fatal(err)
	}
	l, _ := finetune.NewLoader(data, 4, 1, false)
	b, _ := l.Next()
	if _, err := tr.TrainStep([]finetune.Batch{b}); err != nil {
		t.Fatal(err)
	}
	trained := tr.Train
	tr.Release()
	for n, p := range trained {
		if p.Ok() {
			t.Errorf("%s still holds its data after Release", n)
		}
	}
	for n, p := range model.Params() {
		if !p.Ok() {
			t.Errorf("the model's %s was finalized", n)
		}
	}
}

// settledHeap returns the live heap once garbage collection has settled: tensors are released by finalizers, which
// run on their own goroutine after the collection that finds them, so one runtime.GC can leave the memory of the
// last steps' batches in the heap (under load, one collection before and one after let the heap "grow" by about
// 1.5 MB twice in full test runs; settled, repeated runs read +5 to +24 KB where single collections read -160 to
// +210 KB). It collects until two readings in a row agree to 64 KiB, at most 8 times.
func settledHeap() uint64 {
	var ms runtime.MemStats
	last := ^uint64(0)
	for range 8 {
		runtime.GC()
		time.Sleep(10 * time.Millisecond) // the finalizer goroutine runs, freeing what the next collection takes
		runtime.ReadMemStats(&ms)
		if d := int64(ms.HeapAlloc) - int64(last); d > -64<<10 && d < 64<<10 {
			break
		}
		last = ms.HeapAlloc
	}
	return ms.HeapAlloc
}
