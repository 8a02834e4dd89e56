package memory

import (
	"fmt"
	"slices"

	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
)

// MatmulFLOPs returns the floating-point operations of the matrix products the pure-Go backend executes for the
// compiled graph g: 2 x batch x lhs-cross x rhs-cross x contracting for every DotGeneral it runs (nodes no output
// needs are skipped, as the executor skips them). Elementwise work is not counted. It needs a graph compiled for
// the pure-Go backend.
func MatmulFLOPs(g *graph.Graph) (int64, error) {
	ops, err := MatmulOps(g)
	if err != nil {
		return 0, err
	}
	var flops int64
	for _, op := range ops {
		flops += int64(op.Count) * op.FLOPs
	}
	return flops, nil
}

// MatmulOp is one distinct matrix product of a compiled graph: its operand shapes and dimension numbers (as
// graph.DotGeneral takes them), its FLOPs and how many times the graph runs it.
type MatmulOp struct {
	LHS, RHS                 shapes.Shape
	LHSContracting, LHSBatch []int
	RHSContracting, RHSBatch []int
	FLOPs                    int64
	Count                    int
}

// String names the product, e.g. "[3152 192]x[768 192] c(1)(1) x4".
func (op MatmulOp) String() string {
	return fmt.Sprintf("%v x %v c%v%v b%v%v x%d", op.LHS.Dimensions, op.RHS.Dimensions, op.LHSContracting,
		op.RHSContracting, op.LHSBatch, op.RHSBatch, op.Count)
}

// MatmulOps returns the distinct DotGenerals the pure-Go backend executes for the compiled graph g, in first
// execution order (the executor's schedule), each with its count (unused nodes are skipped, as the executor
// skips them). They are the executor's own normalised products: the Go backend's builder (dot/dot.go) turns a
// DotGeneral whose axes are not in [batch, cross, contracting] order into Transpose/Reshape nodes plus a
// DotGeneral on the rearranged operands, and MatmulOp describes that last one (its operand shapes and axes).
// Rebuilding each with graph.DotGeneral on parameters of the same shapes reproduces the executor's own product
// (for bfloat16/float16 operands followed by the conversion of its float32 result), so timing those alone gives
// the backend's matmul speed on exactly the products a step runs.
func MatmulOps(g *graph.Graph) ([]MatmulOp, error) {
	x, err := readGoBackend(g)
	if err != nil {
		return nil, err
	}
	var ops []MatmulOp
	for _, idx := range x.schedule {
		if idx >= x.numNodesToProcess || x.numUses[idx] == 0 {
			continue
		}
		n := x.nodes[idx]
		d := n.dot
		if d == nil {
			continue
		}
		if len(n.inputs) != 2 {
			return nil, fmt.Errorf("%w: DotGeneral node #%d has %d inputs", ErrInternals, idx, len(n.inputs))
		}
		op := MatmulOp{LHS: x.nodes[n.inputs[0]].shape, RHS: x.nodes[n.inputs[1]].shape,
			LHSContracting: d.lhsContractingAxes, LHSBatch: d.lhsBatchAxes,
			RHSContracting: d.rhsContractingAxes, RHSBatch: d.rhsBatchAxes,
			FLOPs: 2 * int64(d.batchSize) * int64(d.lhsCrossSize) * int64(d.rhsCrossSize) * int64(d.contractingSize), Count: 1}
		found := false
		for i := range ops {
			o := &ops[i]
			if o.LHS.Equal(op.LHS) && o.RHS.Equal(op.RHS) && slices.Equal(o.LHSContracting, op.LHSContracting) &&
				slices.Equal(o.LHSBatch, op.LHSBatch) && slices.Equal(o.RHSContracting, op.RHSContracting) &&
				slices.Equal(o.RHSBatch, op.RHSBatch) {
				o.Count++
				found = true
				break
			}
		}
		if !found {
			ops = append(ops, op)
		}
	}
	return ops, nil
}

// ExecutorOps counts, by op name ("Erf", "DotGeneral", "OptimizationBarrier", ...), the nodes the pure-Go
// backend's executor runs for the compiled graph g: after its de-duplication of identical nodes and its other
// compile passes, and without nodes no output needs. It shows what the backend really computes, for example
// whether a backward recomputation survived or was merged back into the forward value.
func ExecutorOps(g *graph.Graph) (map[string]int, error) {
	x, err := readGoBackend(g)
	if err != nil {
		return nil, err
	}
	counts := map[string]int{}
	for _, idx := range x.schedule {
		if idx < x.numNodesToProcess && x.numUses[idx] > 0 {
			counts[x.nodes[idx].op.String()]++
		}
	}
	return counts, nil
}
