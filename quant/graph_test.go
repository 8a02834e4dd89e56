package quant

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/memory"
)

// The graph's dequantisation equals the host's bit for bit, and a linear layer over it keeps no float weight
// for its backward pass: the input gradient rebuilds the weight from the codes.
func TestGraphDequantizeAndBackward(t *testing.T) {
	backend, err := engine.NewBackend(engine.ChooseSpec("go"))
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	r := rand.New(rand.NewPCG(5, 6))
	const out, in, rows = 70, 130, 3 // 9100 values: a partial last block and a partial scale group
	w := make([]float32, out*in)
	for i := range w {
		w[i] = float32(0.05 * r.NormFloat64())
	}
	gamma := make([]float32, in)
	for i := range gamma {
		gamma[i] = float32(1 + 0.3*r.NormFloat64())
	}
	q, _ := QuantizeNF4(w, out, in, true)
	q.Fold(gamma)
	host := q.Dequantize()
	x := make([]float32, rows*in)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	ts := q.Tensors("w")
	names := []string{"w" + SuffixCodes, "w" + SuffixAbsmaxQ, "w" + SuffixAbsmax2, "w" + SuffixOffset, "w" + SuffixColScale}
	g := graph.NewGraph(backend, "nf4")
	nodes := map[string]*graph.Node{}
	args := []any{}
	for _, n := range names {
		nodes[n] = graph.Parameter(g, n, ts[n].Shape())
		args = append(args, ts[n])
	}
	xn := graph.Parameter(g, "x", tensors.FromFlatDataAndDimensions(x, rows, in).Shape())
	args = append(args, tensors.FromFlatDataAndDimensions(x, rows, in))
	p, ok := BoundNodes(nodes, "w")
	if !ok {
		t.Fatal("NF4 nodes not found")
	}
	deq := Dequantize(p, out, in, dtypes.Float32)
	y := engine.Linear(xn, Weight(p, out, in, dtypes.Float32), nil)
	loss := graph.ReduceAllSum(graph.Mul(y, y))
	dx := engine.Gradient(loss, xn)[0]
	if err := g.Compile(deq, dx); err != nil {
		t.Fatal(err)
	}
	saved, err := memory.Saved(g, deq, dx)
	if err != nil {
		t.Fatal(err)
	}
	outs := g.Run(args...)
	tensors.MustConstFlatData[float32](outs[0], func(f []float32) {
		for i := range f {
			if f[i] != host[i] {
				t.Fatalf("value %d: graph %g, host %g", i, f[i], host[i])
			}
		}
	})
	// dx = 2 y W, with y = x W^T.
	tensors.MustConstFlatData[float32](outs[1], func(f []float32) {
		for rI := 0; rI < rows; rI++ {
			yv := make([]float64, out)
			for o := 0; o < out; o++ {
				for j := 0; j < in; j++ {
					yv[o] += float64(x[rI*in+j]) * float64(host[o*in+j])
				}
			}
			for j := 0; j < in; j++ {
				var want float64
				for o := 0; o < out; o++ {
					want += 2 * yv[o] * float64(host[o*in+j])
				}
				if math.Abs(float64(f[rI*in+j])-want) > 1e-4*(1+math.Abs(want)) {
					t.Fatalf("dx[%d,%d] = %g, want %g", rI, j, f[rI*in+j], want)
				}
			}
		}
	})
	for _, s := range saved.Tensors {
		if s.Shape.DType == dtypes.Float32 && s.Shape.Size() >= out*in {
			t.Errorf("the backward pass keeps a weight-sized float tensor: %s (%s)", s.Shape, s.Op)
		}
	}
	t.Logf("saved for backward: %d tensors, %d bytes (a float32 weight is %d)", len(saved.Tensors), saved.Total, 4*out*in)
}
