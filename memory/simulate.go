package memory

import (
	"errors"
	"fmt"
	"reflect"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
)

// Errors returned by SimulatePeak and MeasurePeak; test for them with errors.Is.
var (
	// ErrNotCompiled: the graph has no compiled executable (it was never compiled, or it was finalized).
	ErrNotCompiled = errors.New("memory: graph is not compiled")
	// ErrNotGoBackend: the graph is compiled for a backend other than GoMLX's pure-Go one ("go", package
	// github.com/gomlx/compute/gobackend).
	ErrNotGoBackend = errors.New("memory: graph is not compiled on the pure-Go backend")
	// ErrNotSimpleGo is the old name of ErrNotGoBackend (the pure-Go backend was called simplego before GoMLX
	// v0.28).
	//
	// Deprecated: use ErrNotGoBackend.
	ErrNotSimpleGo = ErrNotGoBackend
	// ErrInternals: the Go backend's unexported executor state is not what this package was written against
	// (github.com/gomlx/compute v0.1.2, GoMLX v0.28.2); the simulation refuses to guess.
	ErrInternals = errors.New("memory: the Go backend's executor internals differ from compute v0.1.2 (GoMLX v0.28.2)")
	// ErrUnsupported: the graph holds something the simulation cannot replay without running it: ops whose
	// buffers depend on the data (If, While, Sort), nested function calls (Call, closures) or dynamic shapes.
	ErrUnsupported = errors.New("memory: the simulation does not support this graph")
	// ErrNoXLA: XLAProgramSizes and XLAProgramPeak in builds without the xla tag.
	ErrNoXLA = errors.New("memory: this binary was built without XLA support (rebuild with -tags xla, which " +
		"needs cgo); XLA compiled-program sizes are unavailable")
)

// SimOptions configures SimulatePeak.
type SimOptions struct {
	// Donate marks, in parameter order, the inputs whose buffers are donated to the execution (as
	// graph.DonateTensorBuffer does, and as Graph.Run does for plain Go values; *tensors.Tensor inputs are not
	// donated). A donated input is owned by the executor: it can be reused in place, it is freed at its last use
	// and it is not resident. Nil means nothing is donated; otherwise it needs one entry per parameter.
	Donate []bool
	// AssumeSequential simulates a graph whose backend may run ops in parallel (the Go backend's default
	// "dynamic" mode, or ops_parallel) as if it ran them sequentially, in its schedule. Without it such a graph
	// is an error: the op order, and so the peak, of a parallel execution is not deterministic.
	// engine.NewBackend configures ops_sequential unless told otherwise.
	AssumeSequential bool
	// MatmulWorkers is how many workers of a large matrix product are assumed to hold their packing panels at
	// the same time (see SimulatePeak). 0 means the most the backend can start, which makes the figure an upper
	// bound; it is exact when the backend runs the large path on one worker (configured with parallelism=1, or
	// on one CPU). Values above that maximum are lowered to it.
	MatmulWorkers int
}

// SimulatePeak replays the pure-Go backend's sequential execution of the compiled graph g, without running
// it, and returns its peak memory (Method MethodSimulation).
//
// The replay walks the executor's own node list (github.com/gomlx/compute/internal/gobackend, compute v0.1.2,
// GoMLX v0.28.2), after the builder's rewrites (its DotGeneral normalisation into Transpose/Reshape +
// DotGeneral + ConvertDType/Reshape nodes, its de-duplication of identical nodes, its ImplicitBroadcastFusion
// pass), in the executor's own order (FunctionExecutable.Schedule: DependencyOrderSchedule, longest path to an
// output first, unless the backend was configured with creation_order), and models exactly what each
// executor does with the backend's buffer pool (executable.go: FunctionExecutable.Execute, executeSequentially,
// executeNode; the per-op rules are listed at simUnaryReuse and below):
//
//   - parameters are pre-filled with the caller's buffers, owned only when donated; constants are never owned;
//     nodes nobody uses are skipped; an input is owned by an op only at its last use;
//   - an op either reuses an owned input's buffer as its output (unary ops; binary ops, rhs first then lhs,
//     when the input's shape equals the output's; Where; Identity, Reshape and the barriers; Scatter;
//     Reverse and Bitcast in some cases; FusedDense; RNGBitGenerator's state) or takes a new output buffer;
//   - the scratch buffers an op takes from the pool and puts back inside one call are counted while it runs:
//     the large matrix product's packing panels (three per worker, see below), ArgMinMax's running best values
//     and indices, the float32 accumulator of ReduceSum/ReduceProduct on bfloat16/float16, the unpacked
//     weights of FusedQuantizedDense, the int64 indices of QuantizedEmbeddingLookup;
//   - every other buffer goes back to the pool (or, for user-fed buffers, to the garbage collector) after its
//     last use; at the end, outputs not owned by the execution are cloned and the other owned buffers freed.
//
// Sizes are what the pool really allocates: every buffer's bytes rounded up by support.TwoBitBucketLen (see
// bufferBytes), the same accounting as tools/peakmem's counter.
//
// The large matrix product (dot/matmul: the nosimd kernels, and with GOEXPERIMENT=simd the AVX-512 or AVX2
// ones; used when the product's multiply-adds reach 4 Mi) hands its work to up to maxParallelism workers
// (workerspool.Pool.Saturate, 2 x GOMAXPROCS by default), and each worker takes three packing panels from the
// pool when it starts and returns them when the work runs out. How many workers hold panels at the same time
// depends on goroutine scheduling; the simulation counts SimOptions.MatmulWorkers of them, by default all the
// backend can start, so its peak is an upper bound that is reached or overestimates by at most a few panel
// sets (about 1 MiB each for the nosimd float32 kernel, 316 KiB for AVX-512 float32). It is exact, to the
// byte, when the large path runs on one worker (a backend configured with parallelism=1) or when no product
// takes it; tools/peakmem's tests check that.
//
// Peak.Bytes is the maximum, over the run, of the resident bytes plus the pool buffers the execution holds;
// Peak.Resident is the bytes of the non-donated inputs and of the graph's constants. The outputs are still held
// when the run ends, so they are part of the peak.
//
// The executor's own FunctionExecutable.EstimatedTemporaryMemory (GoMLX v0.28) is not a substitute: it adds up
// each node's output without in-place reuse, bucketing, clones or scratch buffers, and leaves out the inputs
// and constants (see ExecutorEstimate and tools/peakmem/README.md for a measured comparison).
func SimulatePeak(g *graph.Graph, opts SimOptions) (Peak, error) {
	x, err := readGoBackend(g)
	if err != nil {
		return Peak{}, err
	}
	if !x.sequential && !opts.AssumeSequential {
		return Peak{}, fmt.Errorf("memory: the backend of graph %q may run ops in parallel, so its peak depends on "+
			"scheduling; use a backend configured with ops_sequential (engine.NewBackend does) or set "+
			"SimOptions.AssumeSequential", x.name)
	}
	r, err := simulate(x, opts)
	if err != nil {
		return Peak{}, err
	}
	return r.peak, nil
}

// ExecutorEstimate returns the Go backend's own estimate of the compiled graph g's temporary memory
// (FunctionExecutable.EstimatedTemporaryMemory, new in GoMLX v0.28, what the backend logs at verbosity 1).
// It walks the same schedule as SimulatePeak but adds every node's output at its unbucketed size, never reuses a
// buffer in place, and counts no clones of outputs and no scratch buffers, and it leaves out the inputs and the
// constants. It is neither a peak nor comparable with Peak.Transient: on training steps it overestimates the
// transient peak (in-place reuse is common), and it cannot be checked against the pool counter. memfit only
// reports it for comparison.
func ExecutorEstimate(g *graph.Graph) (int64, error) {
	x, err := readGoBackend(g)
	if err != nil {
		return 0, err
	}
	return x.estimatedTemporaryMemory()
}

// MeasurePeak calls run, which must execute the compiled graph g once (typically g.Run) and leave the outputs
// of that execution alive until MeasurePeak returns, and reports the peak memory of that execution.
//
// When a pool counter is installed (builds with tools/peakmem's patched Go backend), the figure is measured
// (MethodPoolCounter): Bytes is the counter's peak during run, Resident is what the pool still holds after run
// apart from g's outputs (the parameters, including those g.Run transferred to the backend, and any other
// buffers alive in the process), and both include g's constants, which the counter leaves out (the Go backend
// takes them from its pool when the graph is built and holds them for the graph's lifetime). With only g's
// buffers alive this is the same accounting as SimulatePeak, and Transient is comparable in any case
// (tools/peakmem's tests find the two equal to the byte on backends that run the large matrix product on one
// worker). The counter is process-wide: executions running at the same time on any Go backend are counted too.
// Without a counter, it calls run and returns SimulatePeak(g, SimOptions{}) (MethodSimulation; inputs are
// taken as not donated, which is what g.Run does with *tensors.Tensor inputs). A graph compiled for XLA gets
// XLAProgramPeak (builds with the xla tag only).
//
// A panic inside run is returned as an error.
func MeasurePeak(g *graph.Graph, run func() error) (Peak, error) {
	return MeasurePeakDonating(g, nil, run)
}

// MeasurePeakDonating is MeasurePeak for a run that donates some of its inputs (donate, in parameter order, as
// SimOptions.Donate): the simulation then treats those inputs as the executor's own (reused in place, freed at
// their last use, not resident). The pool counter measures whatever run does.
func MeasurePeakDonating(g *graph.Graph, donate []bool, run func() error) (Peak, error) {
	if run == nil {
		return Peak{}, errors.New("memory: MeasurePeak needs a run function")
	}
	c := poolCounter()
	var liveBefore int64
	if c != nil {
		liveBefore = c.Live()
		c.ResetPeak()
	}
	if err := callRun(run); err != nil {
		return Peak{}, err
	}
	var peak, liveAfter int64
	if c != nil {
		peak, liveAfter = c.Peak(), c.Live()
	}
	x, err := readGoBackend(g)
	if errors.Is(err, ErrNotGoBackend) {
		return XLAProgramPeak(g)
	}
	if err != nil {
		return Peak{}, err
	}
	if c == nil {
		if !x.sequential {
			return Peak{}, fmt.Errorf("memory: the backend of graph %q may run ops in parallel; no pool counter "+
				"is installed and the simulation needs ops_sequential", x.name)
		}
		r, err := simulate(x, SimOptions{Donate: donate})
		if err != nil {
			return Peak{}, err
		}
		return r.peak, nil
	}
	consts := x.constantBytes()
	resident := liveAfter - x.outputBytes()
	if resident < 0 {
		// run released the outputs already: fall back to what was held before it.
		resident = liveBefore
	}
	return Peak{Bytes: peak + consts, Resident: resident + consts, Method: MethodPoolCounter}, nil
}

// callRun calls run, turning a panic into an error.
func callRun(run func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if e, ok := r.(error); ok {
				err = fmt.Errorf("memory: run panicked: %w", e)
			} else {
				err = fmt.Errorf("memory: run panicked: %v", r)
			}
		}
	}()
	return run()
}

// ---------------------------------------------------------------------------------------------------------------
// The simulation proper: a replay of the Go backend's FunctionExecutable.Execute + executeSequentially +
// executeNode (internal/gobackend/executable.go) over goExec, with the per-op buffer behaviour of the executors
// in internal/gobackend/ops, fusedops, dot and dot/matmul.
// ---------------------------------------------------------------------------------------------------------------

// simResult is a simulation's outcome.
type simResult struct {
	peak Peak
	// peakNode is the executor node running when the peak was first reached (-1: before any op, or while cloning
	// outputs at the end); for diagnostics.
	peakNode int
	// endLive is what the execution still holds when Execute returns, above the resident bytes: the outputs.
	endLive int64
}

type simulator struct {
	x       *goExec
	workers int // large-matmul workers holding panels at once
	live    int64
	peak    int64
	curNode int
	atNode  int

	// timeline, when not nil, receives one point per executed node.
	timeline *[]TimelinePoint
	opMax    int64 // the most held while the current op ran

	// Per executor node, as in the executor's funcExecBuffers: whether results[i] is set, owned[i],
	// numUsed[i], and the bytes of the buffer in results[i].
	has     []bool
	owned   []bool
	numUsed []int
	bytes   []int64
}

func (s *simulator) alloc(b int64) {
	s.live += b
	s.opMax = max(s.opMax, s.live)
	if s.live > s.peak {
		s.peak = s.live
		s.atNode = s.curNode
	}
}

func (s *simulator) free(b int64) { s.live -= b }

// scratch counts buffers taken from the pool and put back inside the current op.
func (s *simulator) scratch(b int64) {
	s.alloc(b)
	s.free(b)
}

// TimelinePoint is the memory held after one executor op of a simulated execution (see SimulateTimeline).
type TimelinePoint struct {
	// Step counts executed ops from 0; Node is the executor's node index.
	Step, Node int
	// Op is the executor op type.
	Op string
	// Shape is the op's output shape (the first output's, for multi-output ops).
	Shape shapes.Shape
	// Live is the pool bytes the execution holds after the op, above the resident bytes; Max is the most it held
	// while the op ran (scratch buffers included).
	Live, Max int64
}

// SimulateTimeline replays the execution like SimulatePeak and also returns the bytes held after each op, for
// finding where a peak comes from or plotting it.
func SimulateTimeline(g *graph.Graph, opts SimOptions) (Peak, []TimelinePoint, error) {
	x, err := readGoBackend(g)
	if err != nil {
		return Peak{}, nil, err
	}
	if !x.sequential && !opts.AssumeSequential {
		return Peak{}, nil, fmt.Errorf("memory: the backend of graph %q may run ops in parallel; use ops_sequential", x.name)
	}
	var tl []TimelinePoint
	r, err := simulateWith(x, opts, &tl)
	if err != nil {
		return Peak{}, nil, err
	}
	return r.peak, tl, nil
}

// simulate replays one execution.
func simulate(x *goExec, opts SimOptions) (simResult, error) { return simulateWith(x, opts, nil) }

// checkSupported refuses what the simulation cannot replay.
func (x *goExec) checkSupported() error {
	for idx := range x.numNodesToProcess {
		n := &x.nodes[idx]
		if x.numUses[idx] == 0 {
			continue
		}
		if simRefused[n.op] || n.captured > 0 {
			return fmt.Errorf("%w: graph %q has a %s node (#%d), whose buffers depend on the data or on a nested "+
				"function", ErrUnsupported, x.name, n.op, idx)
		}
		dynamic := len(n.multiShapes) == 0 && n.shape.IsDynamic()
		for _, ms := range n.multiShapes {
			dynamic = dynamic || ms.IsDynamic()
		}
		if dynamic {
			return fmt.Errorf("%w: graph %q has dynamic shapes (node #%d, %s)", ErrUnsupported, x.name, idx, n.op)
		}
	}
	return nil
}

func simulateWith(x *goExec, opts SimOptions, timeline *[]TimelinePoint) (simResult, error) {
	donate := opts.Donate
	if donate != nil && len(donate) != len(x.inputs) {
		return simResult{}, fmt.Errorf("memory: SimOptions.Donate has %d entries, graph %q has %d parameters",
			len(donate), x.name, len(x.inputs))
	}
	if err := x.checkSupported(); err != nil {
		return simResult{}, err
	}
	n := x.numNodesToProcess
	s := &simulator{x: x, curNode: -1, atNode: -1, timeline: timeline, workers: x.largeMatmulWorkers(),
		has: make([]bool, n), owned: make([]bool, n), numUsed: make([]int, n), bytes: make([]int64, n)}
	if opts.MatmulWorkers > 0 {
		s.workers = min(s.workers, opts.MatmulWorkers)
	}
	resident := x.constantBytes()

	// Parameters are pre-filled with the caller's buffers; donated ones are owned by the execution.
	for i, idx := range x.inputs {
		b := bufferBytes(x.nodes[idx].shape)
		d := donate != nil && donate[i]
		if idx >= n {
			// Not reachable from any output (the executor itself indexes past its results here; never seen in
			// practice, since GoMLX creates parameters first): it stays with the caller.
			resident += b
			continue
		}
		s.has[idx], s.owned[idx], s.bytes[idx] = true, d, b
		if d {
			s.alloc(b)
		} else {
			resident += b
		}
	}

	// executeSequentially, in the executor's schedule.
	for _, idx := range x.schedule {
		if idx >= n || s.has[idx] || x.numUses[idx] == 0 {
			continue
		}
		s.curNode = idx
		s.opMax = s.live
		if err := s.executeNode(&x.nodes[idx]); err != nil {
			return simResult{}, err
		}
		if s.timeline != nil {
			node := &x.nodes[idx]
			shape := node.shape
			if len(node.multiShapes) > 0 {
				shape = node.multiShapes[0]
			}
			*s.timeline = append(*s.timeline, TimelinePoint{Step: len(*s.timeline), Node: idx, Op: node.op.String(),
				Shape: shape, Live: s.live, Max: s.opMax})
		}
	}
	s.curNode = -1

	// Execute's epilogue: outputs not owned by the execution are cloned (CloneBuffer), owned ones handed over,
	// then every other owned buffer is put back.
	var outBytes int64
	for _, idx := range x.outputs {
		if !s.has[idx] {
			return simResult{}, fmt.Errorf("memory: simulation of graph %q: output node #%d was not computed", x.name, idx)
		}
		b := s.bytes[idx]
		if !s.owned[idx] {
			b = bufferBytes(x.nodes[idx].shape)
			s.alloc(b)
		}
		outBytes += b
		s.has[idx] = false
	}
	for idx := range n {
		if s.has[idx] && s.owned[idx] {
			s.free(s.bytes[idx])
			s.has[idx] = false
		}
	}
	if s.live != outBytes {
		return simResult{}, fmt.Errorf("memory: simulation of graph %q is inconsistent: %d bytes held at the end, "+
			"outputs are %d bytes", x.name, s.live, outBytes)
	}
	return simResult{
		peak:     Peak{Bytes: resident + s.peak, Resident: resident, Method: MethodSimulation},
		peakNode: s.atNode,
		endLive:  s.live,
	}, nil
}

// executeNode mirrors FunctionExecutable.executeNode (executable.go).
func (s *simulator) executeNode(node *goNode) error {
	x := s.x
	idx := node.idx
	if node.op == compute.OpTypeConstant {
		s.has[idx], s.owned[idx] = true, false
		s.bytes[idx] = node.constRawBytes
		return nil
	}
	owned := make([]bool, len(node.inputs))
	for i, in := range node.inputs {
		if !s.has[in] {
			return fmt.Errorf("memory: simulation of graph %q: input #%d of node #%d (%s) is not computed",
				x.name, i, idx, node.op)
		}
		// Only "own" the input if this is its last use.
		owned[i] = s.owned[in] && x.numUses[in]-s.numUsed[in] == 1
	}

	var reused []bool // reused[i]: the op took over input i's buffer (the executor's inputs[i] = nil).
	if len(node.multiShapes) > 0 {
		outs, reuse, err := s.multiOutputOp(node, owned)
		if err != nil {
			return err
		}
		reused = reuse
		for j, b := range outs {
			out := node.multiNodes[j]
			if out >= x.numNodesToProcess || x.numUses[out] == 0 {
				s.free(b) // Not part of the computation: put back at once.
				continue
			}
			s.has[out], s.owned[out], s.bytes[out] = true, true, b
		}
	} else {
		b, reuse, err := s.singleOutputOp(node, owned)
		if err != nil {
			return err
		}
		reused = make([]bool, len(node.inputs))
		if reuse >= 0 {
			reused[reuse] = true
			b = s.bytes[node.inputs[reuse]]
		}
		s.has[idx], s.owned[idx], s.bytes[idx] = true, true, b
	}

	// Mark inputs used; put back the owned ones at their last use (a reused one moved to the output).
	for i, in := range node.inputs {
		s.numUsed[in]++
		if reused[i] {
			s.has[in] = false
			continue
		}
		if s.numUsed[in] == x.numUses[in] && s.owned[in] {
			s.free(s.bytes[in])
			s.has[in] = false
		}
	}
	return nil
}

// Op families, by what their executor does with its buffers (files under internal/gobackend).
var (
	// ops/unaryops.go, unaryOperandAndOutput: reuse the owned operand, else a new buffer of its shape.
	simUnaryReuse = opSet(compute.OpTypeNeg, compute.OpTypeAbs, compute.OpTypeSign, compute.OpTypeLogicalNot,
		compute.OpTypeBitwiseNot, compute.OpTypeBitCount, compute.OpTypeClz, compute.OpTypeExp,
		compute.OpTypeExpm1, compute.OpTypeLog, compute.OpTypeLog1p, compute.OpTypeCeil, compute.OpTypeFloor,
		compute.OpTypeRound, compute.OpTypeRsqrt, compute.OpTypeSqrt, compute.OpTypeCos, compute.OpTypeSin,
		compute.OpTypeTanh, compute.OpTypeLogistic, compute.OpTypeErf)
	// ops/binaryops.go, binaryOperandsAndOutputForExecution (used by ops/gen_exec_binary.go and ops/shiftops.go):
	// reuse the owned rhs, else the owned lhs, when its shape equals the output's; else a new buffer.
	simBinaryReuse = opSet(compute.OpTypeAdd, compute.OpTypeMul, compute.OpTypeSub, compute.OpTypeDiv,
		compute.OpTypeRem, compute.OpTypePow, compute.OpTypeAtan2, compute.OpTypeMax, compute.OpTypeMin,
		compute.OpTypeBitwiseAnd, compute.OpTypeBitwiseOr, compute.OpTypeBitwiseXor, compute.OpTypeLogicalAnd,
		compute.OpTypeLogicalOr, compute.OpTypeLogicalXor, compute.OpTypeShiftLeft,
		compute.OpTypeShiftRightArithmetic, compute.OpTypeShiftRightLogical)
	// Reuse the owned first input, else copy it into a new buffer: ops/identity.go, ops/optimizationbarrier.go,
	// ops/schedulingbarrier.go (its other inputs are dependencies only), ops/reshape.go (Reshape and
	// DynamicReshape), fusedops/dense.go (input 0 is the DotGeneral result; the bias and activation are applied
	// in place).
	simFirstInputReuse = opSet(compute.OpTypeIdentity, compute.OpTypeOptimizationBarrier,
		compute.OpTypeSchedulingBarrier, compute.OpTypeReshape, compute.OpTypeDynamicReshape, compute.OpTypeFusedDense)
	// ops/reduce.go, execReduce: always a new output (a scalar operand with no axes is copied); ReduceSum and
	// ReduceProduct on bfloat16/float16 also take a float32 accumulator of the output's size.
	simReduce = opSet(compute.OpTypeReduceMax, compute.OpTypeReduceMin, compute.OpTypeReduceSum,
		compute.OpTypeReduceProduct, compute.OpTypeReduceBitwiseAnd, compute.OpTypeReduceBitwiseOr,
		compute.OpTypeReduceBitwiseXor, compute.OpTypeReduceLogicalAnd, compute.OpTypeReduceLogicalOr,
		compute.OpTypeReduceLogicalXor)
	// ops/scatter.go, execScatter: reuse the owned operand, else clone it.
	simScatter = opSet(compute.OpTypeScatterMax, compute.OpTypeScatterMin, compute.OpTypeScatterSum)
	// A new output buffer of the node's shape and nothing else from the pool: comparisons
	// (ops/gen_exec_binary.go) and IsFinite (ops/unaryops.go), ops/transpose.go, broadcastindim.go, iota.go,
	// gather.go, concatenate.go, convertdtype.go, slice.go, pad.go, reducewindow.go, convgeneral.go, dynamic.go,
	// fusedops/softmax.go, gelu.go, layernorm.go.
	simNewOutput = opSet(compute.OpTypeIsFinite, compute.OpTypeEqual, compute.OpTypeNotEqual,
		compute.OpTypeGreaterOrEqual, compute.OpTypeGreaterThan, compute.OpTypeLessOrEqual,
		compute.OpTypeLessThan, compute.OpTypeTranspose, compute.OpTypeBroadcastInDim,
		compute.OpTypeIota, compute.OpTypeGather, compute.OpTypeConcatenate, compute.OpTypeConvertDType,
		compute.OpTypeSlice, compute.OpTypePad, compute.OpTypeReduceWindow, compute.OpTypeConvGeneral,
		compute.OpTypeDynamicDimensionSize, compute.OpTypeDynamicShape, compute.OpTypeFusedSoftmax,
		compute.OpTypeFusedGelu, compute.OpTypeFusedLayerNorm)
	// Modelled one by one in singleOutputOp and multiOutputOp.
	simOwnModel = opSet(compute.OpTypeParameter, compute.OpTypeConstant, compute.OpTypeWhere,
		compute.OpTypeArgMinMax, compute.OpTypeDotGeneral, compute.OpTypeReverse, compute.OpTypeBitcast,
		compute.OpTypeFusedQuantizedDense, compute.OpTypeQuantizedEmbeddingLookup, compute.OpTypeRNGBitGenerator,
		compute.OpTypeFusedAttentionQKVProjection)
	// simRefused are executors the simulation cannot replay without running the graph: If, While and Sort run
	// closures chosen or repeated by the data (ops/if.go, while.go, sort.go), Call runs a nested function's own
	// executable (ops/call.go). A graph holding one is ErrUnsupported.
	simRefused = opSet(compute.OpTypeIf, compute.OpTypeWhile, compute.OpTypeSort, compute.OpTypeCall)
	// simBuilderOnly are ops the Go backend lists in its capabilities that never reach the executor: the builder
	// rewrites IsNaN into NotEqual (ops/isnan.go) and Clamp into Max + Min (ops/clamp.go); Dot has no builder
	// method left in compute v0.1.2 (graph.Dot builds a DotGeneral).
	simBuilderOnly = opSet(compute.OpTypeDot, compute.OpTypeIsNaN, compute.OpTypeClamp)
)

func opSet(ops ...compute.OpType) map[compute.OpType]bool {
	m := make(map[compute.OpType]bool, len(ops))
	for _, op := range ops {
		m[op] = true
	}
	return m
}

// simModelled reports whether the simulation models the executor of op.
func simModelled(op compute.OpType) bool {
	return simOwnModel[op] || simUnaryReuse[op] || simBinaryReuse[op] || simFirstInputReuse[op] || simReduce[op] ||
		simScatter[op] || simNewOutput[op]
}

// singleOutputOp models one single-output executor: it allocates and frees the op's buffers (output and
// scratch) and returns the bytes of the new output buffer, or the index of the input whose buffer became the
// output (then the bytes are that buffer's).
func (s *simulator) singleOutputOp(node *goNode, owned []bool) (outBytes int64, reuse int, err error) {
	in := func(i int) shapes.Shape { return s.x.nodes[node.inputs[i]].shape }
	newOut := func(shape shapes.Shape) (int64, int, error) {
		b := bufferBytes(shape)
		s.alloc(b)
		return b, -1, nil
	}
	op := node.op
	switch {
	case simUnaryReuse[op]:
		if owned[0] {
			return 0, 0, nil
		}
		return newOut(in(0))

	case simBinaryReuse[op]:
		switch {
		case owned[1] && in(1).Equal(node.shape):
			return 0, 1, nil
		case owned[0] && in(0).Equal(node.shape):
			return 0, 0, nil
		}
		return newOut(node.shape)

	case simFirstInputReuse[op], simScatter[op]:
		if owned[0] {
			return 0, 0, nil
		}
		return newOut(node.shape)

	case simReduce[op]:
		if !node.hasAxes {
			return 0, 0, fmt.Errorf("%w: %s node #%d carries no reduce axes", ErrInternals, op, node.idx)
		}
		b, r, err := newOut(node.shape)
		copyOnly := len(node.axes) == 0 && in(0).Rank() == 0
		if !copyOnly && (op == compute.OpTypeReduceSum || op == compute.OpTypeReduceProduct) &&
			(node.shape.DType == dtypes.BFloat16 || node.shape.DType == dtypes.Float16) {
			s.scratch(bufferBytes(shapes.Make(dtypes.Float32, node.shape.Size())))
		}
		return b, r, err

	case op == compute.OpTypeWhere:
		switch {
		case in(1).Equal(node.shape) && owned[1]:
			return 0, 1, nil
		case in(2).Equal(node.shape) && owned[2]:
			return 0, 2, nil
		}
		return newOut(node.shape)

	case op == compute.OpTypeReverse:
		// ops/reverse.go: with no axes, reuse the owned operand; else a new buffer.
		if !node.hasAxes {
			return 0, 0, fmt.Errorf("%w: Reverse node #%d carries no axes", ErrInternals, node.idx)
		}
		if len(node.axes) == 0 && owned[0] {
			return 0, 0, nil
		}
		return newOut(in(0))

	case op == compute.OpTypeBitcast:
		// ops/bitcast.go: reuse the owned operand when the Go storage types allow it.
		src, dst := in(0).DType, node.shape.DType
		canReuse := src.GoType() == dst.GoType()
		if src.Bits() != dst.Bits() {
			canReuse = src.GoType().Kind() == reflect.Uint8 && dst.GoType().Kind() == reflect.Uint8
		}
		if owned[0] && canReuse {
			return 0, 0, nil
		}
		return newOut(node.shape)

	case op == compute.OpTypeArgMinMax:
		// ops/argminmax.go: the output, then the running best values and their int32 indices, one per suffix
		// position, put back before the op returns.
		if node.argAxis < 0 {
			return 0, 0, fmt.Errorf("%w: ArgMinMax node #%d carries no axis", ErrInternals, node.idx)
		}
		b, r, err := newOut(node.shape)
		operand := in(0)
		suffix := 1
		for _, d := range operand.Dimensions[node.argAxis+1:] {
			suffix *= d
		}
		s.scratch(bufferBytes(shapes.Make(operand.DType, suffix)) + bufferBytes(shapes.Make(dtypes.Int32, suffix)))
		return b, r, err

	case op == compute.OpTypeDotGeneral:
		return s.dotGeneral(node)

	case op == compute.OpTypeFusedQuantizedDense:
		// fusedops/quantizeddense.go: the output, then sub-byte weights unpacked to int8/uint8 for the call (GGML
		// weights are uint8 and need no unpacking, quantizeddense_ggml.go).
		b, r, err := newOut(node.shape)
		switch w := in(1); w.DType {
		case dtypes.Int4, dtypes.Int2:
			s.scratch(bufferBytes(shapes.Make(dtypes.Int8, w.Dimensions...)))
		case dtypes.Uint4, dtypes.Uint2:
			s.scratch(bufferBytes(shapes.Make(dtypes.Uint8, w.Dimensions...)))
		}
		return b, r, err

	case op == compute.OpTypeQuantizedEmbeddingLookup:
		// fusedops/quantizeddense.go: the output, then the indices converted to int64 unless they are.
		b, r, err := newOut(node.shape)
		if idx := in(1); idx.DType != dtypes.Int64 {
			s.scratch(bufferBytes(shapes.Make(dtypes.Int64, idx.Dimensions...)))
		}
		return b, r, err

	case simNewOutput[op]:
		return newOut(node.shape)
	}
	return 0, 0, fmt.Errorf("%w: the simulation does not model the executor of %s (node #%d)", ErrInternals, op, node.idx)
}

// The large matrix product's packing panels (dot/matmul): per worker, an LHS panel of Mc x Kc and an RHS panel
// of Kc x Nc input values and an output panel of Mc x Nc output values. nosimd.go's NoSIMDParams serve every
// dtype of the nosimd kernels; avx512.go's and avx2.go's parameters depend on the input dtype.
type panelParams struct{ mc, kc, nc int }

var (
	simNoSIMDPanels = panelParams{mc: 2, kc: 512, nc: 512} // NoSIMDParams
	simSIMDPanels   = map[dtypes.DType]panelParams{        // AVX512Params* and AVX2Params* (identical panels)
		dtypes.Float32:  {mc: 24, kc: 128, nc: 512},
		dtypes.BFloat16: {mc: 32, kc: 128, nc: 768},
		dtypes.Float16:  {mc: 32, kc: 128, nc: 768},
		dtypes.Float64:  {mc: 16, kc: 64, nc: 256},
	}
)

// simSmallMatMulThreshold is nosimd.go's noSIMDSmallMatMulSizeThreshold: products with fewer multiply-adds take
// the small kernels, which use no pool buffers.
const simSmallMatMulThreshold = 4 * 1024 * 1024

// dotPanelBytes returns the bytes of one worker's packing panels for the product d, or 0 when the product takes
// a small kernel. The routers (nosimd_router.go, avx512_router.go, avx2_router.go) choose the large path when
// the product's multiply-adds reach simSmallMatMulThreshold: batch x M x N x K for nosimd and AVX-512, M x N x K
// (per batch item) for AVX2.
func dotPanelBytes(d *goDot) (int64, error) {
	perMatrix := int64(d.lhsCrossSize) * int64(d.rhsCrossSize) * int64(d.contractingSize)
	var p panelParams
	size := int64(d.batchSize) * perMatrix
	switch d.impl {
	case "simd:nosimd":
		p = simNoSIMDPanels
	case "simd:avx512", "simd:avx2":
		var ok bool
		if p, ok = simSIMDPanels[d.inputDType]; !ok {
			return 0, fmt.Errorf("%w: no %s panel sizes for input dtype %s", ErrInternals, d.impl, d.inputDType)
		}
		if d.impl == "simd:avx2" {
			size = perMatrix
		}
	default:
		return 0, fmt.Errorf("%w: unknown DotGeneral implementation %q", ErrInternals, d.impl)
	}
	if size < simSmallMatMulThreshold {
		return 0, nil
	}
	return bufferBytes(shapes.Make(d.inputDType, p.mc*p.kc)) + bufferBytes(shapes.Make(d.inputDType, p.kc*p.nc)) +
		bufferBytes(shapes.Make(d.outputDType, p.mc*p.nc)), nil
}

// dotGeneral models execDotGeneral (dot/dot.go): a new output buffer of the normalised shape [batch, M, N]
// (in float32 for half-precision inputs), then, on the large path, each worker's packing panels, put back
// before the op returns (nosimd_large.go, avx512_large.go, avx2_large.go and their generated variants).
func (s *simulator) dotGeneral(node *goNode) (int64, int, error) {
	if node.dot == nil {
		return 0, 0, fmt.Errorf("%w: DotGeneral node #%d carries no dot.NodeData", ErrInternals, node.idx)
	}
	out := bufferBytes(node.shape)
	s.alloc(out)
	panels, err := dotPanelBytes(node.dot)
	if err != nil {
		return 0, 0, fmt.Errorf("DotGeneral node #%d: %w", node.idx, err)
	}
	s.scratch(int64(s.workers) * panels)
	return out, -1, nil
}

// multiOutputOp models the multi-output executors: it returns the bytes of each output buffer and which inputs
// were taken over.
func (s *simulator) multiOutputOp(node *goNode, owned []bool) ([]int64, []bool, error) {
	reused := make([]bool, len(node.inputs))
	switch {
	case node.op == compute.OpTypeRNGBitGenerator && len(node.multiShapes) == 2:
		// ops/rngbitgenerator.go: a new buffer for the random data; the state reuses the owned input, else a new
		// buffer.
		data := bufferBytes(node.multiShapes[1])
		s.alloc(data)
		state := s.bytes[node.inputs[0]]
		if owned[0] {
			reused[0] = true
		} else {
			state = bufferBytes(node.multiShapes[0])
			s.alloc(state)
		}
		return []int64{state, data}, reused, nil
	case node.op == compute.OpTypeFusedAttentionQKVProjection && len(node.multiShapes) == 3:
		// fusedops/attentionqkv.go: three new buffers.
		outs := make([]int64, 3)
		for i, ms := range node.multiShapes {
			outs[i] = bufferBytes(ms)
			s.alloc(outs[i])
		}
		return outs, reused, nil
	}
	return nil, nil, fmt.Errorf("%w: the simulation does not model multi-output %s (node #%d)",
		ErrInternals, node.op, node.idx)
}
