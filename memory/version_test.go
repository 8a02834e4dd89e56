package memory

import (
	"errors"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
)

// TestComputeVersionPinned fails, naming both versions, when go.mod moves github.com/gomlx/compute away from
// the version the executor model (gobackend_v0_1_14.go) was written for: re-read the new version's
// internal/gobackend and write its model before moving.
func TestComputeVersionPinned(t *testing.T) {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		t.Fatal("the test binary has no build info")
	}
	v, replacedBy, known := computeIn(info)
	if !known {
		t.Fatalf("the test binary's build info lists no %s", computeModule)
	}
	if v != modelledCompute {
		t.Fatalf("go.mod builds memfit with %s %s, but the executor model in gobackend_v0_1_14.go reads %s: every "+
			"Go backend peak would be unavailable; model the new executor first", computeModule, v, modelledCompute)
	}
	if replacedBy != "" {
		t.Errorf("memfit's go.mod replaces %s (by %s): it must not", computeModule, replacedBy)
	}
	if err := checkComputeVersion(); err != nil {
		t.Errorf("checkComputeVersion: %v", err)
	}
}

// TestComputeIn reads the compute version out of build info, replaced or not.
func TestComputeIn(t *testing.T) {
	dep := func(v string, r *debug.Module) *debug.Module {
		return &debug.Module{Path: computeModule, Version: v, Replace: r}
	}
	for _, c := range []struct {
		deps  []*debug.Module
		v, by string
		known bool
	}{
		{[]*debug.Module{{Path: "other", Version: "v1"}, dep("v0.1.14", nil)}, "v0.1.14", "", true},
		{[]*debug.Module{dep("v0.1.14", &debug.Module{Path: "./third_party/compute"})}, "v0.1.14", "./third_party/compute", true},
		{[]*debug.Module{dep("v0.1.14", &debug.Module{Path: "./third_party/compute", Version: "(devel)"})}, "v0.1.14",
			"./third_party/compute", true},
		{[]*debug.Module{dep("v0.1.14", &debug.Module{Path: "example.com/fork", Version: "v0.1.15"})}, "v0.1.15",
			"example.com/fork@v0.1.15", true},
		{[]*debug.Module{{Path: "other", Version: "v1"}}, "", "", false},
	} {
		v, by, known := computeIn(&debug.BuildInfo{Deps: c.deps})
		if v != c.v || by != c.by || known != c.known {
			t.Errorf("computeIn(%v) = %q %q %v, want %q %q %v", c.deps, v, by, known, c.v, c.by, c.known)
		}
	}
}

// TestComputeVersionFence: on any other compute version, nothing is read and every figure says why.
func TestComputeVersionFence(t *testing.T) {
	g := compileGraph(t, "", []shapes.Shape{f32(256)}, func(g *graph.Graph, p []*graph.Node) []*graph.Node {
		return []*graph.Node{graph.Exp(p[0])}
	})
	restore := SetComputeVersionForTest("v0.1.15")
	defer restore()
	const want = "modelled for compute v0.1.14, running v0.1.15"
	_, err := SimulatePeak(g, SimOptions{})
	var cv *ComputeVersionError
	if !errors.Is(err, ErrComputeVersion) || !errors.As(err, &cv) || err.Error() != want || cv.Running != "v0.1.15" {
		t.Errorf("SimulatePeak on another compute version: %v, want %q (ErrComputeVersion)", err, want)
	}
	if _, err := MeasurePeak(g, func() error { return nil }); !errors.Is(err, ErrComputeVersion) {
		t.Errorf("MeasurePeak: %v", err)
	}
	for name, f := range map[string]func() error{
		"ExecutorEstimate": func() error { _, err := ExecutorEstimate(g); return err },
		"MatmulOps":        func() error { _, err := MatmulOps(g); return err },
		"SimulateTimeline": func() error { _, _, err := SimulateTimeline(g, SimOptions{}); return err },
	} {
		if err := f(); !errors.Is(err, ErrComputeVersion) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v", name, err)
		}
	}
	restore()
	if _, err := SimulatePeak(g, SimOptions{}); err != nil {
		t.Errorf("after restoring the version: %v", err)
	}
}

// TestUnavailablePeak: an unavailable peak keeps its reason and never formats as a byte count.
func TestUnavailablePeak(t *testing.T) {
	p := UnavailablePeak(&ComputeVersionError{Modelled: modelledCompute, Running: "v0.1.15"})
	if p.Bytes != 0 || string(p.Method) != "unavailable: modelled for compute v0.1.14, running v0.1.15" {
		t.Errorf("UnavailablePeak: %+v", p)
	}
	if got := FormatPeak(p.Bytes, string(p.Method)); got != "unavailable (modelled for compute v0.1.14, running v0.1.15)" {
		t.Errorf("FormatPeak of an unavailable peak: %q", got)
	}
	if got := FormatPeak(3<<20, string(MethodSimulation)); got != FormatBytes(3<<20) {
		t.Errorf("FormatPeak of a simulated peak: %q", got)
	}
	if _, ok := MethodSimulation.Unavailable(); ok {
		t.Errorf("the simulation's method reads as unavailable")
	}
	if got := FormatPeakCell(p.Bytes, string(p.Method), 1); got != "unavailable" {
		t.Errorf("FormatPeakCell: %q", got)
	}
	sim := string(MethodSimulation)
	for _, c := range []struct {
		over  int64
		overM string
		b     int64
		m     string
		want  int64
		wantM string
	}{
		{0, "", 5, sim, 5, sim},
		{5, sim, 3, sim, 5, sim},
		{5, sim, 0, string(p.Method), 0, string(p.Method)},
		{0, string(p.Method), 9, sim, 0, string(p.Method)},
		{0, "", 0, string(p.Method), 0, string(p.Method)},
	} {
		if b, m := LargerPeak(c.over, c.overM, c.b, c.m); b != c.want || m != c.wantM {
			t.Errorf("LargerPeak(%d, %q, %d, %q) = %d, %q", c.over, c.overM, c.b, c.m, b, m)
		}
	}
}
