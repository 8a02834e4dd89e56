package engine

import (
	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/support/envutil"
	"github.com/gomlx/gomlx/core/graph"
)

// Fused reports whether x's backend runs op, one of the backend's fused ops (compute.OpTypeFusedActivation,
// OpTypeFusedActivationVJP, OpTypeFusedSoftmax, ...), itself on x's dtype: float32 and float64 only (the pure-Go
// backend's fused softmax, LayerNorm and dense failed on half precision when they ran in compute v0.1.2; compute
// v0.1.14 has half-precision kernels for some, which memfit has not tested). memfit's layers use such an op for
// the forward value where it exists, and the fused activation gradient where it reads only what memfit's own
// backward keeps, so what the backward pass keeps does not change; elsewhere
// (XLA fuses elementwise ops by itself) they build the same value from plain ops. GOMLX_FUSION=0 turns the fused
// ops off, as it does in GoMLX.
func Fused(x *graph.Node, op compute.OpType) bool {
	if dt := x.DType(); dt != dtypes.Float32 && dt != dtypes.Float64 {
		return false
	}
	if ok, err := envutil.ReadBool(graph.FusionEnv, true); err != nil || !ok {
		return false
	}
	return x.Graph().Backend().Capabilities().Operations[op]
}
