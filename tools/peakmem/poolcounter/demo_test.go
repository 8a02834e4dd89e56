package poolcounter_test

import (
	"path/filepath"
	"testing"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/pretrained"
)

// TestViTDemoStep measures the gradient step of memfit's demo (the shipped ViT, LoRA r=8 on every encoder
// linear layer + the classifier, batch 32) in its two variants, and prints the figures tools/peakmem/README.md
// quotes: the counter and the simulation on a parallelism=1 backend (which must agree to the byte) in both
// schedules, the counter on the engine's default backend (several matmul workers) against the simulation's
// one-worker figure and upper bound, and the executor's own EstimatedTemporaryMemory.
func TestViTDemoStep(t *testing.T) {
	dir, err := pretrained.Extract("vit-fashion", filepath.Join(t.TempDir(), "vit-fashion"))
	if err != nil {
		t.Fatal(err)
	}
	trainIDX, _, err := pretrained.DemoData()
	if err != nil {
		t.Fatal(err)
	}
	train, err := pretrained.FashionExamples(trainIDX["images"], trainIDX["labels"], 5)
	if err != nil {
		t.Fatal(err)
	}
	loader, err := finetune.NewLoader(train, 32, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := loader.Next()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"plain", "approx-act+ms-norm"} {
		v, err := finetune.VariantByName(name)
		if err != nil {
			t.Fatal(err)
		}
		cfg := finetune.Defaults()
		cfg.LoRATarget = []string{"all-linear"}
		cfg.TrainModules = []string{"classifier"}
		cfg.BatchSize = 32
		cfg = v.Apply(cfg)
		type figures struct {
			sim, sim1 memory.Peak
			est       int64
			counter   []int64
		}
		fig := map[string]*figures{}
		for _, spec := range []string{one1 + ",dependency_order", one1, engineDefault + ",dependency_order", engineDefault} {
			model, err := finetune.LoadModel(dir, cfg)
			if err != nil {
				t.Fatal(err)
			}
			tr, err := finetune.New(model, cfg, backendFor(t, spec))
			if err != nil {
				t.Fatal(err)
			}
			g, err := tr.StepGraph(batch) // the batch's shapes only
			if err != nil {
				t.Fatal(err)
			}
			f := &figures{}
			if f.sim, err = memory.SimulatePeak(g, memory.SimOptions{}); err != nil {
				t.Fatal(err)
			}
			if f.sim1, err = memory.SimulatePeak(g, memory.SimOptions{MatmulWorkers: 1}); err != nil {
				t.Fatal(err)
			}
			if f.est, err = memory.ExecutorEstimate(g); err != nil {
				t.Fatal(err)
			}
			local := finetune.Batch{} // a copy per backend: a tensor lives on one backend
			for k, v := range batch {
				if local[k], err = v.LocalClone(); err != nil {
					t.Fatal(err)
				}
			}
			args := stepArgs(t, g, tr, local)
			runs := 1
			if spec == engineDefault {
				runs = 5
			}
			for range runs {
				next, err := memory.SimulatePeak(g, memory.SimOptions{})
				if err != nil {
					t.Fatal(err)
				}
				f.counter = append(f.counter, warmTransient(t, name, g, args, next.Kept))
			}
			fig[spec] = f
			for _, v := range local {
				v.MustFinalizeAll()
			}
			for _, c := range f.counter {
				if c < f.sim1.Transient() || c > f.sim.Transient() || (f.sim1 == f.sim && c != f.sim.Transient()) {
					t.Errorf("%s on %q: counter transient %d, simulation %d (one worker) .. %d", name, spec, c,
						f.sim1.Transient(), f.sim.Transient())
				}
			}
			t.Logf("%-19s %-44q simulation peak %8d (resident %7d, transient %8d; one matmul worker: %8d) | counter transient %v | EstimatedTemporaryMemory %8d",
				name, spec, f.sim.Bytes, f.sim.Resident, f.sim.Transient(), f.sim1.Transient(), f.counter, f.est)
		}
		dep, cre := fig[one1+",dependency_order"], fig[one1]
		t.Logf("%-19s dependency order vs creation order (one worker): peak %d vs %d (%+.1f%%), transient %d vs %d (%+.1f%%)",
			name, dep.sim.Bytes, cre.sim.Bytes, 100*float64(dep.sim.Bytes-cre.sim.Bytes)/float64(cre.sim.Bytes),
			dep.sim.Transient(), cre.sim.Transient(), 100*float64(dep.sim.Transient()-cre.sim.Transient())/float64(cre.sim.Transient()))
	}
}
