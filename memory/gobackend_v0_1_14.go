package memory

// ===============================================================================================================
// The fence: everything memfit knows about the pure-Go backend's executor of ONE compute version, v0.1.14
// (github.com/gomlx/compute, GoMLX v0.28.16). This file (with its two build-tag stubs,
// gobackend_v0_1_14_simd.go and gobackend_v0_1_14_nosimd.go) is the only place that
//
//   - reads the executor's unexported state (reflect + unsafe; the executor lives in
//     github.com/gomlx/compute/internal/gobackend, which cannot be imported, so its types are recognised by
//     package path and name), and
//   - holds memfit's copies of the executor's buffer rules: which executor reuses which input in place, which
//     allocates what, which scratch buffers it takes from the pool and puts back, the matrix kernels' panel
//     sizes and size threshold, the SIMD reduce thresholds.
//
// Those are modelled from reading compute v0.1.14's source, in memfit's own words. A binary built against any
// other compute version gets ErrComputeVersion ("modelled for compute v0.1.14, running vX") before anything is
// read, and every reported peak then says unavailable. Moving to a new compute version means re-reading its
// internal/gobackend (executable.go, exec.go, buffers.go, builder.go, dot/, dot/matmul/, ops/, fusedops/) and
// writing a new file like this one; TestComputeVersionPinned fails, naming both versions, until then.
//
// What was read, compute v0.1.14:
//
//	gobackend.Executable{backend *Backend; builder *Builder; mainFn *FunctionExecutable}         (exec.go)
//	gobackend.FunctionExecutable{Function *Function; NumNodesToProcess int; Schedule, NumUses []int;
//	                             OutputNodes []*Node}                                            (executable.go)
//	gobackend.Function{Nodes, Parameters, CapturedLocalNodes []*Node}                             (function.go)
//	gobackend.Builder{name string}; gobackend.Node{Index int; Inputs []*Node; CapturedInputs [][]*Node;
//	    OpType; Shape; MultiOutputsShapes []shapes.Shape; MultiOutputsNodes []*Node;
//	    IsNodeSelectOutput bool; Data any; cachedExecutorIdx atomic.Int32}                        (builder.go)
//	gobackend.Backend{Workers *workerspool.Pool{maxParallelism int}; OpsExecutionType;
//	    SchedulingStrategy; NoOps bool}                                                           (gobackend.go)
//	Node.Data: *gobackend.Buffer{RawBytes} (Constant); *dot.NodeData (DotGeneral: sizes, dtypes,
//	    implementation *ImplementationRegistration{name}, PackedLHSCache/PackedRHSCache
//	    *PackedMatrixCache{Buffer any}); *ops.ReduceConfig{Axes; Pattern; A, B, C} (Reduce*); []int (Reverse);
//	    *ops.argMinMaxNode{axis}; *dense.nodeFusedDense{lhsCrossSize, rhsCrossSize, contractingSize,
//	    dotNodeData}; *dense.nodeFusedDenseVJP{..., hasBias}; *fusedops.nodeScaledDotProductAttention{
//	    axesLayout, hasMask, hasSeqLens, hasBias}
//
// Any mismatch in these is an ErrInternals error naming the field; TestGoBackendInternals checks them all.
// ===============================================================================================================

import (
	"errors"
	"fmt"
	"reflect"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/compute/support/envutil"
	"github.com/gomlx/gomlx/core/graph"
)

// modelledCompute is the github.com/gomlx/compute version whose Go backend executor this file models.
const modelledCompute = "v0.1.14"

// computeModule is the module path of GoMLX's backends.
const computeModule = "github.com/gomlx/compute"

// goBackendPkg is the package path of the Go backend's executor types.
const goBackendPkg = computeModule + "/internal/gobackend"

// ---------------------------------------------------------------------------------------------------------------
// The version fence.
// ---------------------------------------------------------------------------------------------------------------

// ComputeVersionError is the error (matching ErrComputeVersion) for a binary built against a compute version
// other than the one the executor model was written for.
type ComputeVersionError struct {
	// Modelled is the compute version the model reads; Running the one this binary was built with, and
	// ReplacedBy the replacement of the compute module, if its go.mod replaces it ("" if not).
	Modelled, Running, ReplacedBy string
}

// Error says "modelled for compute v0.1.14, running v0.1.15".
func (e *ComputeVersionError) Error() string {
	s := fmt.Sprintf("modelled for compute %s, running %s", e.Modelled, e.Running)
	if e.ReplacedBy != "" {
		s += " (replaced by " + e.ReplacedBy + ")"
	}
	return s
}

// Is makes errors.Is(err, ErrComputeVersion) true.
func (e *ComputeVersionError) Is(target error) bool { return target == ErrComputeVersion }

// computeVersionOverride, when set (tests only, SetComputeVersionForTest), replaces the version read from the
// build info.
var computeVersionOverride atomic.Pointer[string]

// runningCompute returns the version of github.com/gomlx/compute this binary was built with, from its build
// info (see computeIn). known is false when the binary carries no build info or no compute module.
func runningCompute() (version, replacedBy string, known bool) {
	if v := computeVersionOverride.Load(); v != nil {
		return *v, "", true
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "", "", false
	}
	return computeIn(info)
}

// computeIn returns the compute module's version in build info: the required version, or, when go.mod
// replaces the module, the replacement's version (a module replacement) or the required version (a directory
// replacement, such as tools/peakmem's patched copy of the same version, which the build records with version
// "(devel)"; replacedBy then names the directory).
func computeIn(info *debug.BuildInfo) (version, replacedBy string, known bool) {
	for _, dep := range info.Deps {
		if dep.Path != computeModule {
			continue
		}
		if r := dep.Replace; r != nil {
			if r.Version != "" && r.Version != "(devel)" {
				return r.Version, r.Path + "@" + r.Version, true
			}
			// A directory replacement: the build records it as version "(devel)" (or none).
			return dep.Version, r.Path, true
		}
		return dep.Version, "", true
	}
	return "", "", false
}

// SetComputeVersionForTest makes the executor model see version as the github.com/gomlx/compute version this
// binary was built with, until the returned function restores the real one: a test of what memfit reports when
// the Go backend's peak is unavailable ("modelled for compute v0.1.14, running <version>"). For tests only; the
// setting is process-wide.
func SetComputeVersionForTest(version string) (restore func()) {
	old := computeVersionOverride.Swap(&version)
	return func() { computeVersionOverride.Store(old) }
}

// checkComputeVersion returns a *ComputeVersionError when this binary's compute module is not the version the
// executor model was written for. A binary without build info (or without the compute module in it) is let
// through: every memfit build is a module build, which records its dependencies (`go test` binaries included),
// so this only happens to unusual builds, and the structural checks in readGoExecutable still refuse an
// executor whose fields, node data or ops differ from what this file reads.
func checkComputeVersion() error {
	v, replacedBy, known := runningCompute()
	if known && v != modelledCompute {
		return &ComputeVersionError{Modelled: modelledCompute, Running: v, ReplacedBy: replacedBy}
	}
	return nil
}

// ---------------------------------------------------------------------------------------------------------------
// Build and environment facts the executor fixes at init time.
// ---------------------------------------------------------------------------------------------------------------

// goBuild is what the backend registered in this build (see goBackendBuild in the build-tag stubs).
type goBuild struct {
	simdExecutors bool // the goexperiment.simd executors (ops/*_simd.go, fusedops/*_simd.go)
	avx512, avx2  bool // gobackend.IsAVX512Allowed, IsAVX2Allowed
}

// goBackendEnv is read once, as the backend reads its settings once at init.
var goBackendEnv = sync.OnceValue(func() goEnv {
	e := goEnv{goBuild: goBackendBuild(), matmul: envutil.MustReadBool(envutil.GoBackendDotMatmul, true)}
	// dot/matmul/nosimd.go NoSIMDParams; avx512/avx512.go AVX512Params*; avx2/avx2.go AVX2Params*, with the
	// environment overrides their init functions apply.
	e.nosimd = kernelParams{mr: 2, nr: 4, kc: 512, mc: 2, nc: 512}
	e.nosimd.override(envutil.GoBackendNoSIMD_KC, envutil.GoBackendNoSIMD_MC, envutil.GoBackendNoSIMD_NC)
	e.avx512Params = map[dtypes.DType]kernelParams{
		dtypes.Float32:  {mr: 8, nr: 32, kc: 192, mc: 32, nc: 512},
		dtypes.BFloat16: {mr: 8, nr: 32, kc: 128, mc: 32, nc: 768},
		dtypes.Float16:  {mr: 8, nr: 32, kc: 128, mc: 32, nc: 768},
		dtypes.Float64:  {mr: 8, nr: 16, kc: 64, mc: 16, nc: 256},
	}
	asm := envutil.MustReadBool(envutil.GoBackendAVX512_ASM, true)
	for dt, p := range e.avx512Params {
		if !asm {
			p.mr = 4
		}
		p.override(envutil.GoBackendAVX512_KC, envutil.GoBackendAVX512_MC, envutil.GoBackendAVX512_NC)
		e.avx512Params[dt] = p
	}
	e.avx2Params = map[dtypes.DType]kernelParams{
		dtypes.Float32:  {mr: 4, nr: 16, kc: 128, mc: 32, nc: 512},
		dtypes.BFloat16: {mr: 4, nr: 16, kc: 128, mc: 32, nc: 768},
		dtypes.Float16:  {mr: 4, nr: 16, kc: 128, mc: 32, nc: 768},
		dtypes.Float64:  {mr: 4, nr: 8, kc: 64, mc: 16, nc: 256},
	}
	for dt, p := range e.avx2Params {
		p.override(envutil.GoBackendAVX2_KC, envutil.GoBackendAVX2_MC, envutil.GoBackendAVX2_NC)
		e.avx2Params[dt] = p
	}
	return e
})

// goEnv is goBuild plus the matrix kernels' settings.
type goEnv struct {
	goBuild
	matmul                   bool // $GOMLX_GO_DOT_MATMUL: the matrix kernels are registered at all
	nosimd                   kernelParams
	avx512Params, avx2Params map[dtypes.DType]kernelParams
}

// kernelParams are a matrix kernel's cache parameters (matmul.CacheParams): register block Mr x Nr, panels of
// Kc (contracting) by Mc (LHS rows) and Nc (RHS columns).
type kernelParams struct{ mr, nr, kc, mc, nc int }

func (p *kernelParams) override(kc, mc, nc string) {
	if v := envutil.MustReadInt(kc, 0); v > 0 {
		p.kc = v
	}
	if v := envutil.MustReadInt(mc, 0); v > 0 {
		p.mc = v
	}
	if v := envutil.MustReadInt(nc, 0); v > 0 {
		p.nc = v
	}
}

// ---------------------------------------------------------------------------------------------------------------
// Reading the compiled executable.
// ---------------------------------------------------------------------------------------------------------------

// Values of gobackend.OpsExecutionType (exec.go) and gobackend.ScheduleStrategy (schedule.go).
const (
	goOpsExecutionSequential = 2
	goCreationOrderSchedule  = 1
)

// isGoBackendType reports whether t is *gobackend.<name> of the Go backend's executor package.
func isGoBackendType(t reflect.Type, name string) bool {
	return t != nil && t.Kind() == reflect.Pointer && t.Elem().PkgPath() == goBackendPkg && t.Elem().Name() == name
}

// readGoBackend checks the compute version, then copies what the Go backend's executor knows about the compiled
// graph g into a goExec.
func readGoBackend(g *graph.Graph) (x *goExec, err error) {
	exe, err := compiledExecutable(g)
	if err != nil {
		return nil, err
	}
	if !isGoBackendType(reflect.TypeOf(exe), "Executable") {
		return nil, fmt.Errorf("%w: graph %q is compiled as %T", ErrNotGoBackend, g.Name(), exe)
	}
	if err := checkComputeVersion(); err != nil {
		return nil, err
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

// fieldOf reads struct field name of v (a struct reached through a pointer) as a T.
func fieldOf[T any](v reflect.Value, name string) (T, error) {
	var zero T
	f, err := privateField(v, name, reflect.TypeFor[T]())
	if err != nil {
		return zero, err
	}
	t, _ := f.Interface().(T) // the type is checked; only a nil interface value fails the assertion
	return t, nil
}

// intFieldOf reads an int-kinded field (int or a named int type) of v.
func intFieldOf(v reflect.Value, name string) (int, error) {
	f, err := privateField(v, name, nil)
	if err != nil {
		return 0, err
	}
	if f.Kind() != reflect.Int {
		return 0, fmt.Errorf("%w: %s.%s is %s, want an int", ErrInternals, v.Type(), name, f.Type())
	}
	return int(f.Int()), nil
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
	numUses, err := fieldOf[[]int](fe.Elem(), "NumUses")
	if err != nil {
		return nil, err
	}
	schedule, err := fieldOf[[]int](fe.Elem(), "Schedule")
	if err != nil {
		return nil, err
	}
	x := &goExec{numNodesToProcess: int(nnp.Int()), numUses: numUses, schedule: schedule}
	if len(x.numUses) != x.numNodesToProcess {
		return nil, fmt.Errorf("%w: len(NumUses)=%d != NumNodesToProcess=%d", ErrInternals, len(x.numUses), x.numNodesToProcess)
	}
	if m := fe.MethodByName("EstimatedTemporaryMemory"); m.IsValid() && m.Type().NumIn() == 0 && m.Type().NumOut() == 1 &&
		m.Type().Out(0).Kind() == reflect.Int64 {
		x.estimate = func() (est int64, err error) {
			defer func() {
				if r := recover(); r != nil {
					est, err = 0, fmt.Errorf("%w: calling FunctionExecutable.EstimatedTemporaryMemory: %v", ErrInternals, r)
				}
			}()
			return m.Call(nil)[0].Int(), nil
		}
	} else {
		return nil, fmt.Errorf("%w: FunctionExecutable has no EstimatedTemporaryMemory() int64", ErrInternals)
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
	noOps, err := structField(backend, "NoOps", reflect.Bool)
	if err != nil {
		return nil, err
	}
	x.noOps = noOps.Bool()
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
	return x, x.checkDotImplementations()
}

// readNode copies one *gobackend.Node.
func readNode(v reflect.Value) (goNode, error) {
	var gn goNode
	gn.argAxis = -1
	if !isGoBackendType(v.Type(), "Node") || v.IsNil() {
		return gn, fmt.Errorf("%w: node is %s", ErrInternals, v.Type())
	}
	nv := v.Elem()
	var err error
	if gn.idx, err = fieldOf[int](nv, "Index"); err != nil {
		return gn, err
	}
	if gn.op, err = fieldOf[compute.OpType](nv, "OpType"); err != nil {
		return gn, err
	}
	if gn.shape, err = fieldOf[shapes.Shape](nv, "Shape"); err != nil {
		return gn, err
	}
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
	if gn.multiShapes, err = fieldOf[[]shapes.Shape](nv, "MultiOutputsShapes"); err != nil {
		return gn, err
	}
	if len(gn.multiShapes) != len(gn.multiNodes) {
		return gn, fmt.Errorf("%w: node #%d has %d multi-output shapes and %d multi-output nodes",
			ErrInternals, gn.idx, len(gn.multiShapes), len(gn.multiNodes))
	}
	cached, err := privateField(nv, "cachedExecutorIdx", reflect.TypeFor[atomic.Int32]())
	if err != nil {
		return gn, err
	}
	gn.cachedExecutor = int(cached.Addr().Interface().(*atomic.Int32).Load())
	if gn.selectOutput, err = fieldOf[bool](nv, "IsNodeSelectOutput"); err != nil || gn.selectOutput {
		// One output of a multi-output node (NewMultiOutputsNode): the same op, no data, never executed itself.
		return gn, err
	}
	data, err := fieldOf[any](nv, "Data")
	if err != nil {
		return gn, err
	}
	if err := readNodeData(&gn, data); err != nil {
		return gn, fmt.Errorf("%s node #%d: %w", gn.op, gn.idx, err)
	}
	return gn, nil
}

// dataStruct returns the struct data points to, checking it is a non-nil *<pkg>.<name> of the Go backend.
func dataStruct(data any, pkg, name string) (reflect.Value, error) {
	dv := reflect.ValueOf(data)
	if dv.Kind() != reflect.Pointer || dv.IsNil() || dv.Elem().Kind() != reflect.Struct ||
		dv.Elem().Type().PkgPath() != goBackendPkg+pkg || dv.Elem().Type().Name() != name {
		return reflect.Value{}, fmt.Errorf("%w: data is %T, want *%s.%s", ErrInternals, data, pkg[1:], name)
	}
	return dv.Elem(), nil
}

// readNodeData copies what the simulation needs from a node's Data.
func readNodeData(gn *goNode, data any) error {
	var err error
	switch op := gn.op; {
	case op == compute.OpTypeDotGeneral:
		gn.dot, err = readDotData(data)
	case simReduce[op]:
		gn.reduce, err = readReduceData(data)
	case op == compute.OpTypeReverse:
		axes, ok := data.([]int)
		if !ok {
			return fmt.Errorf("%w: data is %T, want []int", ErrInternals, data)
		}
		gn.axes, gn.hasAxes = axes, true
	case op == compute.OpTypeArgMinMax:
		v, err := dataStruct(data, "/ops", "argMinMaxNode")
		if err != nil {
			return err
		}
		gn.argAxis, err = fieldOf[int](v, "axis")
		return err
	case op == compute.OpTypeConstant:
		if !isGoBackendType(reflect.TypeOf(data), "Buffer") || reflect.ValueOf(data).IsNil() {
			return fmt.Errorf("%w: data is %T, want *gobackend.Buffer", ErrInternals, data)
		}
		raw, err := fieldOf[[]byte](reflect.ValueOf(data).Elem(), "RawBytes")
		if err != nil {
			return err
		}
		gn.constRawBytes = int64(len(raw))
	case op == compute.OpTypeFusedDense, op == compute.OpTypeFusedDenseVJP:
		gn.dense, err = readDenseData(op, data)
	case op == compute.OpTypeFusedScaledDotProductAttention:
		gn.sdpa, err = readSDPAData(data)
	}
	return err
}

// readDotData copies a *dot.NodeData.
func readDotData(data any) (*goDot, error) {
	v, err := dataStruct(data, "/dot", "NodeData")
	if err != nil {
		return nil, err
	}
	d := &goDot{}
	for _, f := range []struct {
		name string
		dst  *[]int
	}{{"LHSContractingAxes", &d.lhsContractingAxes}, {"LHSBatchAxes", &d.lhsBatchAxes},
		{"RHSContractingAxes", &d.rhsContractingAxes}, {"RHSBatchAxes", &d.rhsBatchAxes}} {
		if *f.dst, err = fieldOf[[]int](v, f.name); err != nil {
			return nil, err
		}
	}
	for _, f := range []struct {
		name string
		dst  *int
	}{{"BatchSize", &d.batchSize}, {"LHSCrossSize", &d.lhsCrossSize}, {"RHSCrossSize", &d.rhsCrossSize},
		{"ContractingSize", &d.contractingSize}} {
		if *f.dst, err = fieldOf[int](v, f.name); err != nil {
			return nil, err
		}
	}
	if d.inputDType, err = fieldOf[dtypes.DType](v, "InputDType"); err != nil {
		return nil, err
	}
	if d.outputDType, err = fieldOf[dtypes.DType](v, "OutputDType"); err != nil {
		return nil, err
	}
	impl, err := privateField(v, "implementation", nil)
	if err != nil {
		return nil, err
	}
	if impl.Kind() != reflect.Pointer || impl.IsNil() || impl.Elem().Kind() != reflect.Struct {
		return nil, fmt.Errorf("%w: dot.NodeData.implementation is %s (nil: %v)", ErrInternals, impl.Type(),
			impl.Kind() == reflect.Pointer && impl.IsNil())
	}
	if d.impl, err = fieldOf[string](impl.Elem(), "name"); err != nil {
		return nil, err
	}
	d.lhsCache, d.rhsCache, err = readPanelCaches(v)
	return d, err
}

// readPanelCaches reads a *dot.NodeData's PackedLHSCache and PackedRHSCache (*dot.PackedMatrixCache: nil when
// the operand is not constant; its Buffer is the *gobackend.Buffer GetBuffer gave the packed panels, nil until
// the product's first run on the large path fills it).
func readPanelCaches(v reflect.Value) (lhs, rhs goPanelCache, err error) {
	read := func(name string) (goPanelCache, error) {
		f, err := privateField(v, name, nil)
		if err != nil {
			return goPanelCache{}, err
		}
		if f.Kind() != reflect.Pointer || f.Type().Elem().Name() != "PackedMatrixCache" {
			return goPanelCache{}, fmt.Errorf("%w: dot.NodeData.%s is %s", ErrInternals, name, f.Type())
		}
		if f.IsNil() {
			return goPanelCache{}, nil
		}
		buf, err := fieldOf[any](f.Elem(), "Buffer")
		if err != nil || buf == nil {
			return goPanelCache{present: true}, err
		}
		if !isGoBackendType(reflect.TypeOf(buf), "Buffer") || reflect.ValueOf(buf).IsNil() {
			return goPanelCache{}, fmt.Errorf("%w: PackedMatrixCache.Buffer is %T", ErrInternals, buf)
		}
		raw, err := fieldOf[[]byte](reflect.ValueOf(buf).Elem(), "RawBytes")
		return goPanelCache{present: true, held: int64(len(raw))}, err
	}
	if lhs, err = read("PackedLHSCache"); err != nil {
		return
	}
	rhs, err = read("PackedRHSCache")
	return
}

// readReduceData copies an *ops.ReduceConfig.
func readReduceData(data any) (*goReduce, error) {
	v, err := dataStruct(data, "/ops", "ReduceConfig")
	if err != nil {
		return nil, err
	}
	r := &goReduce{}
	if r.axes, err = fieldOf[[]int](v, "Axes"); err != nil {
		return nil, err
	}
	if r.pattern, err = intFieldOf(v, "Pattern"); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name string
		dst  *int
	}{{"A", &r.a}, {"B", &r.b}, {"C", &r.c}} {
		if *f.dst, err = fieldOf[int](v, f.name); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// readDenseData copies a *dense.nodeFusedDense or *dense.nodeFusedDenseVJP.
func readDenseData(op compute.OpType, data any) (*goDense, error) {
	name := map[bool]string{true: "nodeFusedDense", false: "nodeFusedDenseVJP"}[op == compute.OpTypeFusedDense]
	v, err := dataStruct(data, "/fusedops/dense", name)
	if err != nil {
		return nil, err
	}
	d := &goDense{}
	for _, f := range []struct {
		name string
		dst  *int
	}{{"lhsCrossSize", &d.rows}, {"rhsCrossSize", &d.out}, {"contractingSize", &d.in}} {
		if *f.dst, err = fieldOf[int](v, f.name); err != nil {
			return nil, err
		}
	}
	if batch, err := fieldOf[int](v, "batchSize"); err != nil || batch != 1 {
		return nil, errors.Join(err, fmt.Errorf("%w: %s.batchSize is %d, want 1", ErrInternals, name, batch))
	}
	if op == compute.OpTypeFusedDenseVJP {
		d.hasBias, err = fieldOf[bool](v, "hasBias")
		return d, err
	}
	dd, err := privateField(v, "dotNodeData", nil)
	if err != nil {
		return nil, err
	}
	if dd.Kind() != reflect.Pointer || dd.IsNil() {
		return nil, fmt.Errorf("%w: nodeFusedDense.dotNodeData is %s (nil)", ErrInternals, dd.Type())
	}
	d.lhsCache, d.rhsCache, err = readPanelCaches(dd.Elem())
	return d, err
}

// readSDPAData copies a *fusedops.nodeScaledDotProductAttention.
func readSDPAData(data any) (*goSDPA, error) {
	v, err := dataStruct(data, "/fusedops", "nodeScaledDotProductAttention")
	if err != nil {
		return nil, err
	}
	s := &goSDPA{}
	layout, err := fieldOf[compute.AttentionAxesLayout](v, "axesLayout")
	if err != nil {
		return nil, err
	}
	s.bshd = layout == compute.AttentionAxesLayoutBSHD
	for _, f := range []struct {
		name string
		dst  *bool
	}{{"hasMask", &s.hasMask}, {"hasSeqLens", &s.hasSeqLens}, {"hasBias", &s.hasBias}} {
		if *f.dst, err = fieldOf[bool](v, f.name); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// checkDotImplementations checks that every DotGeneral's registered implementation is the one this file
// predicts for its dtypes (the FusedDense executors look theirs up at run time, so the model needs the
// prediction; this confirms it against the executor's own choice).
func (x *goExec) checkDotImplementations() error {
	for i := range x.nodes {
		if d := x.nodes[i].dot; d != nil {
			if want := matmulImplementation(d.inputDType, d.outputDType); want != d.impl {
				return fmt.Errorf("%w: DotGeneral node #%d (%s -> %s) runs %q, the model predicts %q", ErrInternals, i,
					d.inputDType, d.outputDType, d.impl, want)
			}
		}
	}
	return nil
}

// ---------------------------------------------------------------------------------------------------------------
// The executors' buffer rules.
// ---------------------------------------------------------------------------------------------------------------

// Op families, by what their executor does with the pool (files under internal/gobackend).
var (
	// ops/unaryops.go (unaryOperandAndOutput; the SIMD executors in unaryops_simd.go use it too, and fall back
	// before taking anything): reuse the owned operand, else a new buffer of its shape.
	simUnaryReuse = opSet(compute.OpTypeNeg, compute.OpTypeAbs, compute.OpTypeSign, compute.OpTypeLogicalNot,
		compute.OpTypeBitwiseNot, compute.OpTypeBitCount, compute.OpTypeClz, compute.OpTypeExp,
		compute.OpTypeExpm1, compute.OpTypeLog, compute.OpTypeLog1p, compute.OpTypeCeil, compute.OpTypeFloor,
		compute.OpTypeRound, compute.OpTypeRsqrt, compute.OpTypeSqrt, compute.OpTypeCos, compute.OpTypeSin,
		compute.OpTypeTanh, compute.OpTypeLogistic, compute.OpTypeErf)
	// ops/binaryops.go binaryOperandsAndOutputForExecution (gen_exec_binary.go, shiftops.go, and the SIMD
	// executors in binaryops_simd.go once their checks pass): reuse the owned rhs, else the owned lhs, when its
	// shape equals the output's; else a new buffer.
	simBinaryReuse = opSet(compute.OpTypeAdd, compute.OpTypeMul, compute.OpTypeSub, compute.OpTypeDiv,
		compute.OpTypeRem, compute.OpTypePow, compute.OpTypeAtan2, compute.OpTypeMax, compute.OpTypeMin,
		compute.OpTypeBitwiseAnd, compute.OpTypeBitwiseOr, compute.OpTypeBitwiseXor, compute.OpTypeLogicalAnd,
		compute.OpTypeLogicalOr, compute.OpTypeLogicalXor, compute.OpTypeShiftLeft,
		compute.OpTypeShiftRightArithmetic, compute.OpTypeShiftRightLogical)
	// Reuse the owned first input, else copy it into a new buffer of its size: ops/identity.go,
	// optimizationbarrier.go, schedulingbarrier.go (its other inputs are dependencies only), reshape.go (Reshape
	// and DynamicReshape), dynamicupdateslice.go (CloneBuffer), scatter.go (CloneBuffer).
	simFirstInputReuse = opSet(compute.OpTypeIdentity, compute.OpTypeOptimizationBarrier,
		compute.OpTypeSchedulingBarrier, compute.OpTypeReshape, compute.OpTypeDynamicReshape,
		compute.OpTypeDynamicUpdateSlice, compute.OpTypeScatterMax, compute.OpTypeScatterMin, compute.OpTypeScatterSum)
	// ops/reduce.go execReduce and reduce_simd.go: see reduceOp.
	simReduce = opSet(compute.OpTypeReduceMax, compute.OpTypeReduceMin, compute.OpTypeReduceSum,
		compute.OpTypeReduceProduct, compute.OpTypeReduceBitwiseAnd, compute.OpTypeReduceBitwiseOr,
		compute.OpTypeReduceBitwiseXor, compute.OpTypeReduceLogicalAnd, compute.OpTypeReduceLogicalOr,
		compute.OpTypeReduceLogicalXor)
	// A new output buffer of the node's shape and nothing else from the pool: comparisons (gen_exec_binary.go)
	// and IsFinite (unaryops.go), transpose.go, broadcastindim.go, iota.go, gather.go, concatenate.go,
	// convertdtype.go, slice.go, pad.go, reducewindow.go, convgeneral.go, cumsum.go, selectandscatter.go,
	// dynamic.go (DynamicDimensionSize, DynamicShape), fusedops/softmax.go and softmax_simd.go, layernorm.go and
	// layernorm_simd.go, activation.go (FusedActivation, FusedActivationVJP; also the old FusedGelu).
	simNewOutput = opSet(compute.OpTypeIsFinite, compute.OpTypeEqual, compute.OpTypeNotEqual,
		compute.OpTypeGreaterOrEqual, compute.OpTypeGreaterThan, compute.OpTypeLessOrEqual,
		compute.OpTypeLessThan, compute.OpTypeTranspose, compute.OpTypeBroadcastInDim,
		compute.OpTypeIota, compute.OpTypeGather, compute.OpTypeConcatenate, compute.OpTypeConvertDType,
		compute.OpTypeSlice, compute.OpTypePad, compute.OpTypeReduceWindow, compute.OpTypeConvGeneral,
		compute.OpTypeCumSum, compute.OpTypeSelectAndScatterMax, compute.OpTypeSelectAndScatterMin,
		compute.OpTypeDynamicDimensionSize, compute.OpTypeDynamicShape, compute.OpTypeFusedSoftmax,
		compute.OpTypeFusedLayerNorm, compute.OpTypeFusedActivation, compute.OpTypeFusedActivationVJP,
		compute.OpTypeFusedGelu)
	// Modelled one by one in singleOutputOp and multiOutputOp (Parameter and Constant are not executed).
	simOwnModel = opSet(compute.OpTypeParameter, compute.OpTypeConstant, compute.OpTypeWhere,
		compute.OpTypeArgMinMax, compute.OpTypeDotGeneral, compute.OpTypeReverse, compute.OpTypeBitcast,
		compute.OpTypeFusedDense, compute.OpTypeFusedDenseVJP, compute.OpTypeFusedScaledDotProductAttention,
		compute.OpTypeFusedQuantizedDense, compute.OpTypeQuantizedEmbeddingLookup, compute.OpTypeRNGBitGenerator,
		compute.OpTypeFusedAttentionQKVProjection)
	// simRefused are executors the simulation cannot replay without running the graph, with the reason a
	// graph holding one is ErrUnsupported.
	simRefused = map[compute.OpType]string{
		compute.OpTypeIf:    "runs a closure the data chooses (ops/if.go)",
		compute.OpTypeWhile: "runs closures a data-dependent number of times, cloning its state (ops/while.go)",
		compute.OpTypeSort:  "runs a comparator closure over the data, with buffers per comparison (ops/sort.go)",
		compute.OpTypeCall:  "runs a nested function's own executable (ops/call.go)",
		compute.OpTypeDynamicBroadcastInDim: "its output shape is read from the data at run time " +
			"(ops/broadcastindim.go)",
		compute.OpTypeDynamicIota: "its output shape is read from the data at run time (ops/iota.go)",
		compute.OpTypeDynamicPad:  "its padding, and so its output shape, is read from the data (ops/pad.go)",
	}
	// simBuilderOnly are ops the Go backend lists in its capabilities that never reach the executor: the builder
	// rewrites IsNaN into NotEqual (ops/isnan.go) and Clamp into Max + Min (ops/clamp.go); Dot has no builder
	// method (graph.Dot builds a DotGeneral).
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
		simNewOutput[op]
}

// refusal returns why the simulation cannot replay the node, or "" if it can.
func (x *goExec) refusal(n *goNode) string {
	switch {
	case simRefused[n.op] != "":
		return simRefused[n.op]
	case n.captured > 0:
		return "it captures values for a nested function"
	case x.noOps:
		return "the backend skips the computations (no_ops), and with them the matrix kernels' scratch buffers"
	}
	return ""
}

// heldByGraph is the bytes the compiled graph's nodes hold from the pool beyond its constants: the packed panels
// of constant matrix operands that earlier runs filled (dot/cache.go; taken with GetBuffer and never returned).
func (x *goExec) heldByGraph() int64 {
	var b int64
	for i := range x.nodes {
		n := &x.nodes[i]
		switch {
		case n.dot != nil:
			b += n.dot.lhsCache.held + n.dot.rhsCache.held
		case n.dense != nil:
			b += n.dense.lhsCache.held + n.dense.rhsCache.held
		}
	}
	return b
}

// singleOutputOp models one single-output executor: it allocates and frees the op's buffers (output and
// scratch) and returns the bytes of the new output buffer, or the index of the input whose buffer became the
// output (then the bytes are that buffer's).
func (s *simulator) singleOutputOp(node *goNode, owned []bool) (outBytes int64, reuse int, err error) {
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
		return newOut(bufferBytes(in(0)))

	case simBinaryReuse[op]:
		switch {
		case owned[1] && in(1).Equal(node.shape):
			return 0, 1, nil
		case owned[0] && in(0).Equal(node.shape):
			return 0, 0, nil
		}
		return newOut(bufferBytes(node.shape))

	case simFirstInputReuse[op]:
		if owned[0] {
			return 0, 0, nil
		}
		return newOut(bufferBytes(in(0)))

	case simReduce[op]:
		return s.reduceOp(node, owned)

	case op == compute.OpTypeWhere:
		// ops/where.go: reuse the owned onTrue, else the owned onFalse, when shaped as the output.
		switch {
		case in(1).Equal(node.shape) && owned[1]:
			return 0, 1, nil
		case in(2).Equal(node.shape) && owned[2]:
			return 0, 2, nil
		}
		return newOut(bufferBytes(node.shape))

	case op == compute.OpTypeReverse:
		// ops/reverse.go: with no axes, reuse the owned operand; else a new buffer.
		if !node.hasAxes {
			return 0, 0, fmt.Errorf("%w: Reverse node #%d carries no axes", ErrInternals, node.idx)
		}
		if len(node.axes) == 0 && owned[0] {
			return 0, 0, nil
		}
		return newOut(bufferBytes(in(0)))

	case op == compute.OpTypeBitcast:
		// ops/bitcast.go: reuse the owned operand when the flat slice's Go type serves the target: same width and
		// Go type, or different widths both stored as []uint8 (uint8 and the packed sub-byte types).
		src, dst := in(0).DType, node.shape.DType
		canReuse := src.GoType() == dst.GoType()
		if src.Bits() != dst.Bits() {
			canReuse = src.GoType() == reflect.TypeFor[uint8]() && dst.GoType().Kind() == reflect.Uint8
		}
		if owned[0] && canReuse {
			return 0, 0, nil
		}
		return newOut(bufferBytes(node.shape))

	case op == compute.OpTypeArgMinMax:
		// ops/argminmax.go: the output, then the running best values and their int32 indices, one per suffix
		// position, put back before the op returns.
		if node.argAxis < 0 {
			return 0, 0, fmt.Errorf("%w: ArgMinMax node #%d carries no axis", ErrInternals, node.idx)
		}
		b, r, err := newOut(bufferBytes(node.shape))
		operand := in(0)
		suffix := 1
		for _, d := range operand.Dimensions[node.argAxis+1:] {
			suffix *= d
		}
		s.scratch(bufferBytes(shapes.Make(operand.DType, suffix)) + bufferBytes(shapes.Make(dtypes.Int32, suffix)))
		return b, r, err

	case op == compute.OpTypeDotGeneral:
		// dot/dot.go execDotGeneral: a new output of the node's shape (float32 for half-precision inputs; the
		// builder adds the ConvertDType), then the registered kernel.
		d := node.dot
		if d == nil {
			return 0, 0, fmt.Errorf("%w: DotGeneral node #%d carries no dot.NodeData", ErrInternals, node.idx)
		}
		b, r, _ := newOut(bufferBytes(node.shape))
		err := s.matmul(d.impl, d.inputDType, d.outputDType, d.batchSize, d.lhsCrossSize, d.rhsCrossSize,
			d.contractingSize, d.lhsCache, d.rhsCache)
		return b, r, err

	case op == compute.OpTypeFusedDense:
		// fusedops/dense/dense.go: a new output of the node's shape (half-precision inputs compute into a float32
		// Go slice, not from the pool), then matmul.ExecuteWithEpilogue with the node's dot.NodeData (its panel
		// caches): the kernel registered for [rows, in] x weight, batch 1; bias and activation are applied to the
		// output in place.
		d := node.dense
		if d == nil {
			return 0, 0, fmt.Errorf("%w: FusedDense node #%d carries no data", ErrInternals, node.idx)
		}
		b, r, _ := newOut(bufferBytes(node.shape))
		inDT := in(0).DType
		outDT := accumulatorDType(inDT)
		err := s.matmul(matmulImplementation(inDT, outDT), inDT, outDT, 1, d.rows, d.out, d.in, d.lhsCache, d.rhsCache)
		return b, r, err

	case op == compute.OpTypeFusedScaledDotProductAttention:
		// fusedops/sdpa.go: in the BSHD layout a rank-4 mask and a rank-4 bias are first transposed into new pool
		// buffers that are never put back (upstream leaks them: they stay counted by the pool until the garbage
		// collector takes them); then a new output shaped as the query. Its scratch is Go slices, not the pool.
		sd := node.sdpa
		if sd == nil {
			return 0, 0, fmt.Errorf("%w: FusedScaledDotProductAttention node #%d carries no data", ErrInternals, node.idx)
		}
		next := 3
		if sd.hasMask {
			if m := in(next); sd.bshd && m.Rank() == 4 {
				s.keep(bufferBytes(m))
			}
			next++
		}
		if sd.hasSeqLens {
			next += 2
		}
		if sd.hasBias {
			if bs := in(next); sd.bshd && bs.Rank() == 4 {
				s.keep(bufferBytes(bs))
			}
		}
		return newOut(bufferBytes(in(0)))

	case op == compute.OpTypeFusedQuantizedDense:
		// fusedops/quantizeddense.go: the output, then sub-byte weights unpacked to int8/uint8 for the call (GGML
		// weights are uint8 and need no unpacking, quantizeddense_ggml.go).
		b, r, err := newOut(bufferBytes(node.shape))
		switch w := in(1); w.DType {
		case dtypes.Int4, dtypes.Int2:
			s.scratch(bufferBytes(shapes.Make(dtypes.Int8, w.Dimensions...)))
		case dtypes.Uint4, dtypes.Uint2:
			s.scratch(bufferBytes(shapes.Make(dtypes.Uint8, w.Dimensions...)))
		}
		return b, r, err

	case op == compute.OpTypeQuantizedEmbeddingLookup:
		// fusedops/quantizeddense.go: the output, then the indices converted to int64 unless they are.
		b, r, err := newOut(bufferBytes(node.shape))
		if idx := in(1); idx.DType != dtypes.Int64 {
			s.scratch(bufferBytes(shapes.Make(dtypes.Int64, idx.Dimensions...)))
		}
		return b, r, err

	case simNewOutput[op]:
		return newOut(bufferBytes(node.shape))
	}
	return 0, 0, fmt.Errorf("%w: the simulation does not model the executor of %s (node #%d)", ErrInternals, op, node.idx)
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
		return s.newOutputs(node), reused, nil

	case node.op == compute.OpTypeFusedDenseVJP && (len(node.multiShapes) == 2 || len(node.multiShapes) == 3):
		// fusedops/dense/dense_vjp.go: new buffers for dx, dweight (and dbias), then two products, one after the
		// other, each through matmul.ExecuteWithEpilogue without panel caches: dx = dz x weight and dweight from
		// x and dz (dz is dOutput, or the activation's gradient in a Go slice), both m x n x k multiply-adds with
		// batch 1, so they take the same kernel path and the same panels. Transposed copies and half-precision
		// float32 results are Go slices, not the pool.
		d := node.dense
		if d == nil {
			return nil, nil, fmt.Errorf("%w: FusedDenseVJP node #%d carries no data", ErrInternals, node.idx)
		}
		outs := s.newOutputs(node)
		inDT := s.x.nodes[node.inputs[len(node.inputs)-1]].shape.DType
		outDT := accumulatorDType(inDT)
		impl := matmulImplementation(inDT, outDT)
		for range 2 {
			if err := s.matmul(impl, inDT, outDT, 1, d.rows, d.in, d.out, goPanelCache{}, goPanelCache{}); err != nil {
				return nil, nil, err
			}
		}
		return outs, reused, nil
	}
	return nil, nil, fmt.Errorf("%w: the simulation does not model multi-output %s (node #%d)",
		ErrInternals, node.op, node.idx)
}

// newOutputs allocates a new buffer for each of a multi-output node's outputs, in order.
func (s *simulator) newOutputs(node *goNode) []int64 {
	outs := make([]int64, len(node.multiShapes))
	for i, ms := range node.multiShapes {
		outs[i] = bufferBytes(ms)
		s.alloc(outs[i])
	}
	return outs
}

// ---------------------------------------------------------------------------------------------------------------
// Reductions: ops/reduce.go (generic) and, in SIMD builds, ops/reduce_simd.go with the thresholds of
// reduce_thresholds.go / reduce_thresholds_amd64.go.
// ---------------------------------------------------------------------------------------------------------------

// Values of ops.ReducePattern.
const (
	reduceAll = iota
	reduceTrailing
	reduceLeading
	reduceMiddle
	reduceGeneral
)

// reduceThresholds is ops.ReduceThresholdsConfig: the smallest reduced size (B for trailing and leading
// reductions, A x B for all axes) at which the SIMD reduction runs, per dtype; 0 always (ThresholdNone),
// -1 never (ThresholdAlwaysFallBack), a dtype not listed always.
type reduceThresholds struct{ trailingMinB, leadingMinB, allMinN map[dtypes.DType]int }

// thresholdsFor returns the table the backend uses: AVX-512's when allowed, else AVX2's, else the portable one.
func thresholdsFor(b goBuild) reduceThresholds {
	f32, f64, bf16, f16 := dtypes.Float32, dtypes.Float64, dtypes.BFloat16, dtypes.Float16
	i8, u8, i16, u16 := dtypes.Int8, dtypes.Uint8, dtypes.Int16, dtypes.Uint16
	i32, u32, i64, u64 := dtypes.Int32, dtypes.Uint32, dtypes.Int64, dtypes.Uint64
	all := func(v int) map[dtypes.DType]int {
		m := map[dtypes.DType]int{}
		for _, dt := range []dtypes.DType{f32, f64, bf16, f16, i8, u8, i16, u16, i32, u32, i64, u64} {
			m[dt] = v
		}
		return m
	}
	with := func(m map[dtypes.DType]int, kv map[dtypes.DType]int) map[dtypes.DType]int {
		for k, v := range kv {
			m[k] = v
		}
		return m
	}
	switch {
	case b.avx512:
		return reduceThresholds{
			trailingMinB: with(all(0), map[dtypes.DType]int{f32: 12, i16: 24, u16: 24, i8: 48, u8: 48}),
			leadingMinB:  all(0), allMinN: all(0)}
	case b.avx2:
		return reduceThresholds{trailingMinB: with(all(0), map[dtypes.DType]int{i8: 24, u8: 24}),
			leadingMinB: all(0), allMinN: all(0)}
	}
	return reduceThresholds{
		trailingMinB: with(all(16), map[dtypes.DType]int{i32: 8, u32: 8, i64: 8, u64: 8, f16: 8}),
		leadingMinB:  with(all(8), map[dtypes.DType]int{bf16: 4, f16: 4}),
		allMinN:      all(8)}
}

// simdReduceRuns reports whether the SIMD reduction accepts the reduction (canExecuteReduceSIMD).
func simdReduceRuns(t reduceThresholds, r *goReduce, dt dtypes.DType) bool {
	below := func(m map[dtypes.DType]int, n int) bool {
		v, ok := m[dt]
		return ok && (v == -1 || (v > 0 && n < v))
	}
	switch {
	case !slices.Contains([]dtypes.DType{dtypes.Float32, dtypes.Float64, dtypes.Float16, dtypes.BFloat16,
		dtypes.Int32, dtypes.Uint32, dtypes.Int64, dtypes.Uint64, dtypes.Int8, dtypes.Uint8, dtypes.Int16,
		dtypes.Uint16}, dt):
		return false
	case r.pattern == reduceTrailing:
		return r.b > 1 && !below(t.trailingMinB, r.b)
	case r.pattern == reduceLeading:
		return r.a > 1 && !below(t.leadingMinB, r.b)
	case r.pattern == reduceAll:
		return r.a*r.b > 1 && !below(t.allMinN, r.a*r.b)
	}
	return false
}

// reduceOp models a reduction. SIMD builds register, for ReduceSum, ReduceMax, ReduceMin and ReduceProduct, a
// SIMD executor ahead of the generic one (executor 1 and 2; the node caches the one that succeeded).
//
//   - The SIMD executor, when it accepts the reduction, takes a new output and nothing else. For ReduceMax,
//     ReduceMin and ReduceProduct on int64/uint64 it accepts, takes the output, then finds no kernel and falls
//     back to the generic executor without putting the output back (upstream leaks it, once: the node then
//     caches the generic executor).
//   - The generic executor reuses the owned operand when nothing is reduced (no axes, or reduced axes of size
//     1), else copies it; otherwise a new output, plus, on bfloat16/float16, a float32 accumulator for
//     ReduceSum (of the kept axis for leading reductions, of the inner axes for middle ones, of the output for
//     general ones; none for trailing and all-axes sums) and for ReduceProduct (of the output).
func (s *simulator) reduceOp(node *goNode, owned []bool) (int64, int, error) {
	r := node.reduce
	if r == nil {
		return 0, 0, fmt.Errorf("%w: %s node #%d carries no ReduceConfig", ErrInternals, node.op, node.idx)
	}
	operand := s.x.nodes[node.inputs[0]].shape
	dt := operand.DType
	if len(r.axes) == 0 && operand.Rank() > 0 {
		return 0, 0, fmt.Errorf("%w: %s node #%d has no reduce axes", ErrInternals, node.op, node.idx)
	}
	out := bufferBytes(node.shape)
	env := goBackendEnv()
	hasSIMD := env.simdExecutors && (node.op == compute.OpTypeReduceSum || node.op == compute.OpTypeReduceMax ||
		node.op == compute.OpTypeReduceMin || node.op == compute.OpTypeReduceProduct)
	simd := hasSIMD && simdReduceRuns(thresholdsFor(env.goBuild), r, dt)
	leaks := simd && node.op != compute.OpTypeReduceSum && (dt == dtypes.Int64 || dt == dtypes.Uint64)
	generic := 1
	if hasSIMD {
		generic = 2
	}
	want := generic
	if simd && !leaks {
		want = 1
	}
	if node.cachedExecutor != 0 && node.cachedExecutor != want {
		return 0, 0, fmt.Errorf("%w: %s node #%d (%s, pattern %d, A=%d B=%d) cached executor %d, the model predicts %d",
			ErrInternals, node.op, node.idx, dt, r.pattern, r.a, r.b, node.cachedExecutor, want)
	}
	if simd && !leaks {
		s.alloc(out)
		return out, -1, nil
	}
	if leaks && node.cachedExecutor == 0 {
		s.keep(out)
	}
	if len(r.axes) == 0 || operand.Size() == node.shape.Size() {
		if owned[0] {
			return 0, 0, nil
		}
		s.alloc(out)
		return out, -1, nil
	}
	s.alloc(out)
	if dt == dtypes.BFloat16 || dt == dtypes.Float16 {
		acc := 0
		switch {
		case node.op == compute.OpTypeReduceProduct:
			acc = node.shape.Size()
		case node.op != compute.OpTypeReduceSum:
		case r.pattern == reduceLeading && r.a > 0 && r.b > 0:
			acc = r.b
		case r.pattern == reduceMiddle && r.a > 0 && r.b > 0 && r.c > 0:
			acc = r.c
		case r.pattern == reduceGeneral:
			acc = node.shape.Size()
		}
		if acc > 0 {
			s.scratch(bufferBytes(shapes.Make(dtypes.Float32, acc)))
		}
	}
	return out, -1, nil
}

// ---------------------------------------------------------------------------------------------------------------
// Matrix products: dot/matmul (nosimd_router.go, nosimd_large.go, nosimd_prepack.go; avx512/ and avx2/
// router.go and large.go with their generated half-precision and float64 variants).
// ---------------------------------------------------------------------------------------------------------------

// smallMatMulThreshold is matmul.SmallMatMulSizeThreshold: products with fewer multiply-adds take the small
// kernels, which use no pool buffers.
const smallMatMulThreshold = 4 * 1024 * 1024

// accumulatorDType is the output dtype the fused dense kernels compute in for input dtype dt.
func accumulatorDType(dt dtypes.DType) dtypes.DType {
	if dt == dtypes.Float64 {
		return dtypes.Float64
	}
	return dtypes.Float32
}

// matmulImplementation predicts dot.FindRegisteredImplementation's name for a product of in inputs into out
// outputs (either layout): AVX-512 over AVX2 over the portable kernels, each where registered; "" if none.
func matmulImplementation(in, out dtypes.DType) string {
	env := goBackendEnv()
	if !env.matmul {
		return ""
	}
	simdPair := (in == dtypes.Float32 || in == dtypes.BFloat16 || in == dtypes.Float16) && out == dtypes.Float32 ||
		in == dtypes.Float64 && out == dtypes.Float64
	switch {
	case simdPair && env.avx512:
		return "simd:avx512"
	case simdPair && env.avx2:
		return "simd:avx2"
	}
	// nosimd.go registers floats to floats, half precision to float32, and integers of one signedness to the
	// same dtype or to a 32- or 64-bit one.
	ints := func(dt dtypes.DType) bool {
		return slices.Contains([]dtypes.DType{dtypes.Int8, dtypes.Int16, dtypes.Int32, dtypes.Int64, dtypes.Uint8,
			dtypes.Uint16, dtypes.Uint32, dtypes.Uint64}, dt)
	}
	switch {
	case (in == dtypes.Float32 || in == dtypes.Float64) && (out == dtypes.Float32 || out == dtypes.Float64),
		(in == dtypes.BFloat16 || in == dtypes.Float16) && out == dtypes.Float32,
		ints(in) && ints(out) && in.IsUnsigned() == out.IsUnsigned() && (out == in || out.Bits() >= 32):
		return "simd:nosimd"
	}
	return ""
}

// matmulParams returns the kernel's panel parameters for input dtype dt and the number of output panels its
// accumulator holds: the portable kernels 64; the AVX-512 and AVX2 ones 16 on the calling goroutine and 64
// per worker on the pool.
func matmulParams(impl string, dt dtypes.DType, parallel bool) (p kernelParams, accumPanels int, err error) {
	env := goBackendEnv()
	var ok bool
	switch impl {
	case "simd:nosimd":
		return env.nosimd, 64, nil
	case "simd:avx512":
		p, ok = env.avx512Params[dt]
	case "simd:avx2":
		p, ok = env.avx2Params[dt]
	default:
		return p, 0, fmt.Errorf("%w: unknown matmul implementation %q", ErrInternals, impl)
	}
	if !ok {
		return p, 0, fmt.Errorf("%w: no %s panel sizes for input dtype %s", ErrInternals, impl, dt)
	}
	if parallel {
		return p, 64, nil
	}
	return p, 16, nil
}

// matmulLarge reports whether the router sends the product to the large (packing) kernel: when its
// multiply-adds reach smallMatMulThreshold, counting the whole batch (portable and AVX-512 routers) or one
// matrix of it (AVX2 router).
func matmulLarge(impl string, batch, m, n, k int) bool {
	size := int64(m) * int64(n) * int64(k)
	if impl != "simd:avx2" {
		size *= int64(batch)
	}
	return size >= smallMatMulThreshold
}

// prepackBytes is the pool buffer that packs a constant operand's panels once (nosimd_prepack.go, the
// Prepack functions of avx512/large.go and avx2/large.go): for each panel of `cross` rows (LHS, panel size Mc,
// register block Mr) or columns (RHS, Nc and Nr), its size rounded up to the register block, times the whole
// contracting size, for every batch item.
func prepackBytes(dt dtypes.DType, batch, cross, contracting, panel, block int) int64 {
	elems := 0
	for start := 0; start < cross; start += panel {
		w := min(panel, cross-start)
		elems += (w + block - 1) / block * block * contracting
	}
	return bufferBytes(shapes.Make(dt, batch*elems))
}

// matmul models the registered kernel impl on a [batch, m, k] x [batch, k, n] product of in inputs into out
// outputs. Small products take nothing from the pool. Large ones first fill the product's packed-panel caches
// the first time (a pool buffer per constant operand, kept by the graph for its lifetime), then each worker
// takes its panels (an LHS panel Mc x Kc unless the LHS is cached, an RHS panel Kc x Nc unless the RHS is, an
// output panel Mc x Nc and an accumulator of several output panels) and puts them back when the work runs out.
func (s *simulator) matmul(impl string, in, out dtypes.DType, batch, m, n, k int, lhsCache, rhsCache goPanelCache) error {
	if impl == "" {
		return fmt.Errorf("%w: no matmul implementation registered for %s -> %s", ErrUnsupported, in, out)
	}
	if !matmulLarge(impl, batch, m, n, k) {
		return nil
	}
	workers, parallel := s.x.largeMatmulWorkers()
	p, accum, err := matmulParams(impl, in, parallel)
	if err != nil {
		return err
	}
	for _, c := range []struct {
		cache              goPanelCache
		cross, panel, blck int
	}{{rhsCache, n, p.nc, p.nr}, {lhsCache, m, p.mc, p.mr}} {
		if !c.cache.present {
			continue
		}
		b := prepackBytes(in, batch, c.cross, k, c.panel, c.blck)
		switch c.cache.held {
		case 0:
			s.keep(b)
		case b:
		default:
			return fmt.Errorf("%w: a packed-panel cache holds %d bytes, the model computes %d", ErrInternals, c.cache.held, b)
		}
	}
	var panels int64
	if !lhsCache.present {
		panels += bufferBytes(shapes.Make(in, p.mc*p.kc))
	}
	if !rhsCache.present {
		panels += bufferBytes(shapes.Make(in, p.kc*p.nc))
	}
	panels += bufferBytes(shapes.Make(out, p.mc*p.nc)) + bufferBytes(shapes.Make(out, accum*p.mc*p.nc))
	if s.workers > 0 {
		workers = min(workers, s.workers)
	}
	s.scratch(int64(workers) * panels)
	return nil
}
