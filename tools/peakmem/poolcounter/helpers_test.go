package poolcounter_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/dtypes/bfloat16"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/compute/support"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/tools/peakmem/poolcounter"
)

// Backend specs. The simulation is exact, to the byte, when the large matrix product runs on one worker: one1
// is an ops_sequential Go backend with parallelism=1 (its products' work stays on the calling goroutine, the
// elementwise ops too). engineDefault is an ops_sequential backend with the default workers pool (what
// engine.NewBackend("go") builds today): there the large product's panels are held by a scheduling-dependent
// number of workers, and the simulation is an upper bound (checkBounds). Both name ops_sequential explicitly
// (with parallel op execution no peak is deterministic), and both get engine.GoOptions' creation-order schedule
// unless a spec adds dependency_order.
const (
	one1          = "go:ops_sequential,parallelism=1"
	engineDefault = "go:ops_sequential"
)

// backendFor returns one pure-Go backend per spec for the whole test binary.
func backendFor(t *testing.T, spec string) compute.Backend {
	t.Helper()
	return gtest.BackendFor(t, spec)
}

// settle runs the garbage collector until pending tensor finalizers (which release device buffers) have run,
// so they cannot change the counter during a measurement.
func settle() {
	for range 3 {
		runtime.GC()
	}
}

// randTensor returns a tensor of the given shape (float32 or bfloat16) with N(0, scale) values (int64: uniform in
// [-500, 500)).
func randTensor(seed uint64, s shapes.Shape, scale float64) *tensors.Tensor {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	switch s.DType {
	case dtypes.Int64:
		data := make([]int64, s.Size())
		for i := range data {
			data[i] = r.Int64N(1000) - 500
		}
		return tensors.FromFlatDataAndDimensions(data, s.Dimensions...)
	case dtypes.BFloat16:
		data := make([]bfloat16.BFloat16, s.Size())
		for i := range data {
			data[i] = bfloat16.FromFloat32(float32(r.NormFloat64() * scale))
		}
		return tensors.FromFlatDataAndDimensions(data, s.Dimensions...)
	default:
		data := make([]float32, s.Size())
		for i := range data {
			data[i] = float32(r.NormFloat64() * scale)
		}
		return tensors.FromFlatDataAndDimensions(data, s.Dimensions...)
	}
}

// bufferBytes is what the Go backend's pool allocates for a buffer of shape s: its bytes rounded up to the
// pool's bucket (support.TwoBitBucketLen), as GetBuffer does.
func bufferBytes(s shapes.Shape) int64 {
	return int64(support.TwoBitBucketLen(s.DType.SizeForDimensions(s.Dimensions...)))
}

// stepCase is one graph whose simulated peak is compared with the counter.
type stepCase struct {
	name   string
	spec   string // backend spec
	params []shapes.Shape
	donate []bool // nil: nothing donated
	build  func(g *graph.Graph, p []*graph.Node) []*graph.Node
}

// agreement is what checkAgreement measured, for one run.
type agreement struct {
	run          string
	counter, sim memory.Peak
	// baseline is the pool bytes alive before the run that the simulation does not count as resident (other
	// tests' leftovers, buffers earlier runs leaked), subtracted from the counter's figures.
	baseline int64
}

// compileCase builds and compiles the case's graph.
func compileCase(t *testing.T, c stepCase) *graph.Graph {
	t.Helper()
	var g *graph.Graph
	if err := engine.Try(func() {
		g = graph.NewGraph(backendFor(t, c.spec), c.name)
		ps := make([]*graph.Node, len(c.params))
		for i, s := range c.params {
			ps[i] = graph.Parameter(g, fmt.Sprintf("p%d", i), s)
		}
		if err := g.Compile(c.build(g, ps)...); err != nil {
			panic(err) // engine.Try returns it
		}
	}); err != nil {
		t.Fatalf("%s: building graph: %v", c.name, err)
	}
	return g
}

// packedPanels returns the pool bytes the compiled graph g holds in packed panels (memory.HeldByGraph).
func packedPanels(t *testing.T, g *graph.Graph) int64 {
	t.Helper()
	gb, err := memory.HeldByGraph(g)
	if err != nil {
		t.Fatalf("HeldByGraph: %v", err)
	}
	return gb.PackedPanels
}

// checkAgreement compiles the case, runs it twice (cold: inputs transferred inside the run; warm: non-donated
// inputs already on the backend), measuring each run with memory.MeasurePeak (the patched pool counter), and
// compares each with memory.SimulatePeak taken just before it (the simulation models the graph's next run). It
// also checks the counter's bookkeeping around the runs: compiling (the constants included) leaves the counter
// alone, the outputs, the transferred inputs and what the simulation says a run keeps are exactly what stays
// in the pool, and only what the runs kept is left once inputs and outputs are finalized.
func checkAgreement(t *testing.T, c stepCase) []agreement {
	t.Helper()
	if !memory.HasPoolCounter() {
		t.Fatal("poolcounter did not install the counter")
	}
	var cnt poolcounter.Counter
	b := backendFor(t, c.spec)
	settle()
	baseline := cnt.Live()

	g := compileCase(t, c)
	defer g.Finalize()
	if got := cnt.Live(); got != baseline {
		t.Fatalf("%s: compiling changed the pool's live bytes by %d", c.name, got-baseline)
	}

	inputs := make([]*tensors.Tensor, len(c.params))
	var keptInputs int64
	for i, s := range c.params {
		inputs[i] = randTensor(uint64(100+i), s, 0.5)
		if c.donate == nil || !c.donate[i] {
			keptInputs += bufferBytes(s)
		}
	}
	defer func() {
		for _, in := range inputs {
			in.MustFinalizeAll()
		}
	}()

	var results []agreement
	var keptByRuns int64
	for _, runName := range []string{"cold", "warm"} {
		sim, err := memory.SimulatePeak(g, memory.SimOptions{Donate: c.donate})
		if err != nil {
			t.Fatalf("%s/%s: SimulatePeak: %v", c.name, runName, err)
		}
		var outs []*tensors.Tensor
		run := func() error {
			args := make([]any, len(inputs))
			for i, in := range inputs {
				args[i] = in
				if c.donate != nil && c.donate[i] {
					d, err := graph.DonateTensorBuffer(in, b, 0)
					if err != nil {
						return err
					}
					args[i] = d
				}
			}
			return engine.Try(func() { outs = g.Run(args...) })
		}
		settle()
		before := cnt.Live()
		residentBefore := packedPanels(t, g) // held by the graph; the simulation counts it as resident
		transferred := keptInputs            // the cold run transfers the inputs inside the run
		if runName == "warm" {
			residentBefore += keptInputs
			transferred = 0
		}
		m, err := memory.MeasurePeak(g, run)
		if err != nil {
			t.Fatalf("%s/%s: MeasurePeak: %v", c.name, runName, err)
		}
		if m.Method != memory.MethodPoolCounter {
			t.Fatalf("%s/%s: MeasurePeak method %q", c.name, runName, m.Method)
		}
		var outBytes int64
		for _, o := range outs {
			outBytes += bufferBytes(o.Shape())
		}
		if got, want := cnt.Live(), before+transferred+outBytes+sim.Kept; got != want {
			t.Errorf("%s/%s: %d bytes live after the run, want %d before + inputs transferred %d + outputs %d + kept %d",
				c.name, runName, got, before, transferred, outBytes, sim.Kept)
		}
		for _, o := range outs {
			o.MustFinalizeAll()
		}
		if got, want := cnt.Live(), before+transferred+sim.Kept; got != want {
			t.Errorf("%s/%s: %d bytes live after finalizing the outputs, want %d", c.name, runName, got, want)
		}
		keptByRuns += sim.Kept
		a := agreement{run: runName, counter: m, sim: sim, baseline: before - residentBefore}
		results = append(results, a)
		t.Logf("%-28s %-4s counter: peak %9d resident %9d transient %9d | simulation: peak %9d resident %9d transient %9d (kept %d) | diff %+d",
			c.name, runName, m.Bytes-a.baseline, m.Resident-a.baseline, m.Transient(), sim.Bytes, sim.Resident,
			sim.Transient(), sim.Kept, sim.Bytes-(m.Bytes-a.baseline))
		if a.baseline != 0 {
			t.Logf("%-28s (pool bytes alive before this run and not resident for it, subtracted from the counter's figures: %d)",
				c.name, a.baseline)
		}
	}
	for _, in := range inputs {
		in.MustFinalizeAll()
	}
	if got := cnt.Live(); got != baseline+keptByRuns {
		t.Errorf("%s: %d bytes live after finalizing inputs and outputs, want the baseline %d + what the runs kept %d",
			c.name, got, baseline, keptByRuns)
	}
	return results
}

// assertAgree requires the simulation to equal the counter exactly, for peak, resident and transient bytes.
func assertAgree(t *testing.T, name string, as []agreement) {
	t.Helper()
	for _, a := range as {
		if a.counter.Bytes-a.baseline != a.sim.Bytes || a.counter.Resident-a.baseline != a.sim.Resident {
			t.Errorf("%s/%s: counter peak %d resident %d (above baseline), simulation peak %d resident %d: off by %+d (%.2f%%)",
				name, a.run, a.counter.Bytes-a.baseline, a.counter.Resident-a.baseline, a.sim.Bytes, a.sim.Resident,
				a.sim.Bytes-(a.counter.Bytes-a.baseline),
				100*float64(a.sim.Bytes-(a.counter.Bytes-a.baseline))/float64(a.counter.Bytes-a.baseline))
		}
	}
}

// agree compiles, runs and checks the case for exact agreement.
func agree(t *testing.T, c stepCase) {
	t.Helper()
	assertAgree(t, c.name, checkAgreement(t, c))
}

// warmTransient runs the compiled graph g once on args, all already on g's backend (so the run transfers
// nothing), and returns the counter's transient peak (memory.MeasurePeak's Transient). The outputs are released,
// after which the pool must hold what it held before plus kept (what memory.SimulatePeak said the run keeps).
func warmTransient(t *testing.T, name string, g *graph.Graph, args []*tensors.Tensor, kept int64) int64 {
	t.Helper()
	var cnt poolcounter.Counter
	anyArgs := make([]any, len(args))
	for i, a := range args {
		if _, err := a.Buffer(g.Backend(), 0); err != nil {
			t.Fatalf("%s: transferring input %d: %v", name, i, err)
		}
		anyArgs[i] = a
	}
	settle()
	before := cnt.Live()
	var outs []*tensors.Tensor
	m, err := memory.MeasurePeak(g, func() error { return engine.Try(func() { outs = g.Run(anyArgs...) }) })
	if err != nil {
		t.Fatalf("%s: MeasurePeak: %v", name, err)
	}
	for _, o := range outs {
		o.MustFinalizeAll()
	}
	if got := cnt.Live(); got != before+kept {
		t.Errorf("%s: %d bytes live after the run and its outputs, want the %d before + %d kept", name, got, before, kept)
	}
	return m.Transient()
}

func f32(dims ...int) shapes.Shape  { return shapes.Make(dtypes.Float32, dims...) }
func bf16(dims ...int) shapes.Shape { return shapes.Make(dtypes.BFloat16, dims...) }

// gelu is GoMLX's exact GELU written out: 0.5 x (1 + erf(x / sqrt 2)).
func gelu(x *graph.Node) *graph.Node {
	return graph.Mul(graph.MulScalar(x, 0.5), graph.OnePlus(graph.Erf(graph.MulScalar(x, 0.7071067811865476))))
}

// mlpStep is one training step of a two-layer MLP: params x [B,Din], target [B,Dout], w1 [H,Din], b1 [H],
// w2 [Dout,H], b2 [Dout]; outputs the loss and the four weight gradients.
func mlpStep(g *graph.Graph, p []*graph.Node) []*graph.Node {
	h := gelu(engine.Linear(p[0], p[2], p[3]))
	y := engine.Linear(h, p[4], p[5])
	loss := graph.ReduceAllMean(graph.Square(graph.Sub(y, p[1])))
	return append([]*graph.Node{loss}, engine.Gradient(loss, p[2], p[3], p[4], p[5])...)
}

func mlpParams(dt dtypes.DType, batch, din, hidden, dout int) []shapes.Shape {
	return []shapes.Shape{shapes.Make(dt, batch, din), shapes.Make(dt, batch, dout), shapes.Make(dt, hidden, din),
		shapes.Make(dt, hidden), shapes.Make(dt, dout, hidden), shapes.Make(dt, dout)}
}
