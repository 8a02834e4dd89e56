package memory

import (
	"errors"
	"fmt"

	"github.com/gomlx/compute"
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
	// ErrInternals: the Go backend's unexported executor state is not what the executor model reads (compute
	// v0.1.14, GoMLX v0.28.16: a field, a node's data or an op differs); the simulation refuses to guess.
	ErrInternals = errors.New("memory: the Go backend's executor internals differ from compute " + modelledCompute +
		" (GoMLX v0.28.16), which the executor model reads")
	// ErrComputeVersion: the binary was built against a github.com/gomlx/compute version other than the one the
	// executor model was written for; the error is a *ComputeVersionError saying "modelled for compute v0.1.14,
	// running vX". Every peak of the pure-Go backend is then unavailable.
	ErrComputeVersion = errors.New("memory: the Go backend's compute version is not the one the executor model reads")
	// ErrUnsupported: the graph holds something the simulation cannot replay without running it: ops whose
	// buffers depend on the data (If, While, Sort, the dynamic-shape ops), nested function calls (Call,
	// closures), dynamic shapes, or a backend that skips its computations (no_ops).
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
// it, and returns the peak memory of its next execution (Method MethodSimulation).
//
// The replay walks the executor's own node list (github.com/gomlx/compute/internal/gobackend of compute v0.1.14,
// GoMLX v0.28.16; a binary built against another compute version gets ErrComputeVersion), after the builder's
// rewrites (its DotGeneral normalisation, which transposes operands into a supported layout and, for
// half-precision inputs, converts the float32 product back; its de-duplication of identical nodes; its
// ImplicitBroadcastFusion pass), in the executor's own order (FunctionExecutable.Schedule:
// DependencyOrderSchedule, longest path to an output first, unless the backend was configured with
// creation_order), and models exactly what each executor does with the backend's buffer pool (executable.go:
// FunctionExecutable.Execute, executeSequentially, executeNode; the per-op rules are in gobackend_v0_1_14.go):
//
//   - parameters are pre-filled with the caller's buffers, owned only when donated (a donated parameter no
//     output needs is put back at once); constants are never owned; nodes nobody uses are skipped; an input is
//     owned by an op only at its last use;
//   - an op either reuses an owned input's buffer as its output (unary ops; binary ops, rhs first then lhs,
//     when the input's shape equals the output's; Where; Identity, Reshape and the barriers; Scatter and
//     DynamicUpdateSlice; Reverse, Bitcast and reductions that reduce nothing, in some cases; RNGBitGenerator's
//     state) or takes a new output buffer;
//   - the scratch buffers an op takes from the pool and puts back inside one call are counted while it runs:
//     the large matrix product's panels (four per worker, see below; also inside FusedDense and
//     FusedDenseVJP), ArgMinMax's running best values and indices, the float32 accumulator of the generic
//     ReduceSum/ReduceProduct on bfloat16/float16, the unpacked weights of FusedQuantizedDense, the int64
//     indices of QuantizedEmbeddingLookup;
//   - every other buffer goes back to the pool (or, for user-fed buffers, to the garbage collector) after its
//     last use; at the end, outputs not owned by the execution are cloned and the other owned buffers freed.
//
// The executor picks, per node, the first registered executor that accepts it (with GOEXPERIMENT=simd, SIMD
// executors ahead of the generic ones, subject to size thresholds for reductions) and caches its choice after
// the node's first run. The simulation makes the same choices and checks them against the cached ones. Two
// things differ between a graph's first execution and later ones, and the simulation models whichever comes
// next: a large matrix product with an operand computed from constants only packs that operand's panels into
// a pool buffer on its first run and keeps it for the graph's lifetime; and a SIMD ReduceMax, ReduceMin or
// ReduceProduct on int64/uint64 takes its output buffer, falls back, and never returns that buffer (upstream
// leaks it, on the first run only).
//
// Sizes are what the pool really allocates: every buffer's bytes rounded up by support.TwoBitBucketLen (see
// bufferBytes), the same accounting as tools/peakmem's counter.
//
// The large matrix product (dot/matmul: the portable kernels, and with GOEXPERIMENT=simd on amd64 the AVX-512 or
// AVX2 ones; used when the product's multiply-adds reach 4 Mi) runs on the calling goroutine when the backend's
// parallelism is 1, else hands its work to up to maxParallelism workers (workerspool.Pool.Saturate, 2 x
// GOMAXPROCS by default); each worker takes its panels from the pool when it starts (an LHS, an RHS and an
// output panel and an accumulator of several output panels) and returns them when the work runs out. How many
// workers hold panels at the same time depends on goroutine scheduling; the simulation counts
// SimOptions.MatmulWorkers of them, by default all the backend can start, so its peak is then an upper bound
// that is reached or overestimates by at most a few panel sets (about 1.3 MiB each for the portable float32
// kernel, 1.8 MiB for AVX-512 float32). It is exact, to the byte, when the large path runs on one worker (a
// backend configured with parallelism=1) or when no product takes it; tools/peakmem's tests check that.
//
// Peak.Bytes is the maximum, over the run, of the resident bytes plus the pool buffers the execution holds;
// Peak.Resident is the bytes held before the execution and not freed by it (the non-donated inputs, the graph's
// constants, the packed panels earlier runs left with the graph) plus those the execution takes and never
// gives back (packed panels it fills, leaked buffers). The outputs are still held when the run ends, so they
// are part of the peak.
//
// The executor's own FunctionExecutable.EstimatedTemporaryMemory is not a substitute: it adds up each node's
// output without in-place reuse, bucketing, clones or scratch buffers, and leaves out the inputs and constants
// (see ExecutorEstimate and tools/peakmem/README.md for a measured comparison).
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
// (FunctionExecutable.EstimatedTemporaryMemory, what the backend logs at verbosity 1).
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

// GraphBytes are the bytes a compiled pure-Go backend graph holds from the backend's buffer pool for its
// lifetime, outside any execution (see HeldByGraph).
type GraphBytes struct {
	// Constants is the bytes of the graph's constants, taken from the pool when the graph is built (the pool
	// counter of tools/peakmem leaves them out).
	Constants int64
	// PackedPanels is the bytes of the packed panels the graph's earlier runs filled for matrix products with
	// an operand computed from constants only (taken from the pool on the product's first run on its large
	// path, never put back; the pool counter counts them).
	PackedPanels int64
}

// HeldByGraph returns the bytes the compiled graph g (pure-Go backend) holds from the pool for its lifetime.
func HeldByGraph(g *graph.Graph) (GraphBytes, error) {
	x, err := readGoBackend(g)
	if err != nil {
		return GraphBytes{}, err
	}
	return GraphBytes{Constants: x.constantBytes(), PackedPanels: x.heldByGraph()}, nil
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
// taken as not donated, which is what g.Run does with *tensors.Tensor inputs), which, simulated after run,
// describes the executions that follow it (see SimulatePeak for how a graph's first execution can differ). A graph compiled for XLA gets
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
// executeNode (internal/gobackend/executable.go) over goExec. The per-op buffer rules (singleOutputOp,
// multiOutputOp) are in gobackend_v0_1_14.go.
// ---------------------------------------------------------------------------------------------------------------

// simResult is a simulation's outcome.
type simResult struct {
	peak Peak
	// peakNode is the executor node running when the peak was first reached (-1: before any op, or while cloning
	// outputs at the end); for diagnostics.
	peakNode int
	// endLive is what the execution still holds when Execute returns, above the resident bytes: the outputs.
	endLive int64
	// kept is the part of peak.Resident the execution takes from the pool and never returns.
	kept int64
}

type simulator struct {
	x       *goExec
	workers int // SimOptions.MatmulWorkers: the most large-matmul workers holding panels at once (0: all)
	live    int64
	peak    int64
	kept    int64 // bytes taken and never returned (packed panels filled, leaked buffers), part of live
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

// keep counts a buffer the current op takes from the pool and nobody gives back.
func (s *simulator) keep(b int64) {
	s.alloc(b)
	s.kept += b
}

// TimelinePoint is the memory held after one executor op of a simulated execution (see SimulateTimeline).
type TimelinePoint struct {
	// Step counts executed ops from 0; Node is the executor's node index.
	Step, Node int
	// Op is the executor op type.
	Op string
	// Shape is the op's output shape (the first output's, for multi-output ops).
	Shape shapes.Shape
	// Live is the pool bytes the execution holds after the op, above the bytes held before it; Max is the most
	// it held while the op ran (scratch buffers included).
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
		if why := x.refusal(n); why != "" {
			return fmt.Errorf("%w: graph %q has a %s node (#%d): %s", ErrUnsupported, x.name, n.op, idx, why)
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
	s := &simulator{x: x, curNode: -1, atNode: -1, timeline: timeline, workers: opts.MatmulWorkers,
		has: make([]bool, n), owned: make([]bool, n), numUsed: make([]int, n), bytes: make([]int64, n)}
	resident := x.constantBytes() + x.heldByGraph()

	// Parameters are pre-filled with the caller's buffers; donated ones are owned by the execution, and put
	// back at once when no output needs them.
	for i, idx := range x.inputs {
		b := bufferBytes(x.nodes[idx].shape)
		d := donate != nil && donate[i]
		if idx >= n || x.numUses[idx] == 0 {
			if d {
				s.scratch(b)
			} else {
				resident += b
			}
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
	if s.live != outBytes+s.kept {
		return simResult{}, fmt.Errorf("memory: simulation of graph %q is inconsistent: %d bytes held at the end, "+
			"outputs are %d bytes and %d bytes are kept", x.name, s.live, outBytes, s.kept)
	}
	return simResult{
		peak:     Peak{Bytes: resident + s.peak, Resident: resident + s.kept, Kept: s.kept, Method: MethodSimulation},
		peakNode: s.atNode,
		endLive:  outBytes,
		kept:     s.kept,
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
