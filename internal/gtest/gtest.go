// Package gtest holds helpers shared by memfit's tests: a pure-Go backend, random inputs and a one-call way to
// build, compile and run a graph.
package gtest

import (
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"sync"
	"testing"

	"github.com/gomlx/compute"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
)

var (
	backendsMu sync.Mutex
	backendsBy = map[string]compute.Backend{}
)

// Backend returns one pure-Go backend (the default spec) shared by all tests of a package.
func Backend(t testing.TB) compute.Backend {
	t.Helper()
	return BackendFor(t, engine.DefaultBackend)
}

// BackendFor returns one backend per spec (see engine.NewBackend), created on first use and shared by all the
// tests of a package.
func BackendFor(t testing.TB, spec string) compute.Backend {
	t.Helper()
	backendsMu.Lock()
	defer backendsMu.Unlock()
	if b, ok := backendsBy[spec]; ok {
		return b
	}
	b, err := engine.NewBackend(spec)
	if err != nil {
		t.Fatalf("backend %q: %v", spec, err)
	}
	backendsBy[spec] = b
	return b
}

// ErrRefused is the error of every compile on a RefusingBackend.
var ErrRefused = errors.New("gtest: this backend refuses to compile any graph")

// RefusingBackend returns backend whose builders fail every Compile with ErrRefused: building a graph works,
// compiling it does not, as on a backend that rejects an op or runs out of memory while compiling. Tests use it
// to check that a compile failure is reported with its cause (not later as "Graph not compiled yet").
func RefusingBackend(backend compute.Backend) compute.Backend { return refusingBackend{backend} }

type refusingBackend struct{ compute.Backend }

// Builder returns the wrapped backend's builder, whose Compile refuses.
func (b refusingBackend) Builder(name string) compute.Builder {
	return refusingBuilder{b.Backend.Builder(name)}
}

type refusingBuilder struct{ compute.Builder }

// Compile refuses: ErrRefused.
func (refusingBuilder) Compile() (compute.Executable, error) { return nil, ErrRefused }

// Rand returns n normal(0, scale) float32 values from a seeded generator.
func Rand(seed uint64, n int, scale float64) []float32 {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(r.NormFloat64() * scale)
	}
	return out
}

// Tensor returns a float32 tensor with the given data and dimensions.
func Tensor(data []float32, dims ...int) *tensors.Tensor {
	return tensors.FromFlatDataAndDimensions(data, dims...)
}

// Run builds a graph whose parameters have the shapes of inputs, calls build on them, compiles the outputs,
// runs it and returns each output as flat float32 data (other dtypes are converted).
func Run(t testing.TB, build func(g *graph.Graph, params []*graph.Node) []*graph.Node, inputs ...*tensors.Tensor) [][]float32 {
	t.Helper()
	outs, _ := RunGraph(t, build, inputs...)
	return outs
}

// RunGraph is Run that also returns the graph (for inspection after the run).
func RunGraph(t testing.TB, build func(g *graph.Graph, params []*graph.Node) []*graph.Node, inputs ...*tensors.Tensor) ([][]float32, *graph.Graph) {
	t.Helper()
	var result [][]float32
	var g *graph.Graph
	err := engine.Try(func() {
		g = graph.NewGraph(Backend(t), t.Name())
		params := make([]*graph.Node, len(inputs))
		for i, in := range inputs {
			params[i] = graph.Parameter(g, "p"+string(rune('a'+i)), in.Shape())
		}
		outs := build(g, params)
		if err := g.Compile(outs...); err != nil {
			panic(err) // engine.Try returns it, and the test fails with the cause
		}
		args := make([]any, len(inputs))
		for i, in := range inputs {
			args[i] = in
		}
		res := g.Run(args...)
		for _, r := range res {
			result = append(result, Float32s(r))
		}
	})
	if err != nil {
		t.Fatalf("graph failed: %v", err)
	}
	return result, g
}

// Float32s returns the tensor's values as float32, converting from float64, bfloat16 and integer types.
func Float32s(t *tensors.Tensor) []float32 {
	var out []float32
	t.MustConstFlatData(func(flat any) {
		switch f := flat.(type) {
		case []float32:
			out = append([]float32(nil), f...)
		case []float64:
			for _, v := range f {
				out = append(out, float32(v))
			}
		case []uint8:
			for _, v := range f {
				out = append(out, float32(v))
			}
		case []int32:
			for _, v := range f {
				out = append(out, float32(v))
			}
		case []int64:
			for _, v := range f {
				out = append(out, float32(v))
			}
		default:
			panic("gtest.Float32s: unsupported dtype " + t.DType().String())
		}
	})
	return out
}

// MaxAbsDiff returns max_i |a_i - b_i| (and +Inf when the lengths differ).
func MaxAbsDiff(a, b []float32) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	m := 0.0
	for i := range a {
		d := math.Abs(float64(a[i]) - float64(b[i]))
		if math.IsNaN(d) {
			return math.Inf(1)
		}
		m = max(m, d)
	}
	return m
}

// MaxRelDiff returns max_i |a_i - b_i| / (|b_i| + floor).
func MaxRelDiff(a, b []float32, floor float64) float64 {
	if len(a) != len(b) {
		return math.Inf(1)
	}
	m := 0.0
	for i := range a {
		d := math.Abs(float64(a[i])-float64(b[i])) / (math.Abs(float64(b[i])) + floor)
		if math.IsNaN(d) {
			return math.Inf(1)
		}
		m = max(m, d)
	}
	return m
}

// RunBuilt builds a graph with build, which creates its own parameters (graph.Parameter, models.Bind, ...) and
// returns the outputs and the input tensors in parameter-creation order; then it compiles, runs and returns the
// outputs as flat float32 data together with the graph.
func RunBuilt(t testing.TB, build func(g *graph.Graph) (outputs []*graph.Node, inputs []*tensors.Tensor)) ([][]float32, *graph.Graph) {
	t.Helper()
	var result [][]float32
	var g *graph.Graph
	err := engine.Try(func() {
		g = graph.NewGraph(Backend(t), t.Name())
		outs, inputs := build(g)
		if err := g.Compile(outs...); err != nil {
			panic(err) // engine.Try returns it, and the test fails with the cause
		}
		args := make([]any, len(inputs))
		for i, in := range inputs {
			args[i] = in
		}
		for _, r := range g.Run(args...) {
			result = append(result, Float32s(r))
		}
	})
	if err != nil {
		t.Fatalf("graph failed: %v", err)
	}
	return result, g
}

// Main runs a package's tests (call it from TestMain). In SIMD builds it first restarts the test binary with
// GODEBUG=cpu.fma=off, as the finetune command does (engine.ReexecWithFMAWorkaround): without it Go's math.Exp
// runs about 100x slower after GoMLX's vector kernels, and a test of the shipped LLaMA's MMLU scoring took 237 s
// instead of 9 s. It also keeps the tests off the Hugging Face Hub and the user's cache (isolateHub).
func Main(m *testing.M) {
	engine.ReexecWithFMAWorkaround()
	cleanup := isolateHub()
	code := m.Run()
	cleanup()
	os.Exit(code)
}

// isolateHub keeps tests off the network and out of the user's Hugging Face cache and token: HF_HOME is a
// temporary folder, HF_HUB_OFFLINE=1 (a test of Hub access sets HF_ENDPOINT to its stand-in and
// HF_HUB_OFFLINE=0), and no other Hub variable is inherited.
func isolateHub() func() {
	for _, k := range []string{"HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH",
		"HF_ENDPOINT", "TRANSFORMERS_OFFLINE"} {
		os.Unsetenv(k)
	}
	os.Setenv("HF_HUB_OFFLINE", "1")
	home, err := os.MkdirTemp("", "memfit-test-hf-home-")
	if err != nil {
		return func() {}
	}
	os.Setenv("HF_HOME", home)
	return func() { os.RemoveAll(home) }
}
