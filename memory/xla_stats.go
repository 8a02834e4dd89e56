//go:build xla

package memory

import (
	"fmt"
	"reflect"

	"github.com/gomlx/go-xla/compute/xla"
	"github.com/gomlx/go-xla/pjrt"
	"github.com/gomlx/gomlx/core/graph"
)

// XLASizes are the sizes, in bytes, that XLA reports for a compiled program on its device
// (pjrt.ExecutableMemoryUsageStats of go-xla v0.4.1 to v0.4.13).
type XLASizes struct {
	// GeneratedCode is the size of the compiled code.
	GeneratedCode int64
	// Inputs is the size of the program's arguments.
	Inputs int64
	// Outputs is the size of the program's results.
	Outputs int64
	// Aliases is the size of the results that reuse (alias) argument buffers: donated inputs.
	Aliases int64
	// Temporary is the size of the temporaries XLA's buffer assignment allocates for the program.
	Temporary int64
}

// XLAProgramSizes returns the device memory sizes XLA computed when it compiled g (graph compiled on the XLA
// backend; builds with the xla tag only).
func XLAProgramSizes(g *graph.Graph) (sizes XLASizes, err error) {
	exe, err := compiledExecutable(g)
	if err != nil {
		return XLASizes{}, err
	}
	xe, ok := exe.(*xla.Executable)
	if !ok {
		return XLASizes{}, fmt.Errorf("memory: graph %q is compiled as %T, not for the XLA backend", g.Name(), exe)
	}
	defer func() {
		if r := recover(); r != nil {
			sizes, err = XLASizes{}, fmt.Errorf("%w: reading xla.Executable.exec: %v", ErrInternals, r)
		}
	}()
	// go-xla's compute/xla.Executable keeps the PJRT executable in an unexported field (go-xla v0.4.1 to
	// v0.4.13: exec *pjrt.LoadedExecutable; TestGoXLAFields checks it).
	f, err := privateField(reflect.ValueOf(xe).Elem(), "exec", reflect.TypeFor[*pjrt.LoadedExecutable]())
	if err != nil {
		return XLASizes{}, err
	}
	le := f.Interface().(*pjrt.LoadedExecutable)
	if le == nil {
		return XLASizes{}, fmt.Errorf("%w: the XLA executable was finalized", ErrNotCompiled)
	}
	st := le.OnDeviceMemoryUsageStats
	return XLASizes{GeneratedCode: st.GeneratedCode, Inputs: st.Inputs, Outputs: st.Outputs, Aliases: st.Aliases,
		Temporary: st.Temporary}, nil
}

// XLAProgramPeak returns the peak device memory of one execution of g as XLA planned it when compiling
// (MethodXLACompiled): Bytes = Inputs + Outputs - Aliases + Temporary, Resident = Inputs - Aliases (the arguments
// that are not donated). The generated code is not included (see XLAProgramSizes). Builds with the xla tag only.
func XLAProgramPeak(g *graph.Graph) (Peak, error) {
	s, err := XLAProgramSizes(g)
	if err != nil {
		return Peak{}, err
	}
	return Peak{Bytes: s.Inputs + s.Outputs - s.Aliases + s.Temporary, Resident: s.Inputs - s.Aliases,
		Method: MethodXLACompiled}, nil
}
