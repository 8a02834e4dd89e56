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
// GoMLX internals. Everything this package reads from the Go backend's executor is read here, by field name,
// through reflect (+ unsafe for the unexported fields), and copied into goExec; nothing else in memfit touches
// the backend's state. The executor lives in github.com/gomlx/compute/internal/gobackend, which cannot be
// imported, so its types are recognised by package path and name. The fields are those of compute v0.1.2
// (GoMLX v0.28.2):
//
//	gobackend.Executable{backend *Backend; builder *Builder; mainFn *FunctionExecutable}          (exec.go)
//	gobackend.FunctionExecutable{Function *Function; NumNodesToProcess int; Schedule []int;
//	                             NumUses []int; OutputNodes []*Node}                              (executable.go)
//	gobackend.Function{Nodes, Parameters, Outputs, CapturedLocalNodes []*Node}                     (function.go)
//	gobackend.Builder{name string}                                                                 (builder.go)
//	gobackend.Node{Index int; Inputs []*Node; CapturedInputs [][]*Node; OpType compute.OpType;
//	               Shape shapes.Shape; MultiOutputsShapes []shapes.Shape; MultiOutputsNodes []*Node;
//	               Data any}                                                                       (builder.go)
//	gobackend.Backend{OpsExecutionType; SchedulingStrategy; Workers *workerspool.Pool}             (gobackend.go)
//	workerspool.Pool{maxParallelism int}                                            (workerspool/workerspool.go)
//	gobackend.Buffer{RawBytes []byte}                                       (buffers.go; a Constant's Node.Data)
//	Node.Data: *dot.NodeData{LHS/RHS Contracting/Batch axes, sizes, InputDType, OutputDType,
//	           implementation *ImplementationRegistration{name string}}             (dot/dot.go, dot/registration.go)
//	           []int (Reduce*, Reverse: the axes; ops/reduce.go, ops/reverse.go),
//	           *argMinMaxNode{axis int} (ops/argminmax.go)
//
// Any mismatch is an ErrInternals error naming the field; TestGoBackendInternals fails loudly on it.
// ---------------------------------------------------------------------------------------------------------------

// goBackendPkg is the package path of the Go backend's executor types.
const goBackendPkg = "github.com/gomlx/compute/internal/gobackend"

// goExec is memfit's copy of what the Go backend's executor knows about a compiled graph.
type goExec struct {
	name              string
	nodes             []goNode // all nodes of the main function, indexed by Node.Index
	inputs            []int    // Index of each parameter, in parameter order
	outputs           []int    // Index of each output, in output order
	numNodesToProcess int
	numUses           []int // len numNodesToProcess
	schedule          []int // the executor's order of execution (FunctionExecutable.Schedule)
	sequential        bool  // Backend.OpsExecutionType == OpsExecutionSequential
	creationOrder     bool  // Backend.SchedulingStrategy == CreationOrderSchedule
	// maxParallelism is the backend's workers-pool target (workerspool.Pool.maxParallelism: 2 x GOMAXPROCS by
	// default, 0 no parallelism, < 0 unlimited).
	maxParallelism int
	// fe is the *gobackend.FunctionExecutable, kept for calling its EstimatedTemporaryMemory.
	fe reflect.Value
}

// goNode is one executor node.
type goNode struct {
	idx           int
	op            compute.OpType
	shape         shapes.Shape
	inputs        []int
	captured      int // number of captured (closure) inputs
	multiShapes   []shapes.Shape
	multiNodes    []int
	dot           *goDot
	axes          []int // Reduce* and Reverse
	hasAxes       bool
	argAxis       int   // -1 unless ArgMinMax
	constRawBytes int64 // Constant: len(Buffer.RawBytes)
}

// goDot is the Go backend's dot.NodeData: the normalised product the executor runs.
type goDot struct {
	lhsContractingAxes, lhsBatchAxes                       []int
	rhsContractingAxes, rhsBatchAxes                       []int
	batchSize, lhsCrossSize, rhsCrossSize, contractingSize int
	inputDType, outputDType                                dtypes.DType
	impl                                                   string // the registered implementation's name
}

// bufferBytes is what the Go backend's GetBuffer allocates for a buffer of this shape: the dtype's bytes for the
// shape, rounded up by support.TwoBitBucketLen (buffers.go), which is also the pool's key. Every buffer an
// execution holds has this size, reused ones included (a buffer is only reused for a shape of the same byte
// size), so it is what the process really holds.
func bufferBytes(s shapes.Shape) int64 {
	return int64(support.TwoBitBucketLen(s.DType.SizeForDimensions(s.Dimensions...)))
}

// constantBytes is the bytes of all the constants the compiled graph holds. The Go backend allocates each
// constant from its pool when the graph is built (function.go, Function.Constant) and keeps it, referenced by
// its node, for the graph's lifetime; an execution never owns or returns it.
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

// largeMatmulWorkers is how many workers of the large matmul path may hold packing panels at once: 1 when the
// kernels run it on the calling goroutine (workerspool.Pool.AdjustedMaxParallelism() <= 1), else the most
// workerspool.Pool.Saturate starts (maxParallelism, or GOMAXPROCS when unlimited).
func (x *goExec) largeMatmulWorkers() int {
	procs := runtime.GOMAXPROCS(0)
	adjusted := procs
	if x.maxParallelism >= 0 {
		adjusted = min(max(x.maxParallelism, 1), procs)
	}
	switch {
	case adjusted <= 1:
		return 1
	case x.maxParallelism < 0:
		return procs
	}
	return x.maxParallelism
}

// estimatedTemporaryMemory calls the executor's own FunctionExecutable.EstimatedTemporaryMemory.
func (x *goExec) estimatedTemporaryMemory() (est int64, err error) {
	defer func() {
		if r := recover(); r != nil {
			est, err = 0, fmt.Errorf("%w: calling FunctionExecutable.EstimatedTemporaryMemory: %v", ErrInternals, r)
		}
	}()
	m := x.fe.MethodByName("EstimatedTemporaryMemory")
	if !m.IsValid() || m.Type().NumIn() != 0 || m.Type().NumOut() != 1 || m.Type().Out(0).Kind() != reflect.Int64 {
		return 0, fmt.Errorf("%w: FunctionExecutable has no EstimatedTemporaryMemory() int64", ErrInternals)
	}
	return m.Call(nil)[0].Int(), nil
}

// Values of gobackend.OpsExecutionType (exec.go) and gobackend.ScheduleStrategy (schedule.go).
const (
	goOpsExecutionSequential = 2
	goCreationOrderSchedule  = 1
)

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

// readGoBackend copies what the Go backend's executor knows about the compiled graph g into a goExec.
func readGoBackend(g *graph.Graph) (x *goExec, err error) {
	exe, err := compiledExecutable(g)
	if err != nil {
		return nil, err
	}
	if !isGoBackendType(reflect.TypeOf(exe), "Executable") {
		return nil, fmt.Errorf("%w: graph %q is compiled as %T", ErrNotGoBackend, g.Name(), exe)
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
	return nodeSliceIndexes(f, v.Type().String()+"."+name)
}

// nodeSliceIndexes reads a []*gobackend.Node value as the nodes' Index values.
func nodeSliceIndexes(f reflect.Value, what string) ([]int, error) {
	if f.Kind() != reflect.Slice || !isGoBackendType(f.Type().Elem(), "Node") {
		return nil, fmt.Errorf("%w: %s is %s, want []*gobackend.Node", ErrInternals, what, f.Type())
	}
	if f.IsNil() {
		return nil, nil
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

func readGoExecutable(ev reflect.Value) (*goExec, error) {
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
	x := &goExec{numNodesToProcess: int(nnp.Int()), numUses: numUses.Interface().([]int),
		schedule: schedule.Interface().([]int), fe: fe}
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
	x.sequential = execType.Int() == goOpsExecutionSequential
	strategy, err := structField(backend, "SchedulingStrategy", reflect.Int)
	if err != nil {
		return nil, err
	}
	if strategy.Type().Name() != "ScheduleStrategy" {
		return nil, fmt.Errorf("%w: Backend.SchedulingStrategy is %s", ErrInternals, strategy.Type())
	}
	x.creationOrder = strategy.Int() == goCreationOrderSchedule
	workers, err := structField(backend, "Workers", reflect.Pointer)
	if err != nil {
		return nil, err
	}
	if workers.Type().Elem().Name() != "Pool" || workers.IsNil() {
		return nil, fmt.Errorf("%w: Backend.Workers is %s", ErrInternals, workers.Type())
	}
	maxPar, err := structField(workers, "maxParallelism", reflect.Int)
	if err != nil {
		return nil, err
	}
	x.maxParallelism = int(maxPar.Int())

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
	x.nodes = make([]goNode, nodes.Len())
	for i := range x.nodes {
		gn, err := readNode(nodes.Index(i))
		if err != nil {
			return nil, err
		}
		if gn.idx != i {
			return nil, fmt.Errorf("%w: node %d has Index %d", ErrInternals, i, gn.idx)
		}
		x.nodes[i] = gn
	}
	if x.inputs, err = nodeIndexes(fn, "Parameters"); err != nil {
		return nil, err
	}
	captured, err := nodeIndexes(fn, "CapturedLocalNodes")
	if err != nil {
		return nil, err
	}
	if len(captured) > 0 {
		return nil, fmt.Errorf("%w: the main function has %d captured values", ErrInternals, len(captured))
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
func readNode(v reflect.Value) (goNode, error) {
	var gn goNode
	gn.argAxis = -1
	if !isGoBackendType(v.Type(), "Node") || v.IsNil() {
		return gn, fmt.Errorf("%w: node is %s", ErrInternals, v.Type())
	}
	idx, err := structField(v, "Index", reflect.Int)
	if err != nil {
		return gn, err
	}
	gn.idx = int(idx.Int())
	op, err := privateField(v.Elem(), "OpType", reflect.TypeFor[compute.OpType]())
	if err != nil {
		return gn, err
	}
	gn.op = op.Interface().(compute.OpType)
	shape, err := privateField(v.Elem(), "Shape", reflect.TypeFor[shapes.Shape]())
	if err != nil {
		return gn, err
	}
	gn.shape = shape.Interface().(shapes.Shape)
	if gn.inputs, err = nodeIndexes(v, "Inputs"); err != nil {
		return gn, err
	}
	for _, in := range gn.inputs {
		if in >= gn.idx {
			return gn, fmt.Errorf("%w: node #%d has input #%d after it", ErrInternals, gn.idx, in)
		}
	}
	capt, err := structField(v, "CapturedInputs", reflect.Slice)
	if err != nil {
		return gn, err
	}
	for i := range capt.Len() {
		c, err := nodeSliceIndexes(capt.Index(i), "Node.CapturedInputs")
		if err != nil {
			return gn, err
		}
		gn.captured += len(c)
	}
	if gn.multiNodes, err = nodeIndexes(v, "MultiOutputsNodes"); err != nil {
		return gn, err
	}
	ms, err := privateField(v.Elem(), "MultiOutputsShapes", reflect.TypeFor[[]shapes.Shape]())
	if err != nil {
		return gn, err
	}
	gn.multiShapes = ms.Interface().([]shapes.Shape)
	if len(gn.multiShapes) != len(gn.multiNodes) {
		return gn, fmt.Errorf("%w: node #%d has %d multi-output shapes and %d multi-output nodes",
			ErrInternals, gn.idx, len(gn.multiShapes), len(gn.multiNodes))
	}
	dataField, err := privateField(v.Elem(), "Data", reflect.TypeFor[any]())
	if err != nil {
		return gn, err
	}
	data := dataField.Interface()
	if len(gn.multiShapes) > 0 {
		return gn, nil // A multi-output node: its executor needs none of its data.
	}
	switch {
	case gn.op == compute.OpTypeDotGeneral:
		gn.dot, err = readDotData(data)
		if err != nil {
			return gn, fmt.Errorf("DotGeneral node #%d: %w", gn.idx, err)
		}
	case simReduce[gn.op] || gn.op == compute.OpTypeReverse:
		axes, ok := data.([]int)
		if !ok {
			return gn, fmt.Errorf("%w: %s node #%d data is %T, want []int", ErrInternals, gn.op, gn.idx, data)
		}
		gn.axes, gn.hasAxes = axes, true
	case gn.op == compute.OpTypeArgMinMax:
		dv := reflect.ValueOf(data)
		if dv.Kind() != reflect.Pointer || dv.IsNil() || dv.Elem().Kind() != reflect.Struct {
			return gn, fmt.Errorf("%w: ArgMinMax node #%d data is %T", ErrInternals, gn.idx, data)
		}
		axis, err := privateField(dv.Elem(), "axis", reflect.TypeFor[int]())
		if err != nil {
			return gn, err
		}
		gn.argAxis = int(axis.Int())
	case gn.op == compute.OpTypeConstant:
		if !isGoBackendType(reflect.TypeOf(data), "Buffer") || reflect.ValueOf(data).IsNil() {
			return gn, fmt.Errorf("%w: Constant node #%d data is %T, want *gobackend.Buffer", ErrInternals, gn.idx, data)
		}
		raw, err := privateField(reflect.ValueOf(data).Elem(), "RawBytes", reflect.TypeFor[[]byte]())
		if err != nil {
			return gn, err
		}
		gn.constRawBytes = int64(raw.Len())
	}
	return gn, nil
}

// readDotData copies a *dot.NodeData.
func readDotData(data any) (*goDot, error) {
	dv := reflect.ValueOf(data)
	if dv.Kind() != reflect.Pointer || dv.IsNil() || dv.Elem().Kind() != reflect.Struct || dv.Elem().Type().Name() != "NodeData" {
		return nil, fmt.Errorf("%w: data is %T, want *dot.NodeData", ErrInternals, data)
	}
	v := dv.Elem()
	d := &goDot{}
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
	dts := []struct {
		name string
		dst  *dtypes.DType
	}{{"InputDType", &d.inputDType}, {"OutputDType", &d.outputDType}}
	for _, f := range dts {
		fv, err := privateField(v, f.name, reflect.TypeFor[dtypes.DType]())
		if err != nil {
			return nil, err
		}
		*f.dst = fv.Interface().(dtypes.DType)
	}
	impl, err := privateField(v, "implementation", nil)
	if err != nil {
		return nil, err
	}
	if impl.Kind() != reflect.Pointer || impl.IsNil() || impl.Elem().Kind() != reflect.Struct {
		return nil, fmt.Errorf("%w: dot.NodeData.implementation is %s (nil: %v)", ErrInternals, impl.Type(),
			impl.Kind() == reflect.Pointer && impl.IsNil())
	}
	name, err := privateField(impl.Elem(), "name", reflect.TypeFor[string]())
	if err != nil {
		return nil, err
	}
	d.impl = name.String()
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
