package memory

import "github.com/gomlx/gomlx/pkg/core/graph"

// MatmulFLOPs returns the floating-point operations of the matrix products the pure-Go backend executes for the
// compiled graph g: 2 x batch x lhs-cross x rhs-cross x contracting for every DotGeneral it runs (nodes no output
// needs are skipped, as the executor skips them). Elementwise work is not counted. It needs a graph compiled for
// the pure-Go backend.
func MatmulFLOPs(g *graph.Graph) (int64, error) {
	x, err := readSimpleGo(g)
	if err != nil {
		return 0, err
	}
	var flops int64
	for idx := 0; idx < x.numNodesToProcess; idx++ {
		if x.numUses[idx] == 0 {
			continue
		}
		if d := x.nodes[idx].dot; d != nil {
			flops += 2 * int64(d.batchSize) * int64(d.lhsCrossSize) * int64(d.rhsCrossSize) * int64(d.contractingSize)
		}
	}
	return flops, nil
}
