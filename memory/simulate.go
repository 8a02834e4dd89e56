package memory

import (
	"errors"
	"fmt"
	"reflect"
	"unsafe"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
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
	if node.op == compute.OpTypeConstant {
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
	simUnaryReuse = opSet(compute.OpTypeNeg, compute.OpTypeAbs, compute.OpTypeSign, compute.OpTypeLogicalNot,
		compute.OpTypeBitwiseNot, compute.OpTypeBitCount, compute.OpTypeClz, compute.OpTypeExp,
		compute.OpTypeExpm1, compute.OpTypeLog, compute.OpTypeLog1p, compute.OpTypeCeil, compute.OpTypeFloor,
		compute.OpTypeRound, compute.OpTypeRsqrt, compute.OpTypeSqrt, compute.OpTypeCos, compute.OpTypeSin,
		compute.OpTypeTanh, compute.OpTypeLogistic, compute.OpTypeErf)
	// binaryOperandsAndOutput (exec_binary.go): reuse the owned rhs, else the owned lhs, when its shape equals
	// the output's; else a new buffer.
	simBinaryReuse = opSet(compute.OpTypeAdd, compute.OpTypeMul, compute.OpTypeSub, compute.OpTypeDiv,
		compute.OpTypeRem, compute.OpTypePow, compute.OpTypeMax, compute.OpTypeMin, compute.OpTypeBitwiseAnd,
		compute.OpTypeBitwiseOr, compute.OpTypeBitwiseXor, compute.OpTypeLogicalAnd, compute.OpTypeLogicalOr,
		compute.OpTypeLogicalXor)
	// Identity and Reshape: reuse the owned operand, else copy it.
	simIdentityLike = opSet(compute.OpTypeIdentity, compute.OpTypeReshape, compute.OpTypeOptimizationBarrier,
		compute.OpTypeSchedulingBarrier)
	// execReduce: with no axes it is execIdentity, else a new output.
	simReduce = opSet(compute.OpTypeReduceMax, compute.OpTypeReduceMin, compute.OpTypeReduceSum,
		compute.OpTypeReduceProduct, compute.OpTypeReduceBitwiseAnd, compute.OpTypeReduceBitwiseOr,
		compute.OpTypeReduceBitwiseXor, compute.OpTypeReduceLogicalAnd, compute.OpTypeReduceLogicalOr,
		compute.OpTypeReduceLogicalXor)
	// execScatter: reuse the owned operand, else clone it.
	simScatter = opSet(compute.OpTypeScatterMax, compute.OpTypeScatterMin, compute.OpTypeScatterSum)
	// Always a new output buffer of the node's shape and nothing else from the pool.
	simNewOutput = opSet(compute.OpTypeIsFinite, compute.OpTypeEqual, compute.OpTypeNotEqual,
		compute.OpTypeGreaterOrEqual, compute.OpTypeGreaterThan, compute.OpTypeLessOrEqual,
		compute.OpTypeLessThan, compute.OpTypeTranspose, compute.OpTypeBroadcastInDim,
		compute.OpTypeIota, compute.OpTypeGather, compute.OpTypeConcatenate, compute.OpTypeConvertDType,
		compute.OpTypeSlice, compute.OpTypeReduceWindow, compute.OpTypeConvGeneral)
	// simBuilderOnly are ops the simplego Builder accepts but rewrites into other executor nodes (Dot into
	// DotGeneral + Reshape, IsNaN into NotEqual), so they never reach the executor.
	simBuilderOnly = opSet(compute.OpTypeDot, compute.OpTypeIsNaN)
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
	switch op {
	case compute.OpTypeParameter, compute.OpTypeConstant, compute.OpTypeWhere, compute.OpTypeArgMinMax,
		compute.OpTypeDotGeneral, compute.OpTypeRNGBitGenerator:
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

	case op == compute.OpTypeWhere:
		switch {
		case in(1).Equal(node.shape) && owned[1]:
			return 0, 1, nil
		case in(2).Equal(node.shape) && owned[2]:
			return 0, 2, nil
		}
		return newOut(shapeBytes(node.shape))

	case op == compute.OpTypeArgMinMax:
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

	case op == compute.OpTypeDotGeneral:
		return s.dotGeneral(node, in(0), in(1))

	case simNewOutput[op]:
		return newOut(shapeBytes(node.shape))
	}
	return 0, 0, fmt.Errorf("%w: the simulation does not model the executor of %s (node #%d)", ErrInternals, op, node.idx)
}

// dotGeneral models execDotGeneral (dot/dot.go): a new output buffer. The matmul kernels' packing panels are
// not modelled yet.
func (s *simulator) dotGeneral(node *sgNode, lhs, rhs shapes.Shape) (int64, int, error) {
	if node.dot == nil {
		return 0, 0, fmt.Errorf("%w: DotGeneral node #%d carries no dot.NodeData", ErrInternals, node.idx)
	}
	_, _ = lhs, rhs
	out := shapeBytes(node.shape)
	s.alloc(out)
	return out, -1, nil
}

// multiOutputOp models the multi-output executors (only RNGBitGenerator in v0.26.0): it returns the bytes of
// each output buffer and which inputs were taken over.
func (s *simulator) multiOutputOp(node *sgNode, owned []bool) ([]int64, []bool, error) {
	if node.op != compute.OpTypeRNGBitGenerator || len(node.multiShapes) != 2 || len(node.multiNodes) != 2 {
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
// GoMLX internals. Everything this package reads from the Go backend's executor is read below, by field name,
// through reflect (+ unsafe for the unexported fields), and copied into sgExec; nothing else in memfit touches
// the backend's state. The executor lives in github.com/gomlx/compute/internal/gobackend, which cannot be
// imported, so its types are recognised by package path and name. The fields are those of compute v0.1.2
// (GoMLX v0.28.2):
//
//	gobackend.Executable{backend *Backend; builder *Builder; mainFn *FunctionExecutable}          (exec.go)
//	gobackend.FunctionExecutable{Function *Function; NumNodesToProcess int; Schedule []int;
//	                             NumUses []int; OutputNodes []*Node}                              (executable.go)
//	gobackend.Function{Nodes, Parameters, Outputs []*Node}                                         (function.go)
//	gobackend.Builder{name string}                                                                 (builder.go)
//	gobackend.Node{Index int; Inputs []*Node; OpType compute.OpType; Shape shapes.Shape;
//	               MultiOutputsShapes []shapes.Shape; MultiOutputsNodes []*Node; Data any}
//	gobackend.Backend{OpsExecutionType; Workers *workerspool.Pool}                                 (gobackend.go)
//	Node.Data: *dot.NodeData (DotGeneral), []int (Reduce*), *argMinMaxNode{axis int} (ArgMinMax)
//
// Any mismatch is an ErrInternals error naming the field; TestGoBackendInternals fails loudly on it.
// ---------------------------------------------------------------------------------------------------------------

// goBackendPkg is the package path of the Go backend's executor types.
const goBackendPkg = "github.com/gomlx/compute/internal/gobackend"

// sgExec is memfit's copy of what the Go backend's executor knows about a compiled graph.
type sgExec struct {
	name              string
	nodes             []sgNode // all nodes of the main function, indexed by Node.Index
	inputs            []int    // Index of each parameter, in parameter order
	outputs           []int    // Index of each output, in output order
	numNodesToProcess int
	numUses           []int // len numNodesToProcess
	schedule          []int // the executor's order of execution (FunctionExecutable.Schedule)
	sequential        bool  // Backend.OpsExecutionType == OpsExecutionSequential
}

// sgNode is one executor node.
type sgNode struct {
	idx           int
	op            compute.OpType
	shape         shapes.Shape
	inputs        []int
	multiShapes   []shapes.Shape
	multiNodes    []int
	dot           *sgDot
	reduceAxes    []int
	hasReduceAxes bool
	argAxis       int // -1 unless ArgMinMax
}

// sgDot is the Go backend's dot.NodeData: the normalised product the executor runs.
type sgDot struct {
	lhsContractingAxes, lhsBatchAxes                       []int
	rhsContractingAxes, rhsBatchAxes                       []int
	batchSize, lhsCrossSize, rhsCrossSize, contractingSize int
}

// constantBytes is the bytes of all the constants the compiled graph holds (the Go backend keeps them outside its
// buffer pool, as buffers referenced by the nodes).
func (x *sgExec) constantBytes() int64 {
	var b int64
	for i := range x.nodes {
		if x.nodes[i].op == compute.OpTypeConstant {
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

// Values of gobackend.OpsExecutionType (executable.go).
const sgOpsExecutionSequential = 2

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

// isGoBackendType reports whether t is *gobackend.<name> of the Go backend's executor package.
func isGoBackendType(t reflect.Type, name string) bool {
	return t != nil && t.Kind() == reflect.Pointer && t.Elem().PkgPath() == goBackendPkg && t.Elem().Name() == name
}

// readSimpleGo copies what the Go backend's executor knows about the compiled graph g into an sgExec.
func readSimpleGo(g *graph.Graph) (x *sgExec, err error) {
	exe, err := compiledExecutable(g)
	if err != nil {
		return nil, err
	}
	if !isGoBackendType(reflect.TypeOf(exe), "Executable") {
		return nil, fmt.Errorf("%w: graph %q is compiled as %T", ErrNotSimpleGo, g.Name(), exe)
	}
	defer func() {
		if r := recover(); r != nil {
			x, err = nil, fmt.Errorf("%w: %v", ErrInternals, r)
		}
	}()
	return readGoExecutable(reflect.ValueOf(exe).Elem())
}

// structField returns the struct (or pointer to struct) v's field name, made readable; kind, when not
// reflect.Invalid, is checked.
func structField(v reflect.Value, name string, kind reflect.Kind) (reflect.Value, error) {
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return reflect.Value{}, fmt.Errorf("%w: nil %s reading field %q", ErrInternals, v.Type(), name)
		}
		v = v.Elem()
	}
	f, err := privateField(v, name, nil)
	if err != nil {
		return f, err
	}
	if kind != reflect.Invalid && f.Kind() != kind {
		return reflect.Value{}, fmt.Errorf("%w: %s.%s is %s, want a %s", ErrInternals, v.Type(), name, f.Type(), kind)
	}
	return f, nil
}

// nodeIndexes reads a []*gobackend.Node field as the nodes' Index values.
func nodeIndexes(v reflect.Value, name string) ([]int, error) {
	f, err := structField(v, name, reflect.Slice)
	if err != nil {
		return nil, err
	}
	if f.IsNil() {
		return nil, nil
	}
	if !isGoBackendType(f.Type().Elem(), "Node") {
		return nil, fmt.Errorf("%w: %s.%s is %s, want []*gobackend.Node", ErrInternals, v.Type(), name, f.Type())
	}
	out := make([]int, f.Len())
	for i := range out {
		idx, err := structField(f.Index(i), "Index", reflect.Int)
		if err != nil {
			return nil, err
		}
		out[i] = int(idx.Int())
	}
	return out, nil
}

func readGoExecutable(ev reflect.Value) (*sgExec, error) {
	builder, err := structField(ev, "builder", reflect.Pointer)
	if err != nil {
		return nil, err
	}
	if builder.IsNil() {
		return nil, fmt.Errorf("%w: the Go backend executable was finalized", ErrNotCompiled)
	}
	fe, err := structField(ev, "mainFn", reflect.Pointer)
	if err != nil {
		return nil, err
	}
	if !isGoBackendType(fe.Type(), "FunctionExecutable") || fe.IsNil() {
		return nil, fmt.Errorf("%w: Executable.mainFn is %s", ErrInternals, fe.Type())
	}
	nnp, err := structField(fe, "NumNodesToProcess", reflect.Int)
	if err != nil {
		return nil, err
	}
	numUses, err := privateField(fe.Elem(), "NumUses", reflect.TypeFor[[]int]())
	if err != nil {
		return nil, err
	}
	schedule, err := privateField(fe.Elem(), "Schedule", reflect.TypeFor[[]int]())
	if err != nil {
		return nil, err
	}
	x := &sgExec{numNodesToProcess: int(nnp.Int()), numUses: numUses.Interface().([]int),
		schedule: schedule.Interface().([]int)}
	if len(x.numUses) != x.numNodesToProcess {
		return nil, fmt.Errorf("%w: len(NumUses)=%d != NumNodesToProcess=%d", ErrInternals, len(x.numUses), x.numNodesToProcess)
	}

	backend, err := structField(ev, "backend", reflect.Pointer)
	if err != nil {
		return nil, err
	}
	execType, err := structField(backend, "OpsExecutionType", reflect.Int)
	if err != nil {
		return nil, err
	}
	if execType.Type().Name() != "OpsExecutionType" {
		return nil, fmt.Errorf("%w: Backend.OpsExecutionType is %s", ErrInternals, execType.Type())
	}
	x.sequential = execType.Int() == sgOpsExecutionSequential

	name, err := structField(builder, "name", reflect.String)
	if err != nil {
		return nil, err
	}
	x.name = name.String()
	fn, err := structField(fe, "Function", reflect.Pointer)
	if err != nil {
		return nil, err
	}
	nodes, err := structField(fn, "Nodes", reflect.Slice)
	if err != nil {
		return nil, err
	}
	if nodes.Len() < x.numNodesToProcess {
		return nil, fmt.Errorf("%w: %d nodes < NumNodesToProcess=%d", ErrInternals, nodes.Len(), x.numNodesToProcess)
	}
	x.nodes = make([]sgNode, nodes.Len())
	for i := range x.nodes {
		sn, err := readNode(nodes.Index(i))
		if err != nil {
			return nil, err
		}
		if sn.idx != i {
			return nil, fmt.Errorf("%w: node %d has Index %d", ErrInternals, i, sn.idx)
		}
		x.nodes[i] = sn
	}
	if x.inputs, err = nodeIndexes(fn, "Parameters"); err != nil {
		return nil, err
	}
	if x.outputs, err = nodeIndexes(fe, "OutputNodes"); err != nil {
		return nil, err
	}
	for _, list := range [][]int{x.inputs, x.outputs, x.schedule} {
		for _, idx := range list {
			if idx < 0 || idx >= len(x.nodes) {
				return nil, fmt.Errorf("%w: node index %d out of range", ErrInternals, idx)
			}
		}
	}
	for _, idx := range x.inputs {
		if x.nodes[idx].op != compute.OpTypeParameter {
			return nil, fmt.Errorf("%w: input node #%d is a %s", ErrInternals, idx, x.nodes[idx].op)
		}
	}
	for _, idx := range x.outputs {
		if idx >= x.numNodesToProcess {
			return nil, fmt.Errorf("%w: output node #%d >= NumNodesToProcess=%d", ErrInternals, idx, x.numNodesToProcess)
		}
	}
	return x, nil
}

// readNode copies one *gobackend.Node.
func readNode(v reflect.Value) (sgNode, error) {
	var sn sgNode
	sn.argAxis = -1
	if !isGoBackendType(v.Type(), "Node") || v.IsNil() {
		return sn, fmt.Errorf("%w: node is %s", ErrInternals, v.Type())
	}
	idx, err := structField(v, "Index", reflect.Int)
	if err != nil {
		return sn, err
	}
	sn.idx = int(idx.Int())
	op, err := privateField(v.Elem(), "OpType", reflect.TypeFor[compute.OpType]())
	if err != nil {
		return sn, err
	}
	sn.op = op.Interface().(compute.OpType)
	shape, err := privateField(v.Elem(), "Shape", reflect.TypeFor[shapes.Shape]())
	if err != nil {
		return sn, err
	}
	sn.shape = shape.Interface().(shapes.Shape)
	if sn.inputs, err = nodeIndexes(v, "Inputs"); err != nil {
		return sn, err
	}
	for _, in := range sn.inputs {
		if in >= sn.idx {
			return sn, fmt.Errorf("%w: node #%d has input #%d after it", ErrInternals, sn.idx, in)
		}
	}
	if sn.multiNodes, err = nodeIndexes(v, "MultiOutputsNodes"); err != nil {
		return sn, err
	}
	ms, err := privateField(v.Elem(), "MultiOutputsShapes", reflect.TypeFor[[]shapes.Shape]())
	if err != nil {
		return sn, err
	}
	sn.multiShapes = ms.Interface().([]shapes.Shape)
	if len(sn.multiShapes) != len(sn.multiNodes) {
		return sn, fmt.Errorf("%w: node #%d has %d multi-output shapes and %d multi-output nodes",
			ErrInternals, sn.idx, len(sn.multiShapes), len(sn.multiNodes))
	}
	dataField, err := privateField(v.Elem(), "Data", reflect.TypeFor[any]())
	if err != nil {
		return sn, err
	}
	data := dataField.Interface()
	switch {
	case sn.op == compute.OpTypeDotGeneral:
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
	case sn.op == compute.OpTypeArgMinMax:
		dv := reflect.ValueOf(data)
		if dv.Kind() != reflect.Pointer || dv.IsNil() || dv.Elem().Kind() != reflect.Struct {
			return sn, fmt.Errorf("%w: ArgMinMax node #%d data is %T", ErrInternals, sn.idx, data)
		}
		d := reflect.New(dv.Elem().Type()).Elem()
		d.Set(dv.Elem())
		axis, err := privateField(d, "axis", reflect.TypeFor[int]())
		if err != nil {
			return sn, err
		}
		sn.argAxis = int(axis.Int())
	case sn.op == compute.OpTypeConstant:
		if !isGoBackendType(reflect.TypeOf(data), "Buffer") {
			return sn, fmt.Errorf("%w: Constant node #%d data is %T, want *gobackend.Buffer", ErrInternals, sn.idx, data)
		}
	}
	return sn, nil
}

// readDotData copies a *dot.NodeData.
func readDotData(data any) (*sgDot, error) {
	dv := reflect.ValueOf(data)
	if dv.Kind() != reflect.Pointer || dv.IsNil() || dv.Elem().Kind() != reflect.Struct || dv.Elem().Type().Name() != "NodeData" {
		return nil, fmt.Errorf("%w: data is %T, want *dot.NodeData", ErrInternals, data)
	}
	v := dv.Elem()
	d := &sgDot{}
	ints := []struct {
		name string
		dst  *[]int
	}{{"LHSContractingAxes", &d.lhsContractingAxes}, {"LHSBatchAxes", &d.lhsBatchAxes},
		{"RHSContractingAxes", &d.rhsContractingAxes}, {"RHSBatchAxes", &d.rhsBatchAxes}}
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
	}{{"BatchSize", &d.batchSize}, {"LHSCrossSize", &d.lhsCrossSize}, {"RHSCrossSize", &d.rhsCrossSize},
		{"ContractingSize", &d.contractingSize}}
	for _, f := range sizes {
		fv, err := privateField(v, f.name, reflect.TypeFor[int]())
		if err != nil {
			return nil, err
		}
		*f.dst = int(fv.Int())
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
