package memory

import (
	"fmt"
	"reflect"
	"runtime"
	"unsafe"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/compute/support"
	"github.com/gomlx/gomlx/core/graph"
)

// ---------------------------------------------------------------------------------------------------------------
// memfit's copy of a compiled graph as the pure-Go backend's executor sees it. The types below are what the
// simulation works on; they are filled from the executor's unexported state by readGoBackend, which lives with
// everything else that depends on one compute version in gobackend_v0_1_14.go (the fence). Nothing here reads the
// backend.
// ---------------------------------------------------------------------------------------------------------------

// goExec is memfit's copy of what the Go backend's executor knows about a compiled graph.
type goExec struct {
	name              string
	nodes             []goNode // all nodes of the main function, indexed by Node.Index
	inputs            []int    // Index of each parameter, in parameter order
	outputs           []int    // Index of each output, in output order
	numNodesToProcess int
	numUses           []int // len numNodesToProcess
	schedule          []int // the executor's order of execution (FunctionExecutable.Schedule)
	sequential        bool  // the backend runs ops one at a time (ops_sequential)
	creationOrder     bool  // the backend's schedule is the creation order (creation_order)
	noOps             bool  // the backend skips the computations (no_ops)
	// maxParallelism is the backend's workers-pool target (2 x GOMAXPROCS by default, 0 no parallelism, < 0
	// unlimited).
	maxParallelism int
	// estimate is the executor's own EstimatedTemporaryMemory, read when the graph is read.
	estimate func() (int64, error)
}

// goNode is one executor node.
type goNode struct {
	idx         int
	op          compute.OpType
	shape       shapes.Shape
	inputs      []int
	captured    int // number of captured (closure) inputs
	multiShapes []shapes.Shape
	multiNodes  []int
	// selectOutput marks one output of a multi-output node: set by its parent, never executed itself.
	selectOutput bool
	// cachedExecutor is the executor the node's first successful run chose and cached (1-based index into the
	// op's executors, highest priority first), 0 before the node first ran.
	cachedExecutor int

	dot           *goDot    // DotGeneral
	reduce        *goReduce // Reduce*
	dense         *goDense  // FusedDense, FusedDenseVJP
	sdpa          *goSDPA   // FusedScaledDotProductAttention
	axes          []int     // Reverse
	hasAxes       bool
	argAxis       int   // -1 unless ArgMinMax
	constRawBytes int64 // Constant: the bytes its buffer holds
}

// goDot is a matrix product as the executor runs it: the normalised DotGeneral of the Go backend's builder, or
// the product inside a FusedDense.
type goDot struct {
	lhsContractingAxes, lhsBatchAxes                       []int
	rhsContractingAxes, rhsBatchAxes                       []int
	batchSize, lhsCrossSize, rhsCrossSize, contractingSize int
	inputDType, outputDType                                dtypes.DType
	impl                                                   string // the registered implementation's name
	// lhsCache and rhsCache are the product's packed-panel caches (an operand computed from constants only).
	lhsCache, rhsCache goPanelCache
}

// goPanelCache is a packed-panel cache of a product's constant operand: present when the builder gave the
// product one, and the bytes it holds once a run filled it (0 before).
type goPanelCache struct {
	present bool
	held    int64
}

// goReduce is a reduction's configuration: its axes and the pattern the executor classified it as.
type goReduce struct {
	axes    []int
	pattern int
	a, b, c int
}

// goDense is a FusedDense (or FusedDenseVJP) node's product: rows (the inputs' leading size), in and out
// features, and for FusedDense its packed-panel caches.
type goDense struct {
	rows, in, out      int
	hasBias            bool
	lhsCache, rhsCache goPanelCache
}

// goSDPA is what the buffers of a FusedScaledDotProductAttention node depend on.
type goSDPA struct {
	bshd, hasMask, hasSeqLens, hasBias bool
}

// bufferBytes is what the Go backend's GetBuffer allocates for a buffer of this shape: the dtype's bytes for the
// shape, rounded up by support.TwoBitBucketLen (the pool's key). Every buffer an execution holds has this size,
// reused ones included (a buffer is only reused for a shape of the same byte size), so it is what the process
// really holds.
func bufferBytes(s shapes.Shape) int64 {
	return int64(support.TwoBitBucketLen(s.DType.SizeForDimensions(s.Dimensions...)))
}

// constantBytes is the bytes of all the constants the compiled graph holds. The Go backend allocates each
// constant from its pool when the graph is built and keeps it, referenced by its node, for the graph's
// lifetime; an execution never owns or returns it.
func (x *goExec) constantBytes() int64 {
	var b int64
	for i := range x.nodes {
		if x.nodes[i].op == compute.OpTypeConstant {
			b += x.nodes[i].constRawBytes
		}
	}
	return b
}

// outputBytes is the bytes of the graph's outputs.
func (x *goExec) outputBytes() int64 {
	var b int64
	for _, idx := range x.outputs {
		b += bufferBytes(x.nodes[idx].shape)
	}
	return b
}

// largeMatmulWorkers returns how many workers of the large matrix product may hold packing panels at once, and
// whether the product runs on the workers pool at all (parallel false: on the calling goroutine, one set of
// panels). The product runs on the calling goroutine when the pool's adjusted parallelism (its target bounded
// by 1 and GOMAXPROCS) is 1; otherwise the pool's Saturate starts up to maxParallelism workers (GOMAXPROCS when
// unlimited).
func (x *goExec) largeMatmulWorkers() (workers int, parallel bool) {
	procs := runtime.GOMAXPROCS(0)
	adjusted := procs
	if x.maxParallelism >= 0 {
		adjusted = min(max(x.maxParallelism, 1), procs)
	}
	switch {
	case adjusted <= 1:
		return 1, false
	case x.maxParallelism < 0:
		return procs, true
	}
	return x.maxParallelism, true
}

// estimatedTemporaryMemory returns the executor's own FunctionExecutable.EstimatedTemporaryMemory.
func (x *goExec) estimatedTemporaryMemory() (int64, error) {
	if x.estimate == nil {
		return 0, fmt.Errorf("%w: no EstimatedTemporaryMemory", ErrInternals)
	}
	return x.estimate()
}

// compiledExecutable returns g's compiled compute.Executable.
func compiledExecutable(g *graph.Graph) (exe compute.Executable, err error) {
	if g == nil {
		return nil, fmt.Errorf("%w: nil graph", ErrNotCompiled)
	}
	defer func() {
		if r := recover(); r != nil {
			exe, err = nil, fmt.Errorf("%w: reading the graph's executable: %v", ErrNotCompiled, r)
		}
	}()
	exe = g.Executable()
	if exe == nil {
		return nil, fmt.Errorf("%w (graph %q)", ErrNotCompiled, g.Name())
	}
	return exe, nil
}

// privateField returns struct v's field name, made readable, after checking its type (want nil: any type).
// v must be addressable (reached through a pointer).
func privateField(v reflect.Value, name string, want reflect.Type) (reflect.Value, error) {
	if v.Kind() != reflect.Struct || !v.CanAddr() {
		return reflect.Value{}, fmt.Errorf("%w: reading field %q of a non-addressable %s", ErrInternals, name, v.Type())
	}
	f := v.FieldByName(name)
	if !f.IsValid() {
		return reflect.Value{}, fmt.Errorf("%w: %s has no field %q", ErrInternals, v.Type(), name)
	}
	if want != nil && f.Type() != want {
		return reflect.Value{}, fmt.Errorf("%w: %s.%s is %s, want %s", ErrInternals, v.Type(), name, f.Type(), want)
	}
	return reflect.NewAt(f.Type(), unsafe.Pointer(f.UnsafeAddr())).Elem(), nil
}
