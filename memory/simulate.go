package memory

import (
	"errors"
	"fmt"
	"reflect"
	"unsafe"

	"github.com/gomlx/gomlx/backends"
	"github.com/gomlx/gomlx/backends/simplego"
	"github.com/gomlx/gomlx/pkg/core/dtypes"
	"github.com/gomlx/gomlx/pkg/core/graph"
	"github.com/gomlx/gomlx/pkg/core/shapes"
)

// Errors returned by SimulatePeak and MeasurePeak; test for them with errors.Is.
var (
	// ErrNotCompiled: the graph has no compiled executable (it was never compiled, or it was finalized).
	ErrNotCompiled = errors.New("memory: graph is not compiled")
	// ErrNotSimpleGo: the graph is compiled for a backend other than the pure-Go one (simplego).
	ErrNotSimpleGo = errors.New("memory: graph is not compiled on the pure-Go (simplego) backend")
	// ErrInternals: GoMLX's unexported executor state is not what this package was written against
	// (GoMLX v0.26.0); the simulation refuses to guess.
	ErrInternals = errors.New("memory: GoMLX simplego internals differ from v0.26.0")
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
	// AssumeSequential simulates a graph whose backend may run ops in parallel (simplego's default "dynamic"
	// mode, or ops_parallel) as if it ran them sequentially. Without it such a graph is an error: the op
	// order, and so the peak, of a parallel execution is not deterministic. engine.NewBackend always
	// configures ops_sequential.
	AssumeSequential bool
}

// SimulatePeak replays the pure-Go backend's sequential execution of the compiled graph g, without running
// it, and returns its peak memory (Method MethodSimulation).
//
// The replay walks the executor's own node list (not GoMLX's graph nodes: simplego turns one DotGeneral into
// a normalised DotGeneral plus a Reshape, for instance) in the executor's order, and models exactly what
// GoMLX v0.26.0's executor does with its buffer pool: parameters are pre-filled (owned only when donated),
// constants are never owned, nodes nobody uses are skipped, an input is owned by an op only at its last use,
// unary ops, binary ops (rhs first, then lhs, when the shape equals the output's), Where, Identity, Reshape,
// Scatter and RNGBitGenerator reuse an owned input in place, every other buffer is returned to the pool after
// its last use, outputs not owned by the executor are cloned, and the scratch buffers that ops take from the
// pool inside one call (DotGeneral's transposed operands on its small path, its blocked operands and output
// on its large path, its float32 accumulator for bfloat16, ArgMinMax's running best values) are counted while
// the op runs.
//
// Peak.Bytes is the maximum, over the run, of the resident bytes plus the pool buffers the execution holds;
// Peak.Resident is the bytes of the non-donated inputs and of the graph's constants. The outputs are still held
// when the run ends, so they are part of the peak.
func SimulatePeak(g *graph.Graph, opts SimOptions) (Peak, error) {
	x, err := readSimpleGo(g)
	if err != nil {
		return Peak{}, err
	}
	if !x.sequential && !opts.AssumeSequential {
		return Peak{}, fmt.Errorf("memory: the backend of graph %q may run ops in parallel, so its peak depends on "+
			"scheduling; use a backend configured with ops_sequential (engine.NewBackend does) or set "+
			"SimOptions.AssumeSequential", x.name)
	}
	r, err := simulate(x, opts.Donate)
	if err != nil {
		return Peak{}, err
	}
	return r.peak, nil
}

// MeasurePeak calls run, which must execute the compiled graph g once (typically g.Run) and leave the outputs
// of that execution alive until MeasurePeak returns, and reports the peak memory of that execution.
//
// When a pool counter is installed (builds with tools/peakmem's patched GoMLX), the figure is measured
// (MethodPoolCounter): Bytes is the counter's peak during run, Resident is what the pool still holds after run
// apart from g's outputs (the parameters, including those g.Run transferred to the backend, and any other
// buffers alive in the process), and both include g's constants, which simplego keeps outside its pool. With
// only g's buffers alive this is the same accounting as SimulatePeak, and Transient is comparable in any case
// (tools/peakmem's tests find the two equal to the byte). The counter is process-wide: executions running at the
// same time on any simplego backend are counted too.
// Without a counter, it calls run and returns SimulatePeak(g, SimOptions{}) (MethodSimulation; inputs are
// taken as not donated, which is what g.Run does with *tensors.Tensor inputs). A graph compiled for XLA gets
// XLAProgramPeak (builds with the xla tag only).
//
// A panic inside run is returned as an error.
func MeasurePeak(g *graph.Graph, run func() error) (Peak, error) {
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
	x, err := readSimpleGo(g)
	if errors.Is(err, ErrNotSimpleGo) {
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
		r, err := simulate(x, nil)
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

// shapeBytes is the size of the Go slice simplego allocates for a buffer of this shape (its pool key is the
// dtype and the number of elements).
func shapeBytes(s shapes.Shape) int64 {
	return int64(s.Size()) * int64(s.DType.Size())
}

// ---------------------------------------------------------------------------------------------------------------
// The simulation proper: a replay of simplego's Executable.Execute + executeSequentially + executeNode
// (backends/simplego/exec.go) over sgExec, with the per-op buffer behaviour of the executors in exec_*.go,
// dotgeneral*.go and convgeneral.go.
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
	x       *sgExec
	live    int64 // pool bytes held by the execution, above the resident bytes
	peak    int64
	curNode int
	atNode  int

	// timeline, when not nil, receives one point per executed node.
	timeline *[]TimelinePoint
	opMax    int64 // the most held while the current op ran

	// Per executor node, as in simplego's executionBuffers: whether results[i] is set, owned[i], numUsed[i], and
	// the bytes of the buffer in results[i].
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
	x, err := readSimpleGo(g)
	if err != nil {
		return Peak{}, nil, err
	}
	if !x.sequential && !opts.AssumeSequential {
		return Peak{}, nil, fmt.Errorf("memory: the backend of graph %q may run ops in parallel; use ops_sequential", x.name)
	}
	var tl []TimelinePoint
	r, err := simulateWith(x, opts.Donate, &tl)
	if err != nil {
		return Peak{}, nil, err
	}
	return r.peak, tl, nil
}

// simulate replays one execution; donate is nil or has one entry per parameter.
func simulate(x *sgExec, donate []bool) (simResult, error) { return simulateWith(x, donate, nil) }

func simulateWith(x *sgExec, donate []bool, timeline *[]TimelinePoint) (simResult, error) {
	if donate != nil && len(donate) != len(x.inputs) {
		return simResult{}, fmt.Errorf("memory: SimOptions.Donate has %d entries, graph %q has %d parameters",
			len(donate), x.name, len(x.inputs))
	}
	n := x.numNodesToProcess
	s := &simulator{x: x, curNode: -1, atNode: -1, timeline: timeline,
		has: make([]bool, n), owned: make([]bool, n), numUsed: make([]int, n), bytes: make([]int64, n)}
	resident := x.constantBytes()

	// Parameters are pre-filled with the caller's buffers; donated ones are owned by the execution.
	for i, idx := range x.inputs {
		b := shapeBytes(x.nodes[idx].shape)
		d := donate != nil && donate[i]
		if idx >= n {
			// Not reachable from any output (simplego itself indexes past its results here; never seen in
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

	// executeSequentially.
	for idx := 0; idx < n; idx++ {
		if s.has[idx] || x.numUses[idx] == 0 {
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

	// Execute's epilogue: outputs not owned by the execution are cloned, then every other owned buffer is freed.
	var outBytes int64
	for _, idx := range x.outputs {
		if !s.has[idx] {
			return simResult{}, fmt.Errorf("memory: simulation of graph %q: output node #%d was not computed", x.name, idx)
		}
		b := s.bytes[idx]
		if !s.owned[idx] {
			b = shapeBytes(x.nodes[idx].shape)
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

// executeNode mirrors simplego's Executable.executeNode.
func (s *simulator) executeNode(node *sgNode) error {
	x := s.x
	idx := node.idx
	if node.op == backends.OpTypeConstant {
		s.has[idx], s.owned[idx] = true, false
		s.bytes[idx] = shapeBytes(node.shape)
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
				s.free(b) // Not part of the computation: returned to the pool at once.
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

	// Mark inputs used; free the owned ones at their last use (a reused one moved to the output).
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

// Op families, by what their executor does with its buffers.
var (
	// unaryOperandAndOutput (exec_unary.go): reuse the owned operand, else a new buffer of the operand's size.
	simUnaryReuse = opSet(backends.OpTypeNeg, backends.OpTypeAbs, backends.OpTypeSign, backends.OpTypeLogicalNot,
		backends.OpTypeBitwiseNot, backends.OpTypeBitCount, backends.OpTypeClz, backends.OpTypeExp,
		backends.OpTypeExpm1, backends.OpTypeLog, backends.OpTypeLog1p, backends.OpTypeCeil, backends.OpTypeFloor,
		backends.OpTypeRound, backends.OpTypeRsqrt, backends.OpTypeSqrt, backends.OpTypeCos, backends.OpTypeSin,
		backends.OpTypeTanh, backends.OpTypeLogistic, backends.OpTypeErf)
	// binaryOperandsAndOutput (exec_binary.go): reuse the owned rhs, else the owned lhs, when its shape equals
	// the output's; else a new buffer.
	simBinaryReuse = opSet(backends.OpTypeAdd, backends.OpTypeMul, backends.OpTypeSub, backends.OpTypeDiv,
		backends.OpTypeRem, backends.OpTypePow, backends.OpTypeMax, backends.OpTypeMin, backends.OpTypeBitwiseAnd,
		backends.OpTypeBitwiseOr, backends.OpTypeBitwiseXor, backends.OpTypeLogicalAnd, backends.OpTypeLogicalOr,
		backends.OpTypeLogicalXor)
	// Identity and Reshape: reuse the owned operand, else copy it.
	simIdentityLike = opSet(backends.OpTypeIdentity, backends.OpTypeReshape)
	// execReduce: with no axes it is execIdentity, else a new output.
	simReduce = opSet(backends.OpTypeReduceMax, backends.OpTypeReduceMin, backends.OpTypeReduceSum,
		backends.OpTypeReduceProduct, backends.OpTypeReduceBitwiseAnd, backends.OpTypeReduceBitwiseOr,
		backends.OpTypeReduceBitwiseXor, backends.OpTypeReduceLogicalAnd, backends.OpTypeReduceLogicalOr,
		backends.OpTypeReduceLogicalXor)
	// execScatter: reuse the owned operand, else clone it.
	simScatter = opSet(backends.OpTypeScatterMax, backends.OpTypeScatterMin, backends.OpTypeScatterSum)
	// Always a new output buffer of the node's shape and nothing else from the pool.
	simNewOutput = opSet(backends.OpTypeIsFinite, backends.OpTypeEqual, backends.OpTypeNotEqual,
		backends.OpTypeGreaterOrEqual, backends.OpTypeGreaterThan, backends.OpTypeLessOrEqual,
		backends.OpTypeLessThan, backends.OpTypeTranspose, backends.OpTypeBroadcast, backends.OpTypeBroadcastInDim,
		backends.OpTypeIota, backends.OpTypeGather, backends.OpTypeConcatenate, backends.OpTypeConvertDType,
		backends.OpTypeSlice, backends.OpTypeReduceWindow, backends.OpTypeConvGeneral)
	// simBuilderOnly are ops the simplego Builder accepts but rewrites into other executor nodes (Dot into
	// DotGeneral + Reshape, IsNaN into NotEqual), so they never reach the executor.
	simBuilderOnly = opSet(backends.OpTypeDot, backends.OpTypeIsNaN)
)

func opSet(ops ...backends.OpType) map[backends.OpType]bool {
	m := make(map[backends.OpType]bool, len(ops))
	for _, op := range ops {
		m[op] = true
	}
	return m
}

// simModelled reports whether the simulation models the executor of op.
func simModelled(op backends.OpType) bool {
	switch op {
	case backends.OpTypeParameter, backends.OpTypeConstant, backends.OpTypeWhere, backends.OpTypeArgMinMax,
		backends.OpTypeDotGeneral, backends.OpTypeRNGBitGenerator:
		return true
	}
	return simUnaryReuse[op] || simBinaryReuse[op] || simIdentityLike[op] || simReduce[op] || simScatter[op] ||
		simNewOutput[op]
}

// singleOutputOp models one single-output executor: it allocates and frees the op's buffers (output and
// scratch) and returns the bytes of the new output buffer, or the index of the input whose buffer became the
// output (then the bytes are that buffer's).
func (s *simulator) singleOutputOp(node *sgNode, owned []bool) (outBytes int64, reuse int, err error) {
	in := func(i int) shapes.Shape { return s.x.nodes[node.inputs[i]].shape }
	newOut := func(b int64) (int64, int, error) {
		s.alloc(b)
		return b, -1, nil
	}
	op := node.op
	switch {
	case simUnaryReuse[op]:
		if owned[0] {
			return 0, 0, nil
		}
		return newOut(shapeBytes(in(0)))

	case simBinaryReuse[op]:
		switch {
		case owned[1] && in(1).Equal(node.shape):
			return 0, 1, nil
		case owned[0] && in(0).Equal(node.shape):
			return 0, 0, nil
		}
		return newOut(shapeBytes(node.shape))

	case simIdentityLike[op], simReduce[op] && node.hasReduceAxes && len(node.reduceAxes) == 0:
		if owned[0] {
			return 0, 0, nil
		}
		return newOut(shapeBytes(in(0)))

	case simReduce[op]:
		if !node.hasReduceAxes {
			return 0, 0, fmt.Errorf("%w: %s node #%d carries no reduce axes", ErrInternals, op, node.idx)
		}
		return newOut(shapeBytes(node.shape))

	case simScatter[op]:
		if owned[0] {
			return 0, 0, nil
		}
		return newOut(shapeBytes(in(0)))

	case op == backends.OpTypeWhere:
		switch {
		case in(1).Equal(node.shape) && owned[1]:
			return 0, 1, nil
		case in(2).Equal(node.shape) && owned[2]:
			return 0, 2, nil
		}
		return newOut(shapeBytes(node.shape))

	case op == backends.OpTypeArgMinMax:
		if node.argAxis < 0 {
			return 0, 0, fmt.Errorf("%w: ArgMinMax node #%d carries no axis", ErrInternals, node.idx)
		}
		b := shapeBytes(node.shape)
		s.alloc(b)
		// Running best values and their indices, one per suffix position, freed before the op returns.
		operand := in(0)
		suffix := int64(1)
		for _, d := range operand.Dimensions[node.argAxis+1:] {
			suffix *= int64(d)
		}
		scratch := suffix*int64(operand.DType.Size()) + suffix*int64(dtypes.Int32.Size())
		s.alloc(scratch)
		s.free(scratch)
		return b, -1, nil

	case op == backends.OpTypeDotGeneral:
		return s.dotGeneral(node, in(0), in(1))

	case simNewOutput[op]:
		return newOut(shapeBytes(node.shape))
	}
	return 0, 0, fmt.Errorf("%w: the simulation does not model the executor of %s (node #%d)", ErrInternals, op, node.idx)
}

// Values of simplego's dotGeneralProblemSizeType (dotgeneral.go).
const (
	dgUnknownProblem = 0
	dgSmallProblem   = 1
	dgLargeProblem   = 2
	dgCheckProblem   = 3
)

// dotGeneral models execDotGeneral (dotgeneral.go) and its two paths.
func (s *simulator) dotGeneral(node *sgNode, lhs, rhs shapes.Shape) (int64, int, error) {
	d := node.dot
	if d == nil {
		return 0, 0, fmt.Errorf("%w: DotGeneral node #%d carries no dotGeneralNodeData", ErrInternals, node.idx)
	}
	out := shapeBytes(node.shape)
	s.alloc(out) // getBufferForShape(outputShape)
	dtype := lhs.DType
	blockDim := 1 << simplego.DotGeneralTargetBlockLog2Dim[dtype]
	problem := dgSmallProblem
	if d.lhsCrossSize*d.rhsCrossSize > 16*blockDim*blockDim {
		problem = dgLargeProblem
	}
	if s.x.forceDot != dgUnknownProblem {
		problem = s.x.forceDot
	}
	switch problem {
	case dgSmallProblem:
		s.dotSmall(d, lhs, rhs)
	case dgLargeProblem:
		s.dotLarge(d)
	case dgCheckProblem:
		s.alloc(out) // output2 for the small path, compared with the large path's output, then put back.
		s.dotSmall(d, lhs, rhs)
		s.dotLarge(d)
		s.free(out)
	default:
		return 0, 0, fmt.Errorf("%w: unknown DotGeneral problem size %d", ErrInternals, problem)
	}
	return out, -1, nil
}

// dotSmall models execDotGeneralSmall (dotgeneral_small.go): each operand whose axes are not already in
// [batch, cross, contracting] order is transposed into a new pool buffer by dgNormalizeShape, and bfloat16
// accumulates into a float32 buffer. GoMLX v0.26.0 puts the float32 buffer back but never the transposed
// copies: they are left to the garbage collector when the op returns, so they count as freed then (the
// patched counter in tools/peakmem does the same).
func (s *simulator) dotSmall(d *sgDot, lhs, rhs shapes.Shape) {
	var dropped int64
	if dgNeedsTranspose(lhs.Rank(), d.lhsContractingAxes, d.lhsBatchAxes) {
		b := int64(d.batchSize) * int64(d.lhsCrossSize) * int64(d.contractingSize) * int64(lhs.DType.Size())
		s.alloc(b)
		dropped += b
	}
	if dgNeedsTranspose(rhs.Rank(), d.rhsContractingAxes, d.rhsBatchAxes) {
		b := int64(d.batchSize) * int64(d.rhsCrossSize) * int64(d.contractingSize) * int64(rhs.DType.Size())
		s.alloc(b)
		dropped += b
	}
	if lhs.DType == dtypes.BFloat16 || lhs.DType == dtypes.Float16 {
		b := int64(d.batchSize) * int64(d.lhsCrossSize) * int64(d.rhsCrossSize) * int64(dtypes.Float32.Size())
		s.alloc(b)
		s.free(b)
	}
	s.free(dropped)
}

// dotLarge models execDotGeneralLarge (dotgeneral_large.go): blocked copies of both operands and a blocked
// output (float32 for bfloat16), all put back before the op returns.
func (s *simulator) dotLarge(d *sgDot) {
	l, r, o := shapeBytes(d.lhsBlockedShape), shapeBytes(d.rhsBlockedShape), shapeBytes(d.outputBlockedShape)
	s.alloc(l)
	s.alloc(r)
	s.alloc(o)
	s.free(l)
	s.free(r)
	s.free(o)
}

// dgNeedsTranspose is dgNormalizeShape's decision (dotgeneral_small.go) whether an operand must be copied into
// [batch, cross, contracting] order.
func dgNeedsTranspose(rank int, contractingAxes, batchAxes []int) bool {
	needs := false
	types := make([]int, rank) // 0: cross, 1: contracting, 2: batch
	cur := -1
	for _, a := range contractingAxes {
		types[a] = 1
		if a < cur {
			needs = true
		}
		cur = a
	}
	cur = -1
	for _, a := range batchAxes {
		types[a] = 2
		if a < cur {
			needs = true
		}
		cur = a
	}
	if needs {
		return true
	}
	currentType := 2
	for _, t := range types {
		if t == currentType {
			continue
		}
		if t == 2 || currentType == 1 {
			return true
		}
		currentType = t
	}
	return false
}

// multiOutputOp models the multi-output executors (only RNGBitGenerator in v0.26.0): it returns the bytes of
// each output buffer and which inputs were taken over.
func (s *simulator) multiOutputOp(node *sgNode, owned []bool) ([]int64, []bool, error) {
	if node.op != backends.OpTypeRNGBitGenerator || len(node.multiShapes) != 2 || len(node.multiNodes) != 2 {
		return nil, nil, fmt.Errorf("%w: the simulation does not model multi-output %s (node #%d)",
			ErrInternals, node.op, node.idx)
	}
	reused := make([]bool, len(node.inputs))
	data := shapeBytes(node.multiShapes[1])
	s.alloc(data)
	state := s.bytes[node.inputs[0]]
	if owned[0] {
		reused[0] = true
	} else {
		state = shapeBytes(node.multiShapes[0])
		s.alloc(state)
	}
	return []int64{state, data}, reused, nil
}

// ---------------------------------------------------------------------------------------------------------------
// GoMLX internals. Everything this package reads from GoMLX's unexported state is read below, by field name,
// through reflect + unsafe, and copied into sgExec; nothing else in memfit touches unexported GoMLX state. The
// field names, types and enum values are those of GoMLX v0.26.0:
//
//	graph.Graph.executable backends.Executable                  (pkg/core/graph/graph.go)
//	simplego.Executable{backend *Backend; builder *Builder; numNodesToProcess int; numUses []int}   (exec.go)
//	simplego.Builder{name string; nodes, inputs, outputs []*Node}                                  (builder.go)
//	simplego.Node{builderIdx int; inputs []*Node; opType backends.OpType; shape shapes.Shape;
//	              multiOutputsShapes []shapes.Shape; multiOutputsNodes []*Node; data any}
//	simplego.Backend{dotGeneralForceProblemSize, opsExecutionType}                                 (simplego.go)
//	Node.data: *dotGeneralNodeData (DotGeneral), []int (Reduce*), *argMinMaxNode{axis int} (ArgMinMax)
//
// Any mismatch is an ErrInternals error naming the field; TestSimplegoInternals fails loudly on it.
// ---------------------------------------------------------------------------------------------------------------

// sgExec is memfit's copy of what simplego's executor knows about a compiled graph.
type sgExec struct {
	name              string
	nodes             []sgNode // all builder nodes, indexed by builderIdx
	inputs            []int    // builderIdx of each parameter, in parameter order
	outputs           []int    // builderIdx of each output, in output order
	numNodesToProcess int
	numUses           []int // len numNodesToProcess
	forceDot          int   // Backend.dotGeneralForceProblemSize
	sequential        bool  // Backend.opsExecutionType == opsExecutionSequential
}

// sgNode is one simplego executor node.
type sgNode struct {
	idx           int
	op            backends.OpType
	shape         shapes.Shape
	inputs        []int
	multiShapes   []shapes.Shape
	multiNodes    []int
	dot           *sgDot
	reduceAxes    []int
	hasReduceAxes bool
	argAxis       int // -1 unless ArgMinMax
}

// sgDot is simplego's dotGeneralNodeData.
type sgDot struct {
	lhsContractingAxes, lhsBatchAxes                       []int
	rhsContractingAxes, rhsBatchAxes                       []int
	batchSize, lhsCrossSize, rhsCrossSize, contractingSize int
	lhsBlockedShape, rhsBlockedShape, outputBlockedShape   shapes.Shape
}

// constantBytes is the bytes of all the constants the compiled graph holds (simplego keeps them outside its
// buffer pool, as Go slices referenced by the nodes).
func (x *sgExec) constantBytes() int64 {
	var b int64
	for i := range x.nodes {
		if x.nodes[i].op == backends.OpTypeConstant {
			b += shapeBytes(x.nodes[i].shape)
		}
	}
	return b
}

// outputBytes is the bytes of the graph's outputs.
func (x *sgExec) outputBytes() int64 {
	var b int64
	for _, idx := range x.outputs {
		b += shapeBytes(x.nodes[idx].shape)
	}
	return b
}

// Values of simplego's opsExecutionType (exec.go).
const sgOpsExecutionSequential = 2

// compiledExecutable returns g's compiled backends.Executable (graph.Graph.executable).
func compiledExecutable(g *graph.Graph) (exe backends.Executable, err error) {
	if g == nil {
		return nil, fmt.Errorf("%w: nil graph", ErrNotCompiled)
	}
	defer func() {
		if r := recover(); r != nil {
			exe, err = nil, fmt.Errorf("%w: reading graph.Graph.executable: %v", ErrInternals, r)
		}
	}()
	f, err := privateField(reflect.ValueOf(g).Elem(), "executable", reflect.TypeFor[backends.Executable]())
	if err != nil {
		return nil, err
	}
	exe, _ = f.Interface().(backends.Executable)
	if exe == nil {
		return nil, fmt.Errorf("%w (graph %q)", ErrNotCompiled, g.Name())
	}
	return exe, nil
}

// readSimpleGo copies what simplego's executor knows about the compiled graph g into an sgExec.
func readSimpleGo(g *graph.Graph) (x *sgExec, err error) {
	exe, err := compiledExecutable(g)
	if err != nil {
		return nil, err
	}
	se, ok := exe.(*simplego.Executable)
	if !ok {
		return nil, fmt.Errorf("%w: graph %q is compiled as %T", ErrNotSimpleGo, g.Name(), exe)
	}
	defer func() {
		if r := recover(); r != nil {
			x, err = nil, fmt.Errorf("%w: %v", ErrInternals, r)
		}
	}()
	return readSimpleGoExecutable(se)
}

func readSimpleGoExecutable(se *simplego.Executable) (*sgExec, error) {
	var (
		tBuilder = reflect.TypeFor[*simplego.Builder]()
		tBackend = reflect.TypeFor[*simplego.Backend]()
		tNodes   = reflect.TypeFor[[]*simplego.Node]()
		tInt     = reflect.TypeFor[int]()
		tInts    = reflect.TypeFor[[]int]()
	)
	ev := reflect.ValueOf(se).Elem()
	builder, err := privateField(ev, "builder", tBuilder)
	if err != nil {
		return nil, err
	}
	if builder.IsNil() {
		return nil, fmt.Errorf("%w: the simplego executable was finalized", ErrNotCompiled)
	}
	nnp, err := privateField(ev, "numNodesToProcess", tInt)
	if err != nil {
		return nil, err
	}
	numUses, err := privateField(ev, "numUses", tInts)
	if err != nil {
		return nil, err
	}
	x := &sgExec{numNodesToProcess: int(nnp.Int()), numUses: numUses.Interface().([]int)}
	if len(x.numUses) != x.numNodesToProcess {
		return nil, fmt.Errorf("%w: len(numUses)=%d != numNodesToProcess=%d", ErrInternals, len(x.numUses), x.numNodesToProcess)
	}

	backend, err := privateField(ev, "backend", tBackend)
	if err != nil {
		return nil, err
	}
	if backend.IsNil() {
		return nil, fmt.Errorf("%w: the simplego executable has no backend", ErrInternals)
	}
	bv := backend.Elem()
	force, err := privateIntField(bv, "dotGeneralForceProblemSize", "dotGeneralProblemSizeType")
	if err != nil {
		return nil, err
	}
	execType, err := privateIntField(bv, "opsExecutionType", "opsExecutionType")
	if err != nil {
		return nil, err
	}
	x.forceDot, x.sequential = int(force), execType == sgOpsExecutionSequential

	bldv := builder.Elem()
	name, err := privateField(bldv, "name", reflect.TypeFor[string]())
	if err != nil {
		return nil, err
	}
	x.name = name.String()
	lists := make(map[string][]*simplego.Node, 3)
	for _, f := range []string{"nodes", "inputs", "outputs"} {
		v, err := privateField(bldv, f, tNodes)
		if err != nil {
			return nil, err
		}
		lists[f] = v.Interface().([]*simplego.Node)
	}
	if len(lists["nodes"]) < x.numNodesToProcess {
		return nil, fmt.Errorf("%w: %d builder nodes < numNodesToProcess=%d", ErrInternals, len(lists["nodes"]), x.numNodesToProcess)
	}
	x.nodes = make([]sgNode, len(lists["nodes"]))
	for i, n := range lists["nodes"] {
		sn, err := readNode(n)
		if err != nil {
			return nil, err
		}
		if sn.idx != i {
			return nil, fmt.Errorf("%w: builder node %d has builderIdx %d", ErrInternals, i, sn.idx)
		}
		x.nodes[i] = sn
	}
	for _, f := range []string{"inputs", "outputs"} {
		idxs := make([]int, len(lists[f]))
		for i, n := range lists[f] {
			v, err := privateField(reflect.ValueOf(n).Elem(), "builderIdx", tInt)
			if err != nil {
				return nil, err
			}
			idxs[i] = int(v.Int())
			if idxs[i] < 0 || idxs[i] >= len(x.nodes) {
				return nil, fmt.Errorf("%w: %s #%d has builderIdx %d out of range", ErrInternals, f, i, idxs[i])
			}
		}
		if f == "inputs" {
			x.inputs = idxs
		} else {
			x.outputs = idxs
		}
	}
	for _, idx := range x.inputs {
		if x.nodes[idx].op != backends.OpTypeParameter {
			return nil, fmt.Errorf("%w: input node #%d is a %s", ErrInternals, idx, x.nodes[idx].op)
		}
	}
	for _, idx := range x.outputs {
		if idx >= x.numNodesToProcess {
			return nil, fmt.Errorf("%w: output node #%d >= numNodesToProcess=%d", ErrInternals, idx, x.numNodesToProcess)
		}
	}
	return x, nil
}

// readNode copies one simplego.Node.
func readNode(n *simplego.Node) (sgNode, error) {
	if n == nil {
		return sgNode{}, fmt.Errorf("%w: nil node", ErrInternals)
	}
	v := reflect.ValueOf(n).Elem()
	var sn sgNode
	sn.argAxis = -1
	idx, err := privateField(v, "builderIdx", reflect.TypeFor[int]())
	if err != nil {
		return sn, err
	}
	sn.idx = int(idx.Int())
	op, err := privateField(v, "opType", reflect.TypeFor[backends.OpType]())
	if err != nil {
		return sn, err
	}
	sn.op = op.Interface().(backends.OpType)
	shape, err := privateField(v, "shape", reflect.TypeFor[shapes.Shape]())
	if err != nil {
		return sn, err
	}
	sn.shape = shape.Interface().(shapes.Shape)
	nodeIdxs := func(field string) ([]int, error) {
		f, err := privateField(v, field, reflect.TypeFor[[]*simplego.Node]())
		if err != nil {
			return nil, err
		}
		ns := f.Interface().([]*simplego.Node)
		if ns == nil {
			return nil, nil
		}
		out := make([]int, len(ns))
		for i, in := range ns {
			iv, err := privateField(reflect.ValueOf(in).Elem(), "builderIdx", reflect.TypeFor[int]())
			if err != nil {
				return nil, err
			}
			out[i] = int(iv.Int())
		}
		return out, nil
	}
	if sn.inputs, err = nodeIdxs("inputs"); err != nil {
		return sn, err
	}
	for _, in := range sn.inputs {
		if in >= sn.idx {
			return sn, fmt.Errorf("%w: node #%d has input #%d created after it", ErrInternals, sn.idx, in)
		}
	}
	if sn.multiNodes, err = nodeIdxs("multiOutputsNodes"); err != nil {
		return sn, err
	}
	ms, err := privateField(v, "multiOutputsShapes", reflect.TypeFor[[]shapes.Shape]())
	if err != nil {
		return sn, err
	}
	sn.multiShapes = ms.Interface().([]shapes.Shape)
	if len(sn.multiShapes) != len(sn.multiNodes) {
		return sn, fmt.Errorf("%w: node #%d has %d multi-output shapes and %d multi-output nodes",
			ErrInternals, sn.idx, len(sn.multiShapes), len(sn.multiNodes))
	}
	dataField, err := privateField(v, "data", reflect.TypeFor[any]())
	if err != nil {
		return sn, err
	}
	data := dataField.Interface()
	switch {
	case sn.op == backends.OpTypeDotGeneral:
		sn.dot, err = readDotData(data)
		if err != nil {
			return sn, fmt.Errorf("DotGeneral node #%d: %w", sn.idx, err)
		}
	case simReduce[sn.op]:
		axes, ok := data.([]int)
		if !ok {
			return sn, fmt.Errorf("%w: %s node #%d data is %T, want []int", ErrInternals, sn.op, sn.idx, data)
		}
		sn.reduceAxes, sn.hasReduceAxes = axes, true
	case sn.op == backends.OpTypeArgMinMax:
		dv := reflect.ValueOf(data)
		if dv.Kind() != reflect.Pointer || dv.IsNil() || dv.Elem().Kind() != reflect.Struct {
			return sn, fmt.Errorf("%w: ArgMinMax node #%d data is %T", ErrInternals, sn.idx, data)
		}
		axis, err := privateField(dv.Elem(), "axis", reflect.TypeFor[int]())
		if err != nil {
			return sn, err
		}
		sn.argAxis = int(axis.Int())
	case sn.op == backends.OpTypeConstant:
		if _, ok := data.(*simplego.Buffer); !ok {
			return sn, fmt.Errorf("%w: Constant node #%d data is %T, want *simplego.Buffer", ErrInternals, sn.idx, data)
		}
	}
	return sn, nil
}

// readDotData copies a *dotGeneralNodeData.
func readDotData(data any) (*sgDot, error) {
	dv := reflect.ValueOf(data)
	if dv.Kind() != reflect.Pointer || dv.IsNil() || dv.Elem().Kind() != reflect.Struct {
		return nil, fmt.Errorf("%w: data is %T", ErrInternals, data)
	}
	v := dv.Elem()
	d := &sgDot{}
	ints := []struct {
		name string
		dst  *[]int
	}{{"lhsContractingAxes", &d.lhsContractingAxes}, {"lhsBatchAxes", &d.lhsBatchAxes},
		{"rhsContractingAxes", &d.rhsContractingAxes}, {"rhsBatchAxes", &d.rhsBatchAxes}}
	for _, f := range ints {
		fv, err := privateField(v, f.name, reflect.TypeFor[[]int]())
		if err != nil {
			return nil, err
		}
		*f.dst = fv.Interface().([]int)
	}
	sizes := []struct {
		name string
		dst  *int
	}{{"batchSize", &d.batchSize}, {"lhsCrossSize", &d.lhsCrossSize}, {"rhsCrossSize", &d.rhsCrossSize},
		{"contractingSize", &d.contractingSize}}
	for _, f := range sizes {
		fv, err := privateField(v, f.name, reflect.TypeFor[int]())
		if err != nil {
			return nil, err
		}
		*f.dst = int(fv.Int())
	}
	blocked := []struct {
		name string
		dst  *shapes.Shape
	}{{"lhsBlockedShape", &d.lhsBlockedShape}, {"rhsBlockedShape", &d.rhsBlockedShape},
		{"outputBlockedShape", &d.outputBlockedShape}}
	for _, f := range blocked {
		fv, err := privateField(v, f.name, reflect.TypeFor[shapes.Shape]())
		if err != nil {
			return nil, err
		}
		*f.dst = fv.Interface().(shapes.Shape)
	}
	return d, nil
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

// privateIntField reads an int-kinded field of the named (unexported) type.
func privateIntField(v reflect.Value, name, typeName string) (int64, error) {
	f, err := privateField(v, name, nil)
	if err != nil {
		return 0, err
	}
	if f.Kind() != reflect.Int || f.Type().Name() != typeName {
		return 0, fmt.Errorf("%w: %s.%s is %s, want int-based %s", ErrInternals, v.Type(), name, f.Type(), typeName)
	}
	return f.Int(), nil
}
