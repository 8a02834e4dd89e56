package engine_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/engine"
)

func TestParseSpec(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		err      string
	}{
		{"", "go", ""},
		{"go", "go", ""},
		{"go:dotgeneral_large", "go:dotgeneral_large", ""},
		{"xla:cuda", "xla:cuda", ""},
		{"xla:/opt/pjrt/pjrt_c_api_cuda_plugin.so", "xla:/opt/pjrt/pjrt_c_api_cuda_plugin.so", ""},
		{"xla:cuda,tf32=false", "xla:cuda,tf32=false", ""},
		{"xla:cuda,", "xla:cuda", ""},
		{"xla:/opt/x/xla_cuda_plugin.so,notf32,allocator=cuda_async", "xla:/opt/x/xla_cuda_plugin.so,notf32,allocator=cuda_async", ""},
		{"xla:,tf32=false", "", "name the XLA plugin"},
		{"xla", "", "name the XLA plugin"},
		{"xla:lib/plugin.so", "", "must be absolute"},
		{"tpu", "", "unknown backend"},
	} {
		s, err := engine.ParseSpec(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseSpec(%q) error %v, want one containing %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || s.String() != tc.want {
			t.Errorf("ParseSpec(%q) = %q, %v; want %q", tc.in, s, err, tc.want)
		}
	}
}

// TestXLAConfig: go-xla's configuration string puts memfit's preallocation choice (off, on with
// MEMFIT_XLA_PREALLOCATE=1) before the spec's options for a CUDA plugin, unless the options set it themselves.
func TestXLAConfig(t *testing.T) {
	const p = "/site/jax_plugins/xla_cuda13/xla_cuda_plugin.so"
	for _, tc := range []struct {
		options string
		cuda    bool
		env     string
		want    string
	}{
		{"", true, "", p + ",preallocate=false"},
		{"", true, "1", p + ",preallocate=true"},
		{"", true, "TRUE", p + ",preallocate=true"},
		{"", true, "0", p + ",preallocate=false"},
		{"tf32=false", true, "", p + ",preallocate=false,tf32=false"},
		{"preallocate,memory_fraction=0.5", true, "", p + ",preallocate,memory_fraction=0.5"},
		{"nopreallocate", true, "1", p + ",nopreallocate"},
		{"", false, "1", p},
		{"notf32", false, "", p + ",notf32"},
	} {
		if got := engine.XLAConfigForTest(p, tc.options, tc.cuda, tc.env); got != tc.want {
			t.Errorf("xlaConfig(%q, cuda %v, env %q) = %q, want %q", tc.options, tc.cuda, tc.env, got, tc.want)
		}
	}
}

func TestChooseSpec(t *testing.T) {
	t.Setenv(engine.BackendEnv, "xla:cuda")
	if got := engine.ChooseSpec("go"); got != "go" {
		t.Errorf("flag must win over the environment, got %q", got)
	}
	if got := engine.ChooseSpec(""); got != "xla:cuda" {
		t.Errorf("environment must be used without a flag, got %q", got)
	}
	t.Setenv(engine.BackendEnv, "")
	if got := engine.ChooseSpec(""); got != engine.DefaultBackend {
		t.Errorf("default %q, got %q", engine.DefaultBackend, got)
	}
}

// TestMissingPluginIsOneLineError: an XLA plugin that is not there fails fast with one line that says how to
// point at one, whether or not this build links XLA; nothing is downloaded.
func TestMissingPluginIsOneLineError(t *testing.T) {
	empty := t.TempDir()
	t.Setenv("PJRT_PLUGIN_LIBRARY_PATH", empty)
	t.Setenv("LD_LIBRARY_PATH", "")
	t.Setenv("HOME", empty)
	for _, spec := range []string{"xla:cuda", "xla:" + filepath.Join(empty, "nope.so")} {
		_, err := engine.NewBackend(spec)
		if err == nil {
			t.Fatalf("%s: no error", spec)
		}
		msg := err.Error()
		if strings.Contains(msg, "\n") {
			t.Errorf("%s: error spans several lines: %q", spec, msg)
		}
		if !strings.Contains(msg, "not found") {
			t.Errorf("%s: error does not say the plugin is missing: %q", spec, msg)
		}
	}
	_, err := engine.NewBackend("xla:cuda")
	if !strings.Contains(err.Error(), "PJRT_PLUGIN_LIBRARY_PATH") {
		t.Errorf("error does not say how to point at a plugin: %q", err)
	}
	if entries, _ := os.ReadDir(empty); len(entries) != 0 {
		t.Errorf("something was written (downloaded?) into the search folder: %v", entries)
	}
}

// TestDefaultBackendIsSequentialPureGo: the default is the pure-Go backend.
func TestDefaultBackendIsSequentialPureGo(t *testing.T) {
	b, err := engine.NewBackend("")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Finalize()
	if b.String() != "go" {
		t.Errorf("default backend is %q (%s), want the pure-Go backend \"go\"", b.String(), b.Name())
	}
	if _, err := engine.NewBackend("go:not_an_option"); err == nil {
		t.Error("a bad pure-Go option was accepted")
	}
}

// TestFMAWorkaround: WithFMAWorkaround adds cpu.fma=off to GODEBUG (keeping other settings), and this test binary
// itself, started through gtest.Main, runs with it whenever the vector kernels are in use (the restart worked).
func TestFMAWorkaround(t *testing.T) {
	got := engine.WithFMAWorkaround([]string{"HOME=/x", "GODEBUG=gctrace=0"})
	if strings.Join(got, " ") != "HOME=/x GODEBUG=gctrace=0,cpu.fma=off" {
		t.Errorf("WithFMAWorkaround kept/added %q", got)
	}
	if got := engine.WithFMAWorkaround([]string{"HOME=/x"}); strings.Join(got, " ") != "HOME=/x GODEBUG=cpu.fma=off" {
		t.Errorf("WithFMAWorkaround without GODEBUG gave %q", got)
	}
	if engine.FMAWorkaround() {
		t.Errorf("the test binary runs %s kernels without GODEBUG=cpu.fma=off (GODEBUG=%q): gtest.Main did not restart it",
			engine.SIMD(), os.Getenv("GODEBUG"))
	}
	if engine.SIMD() != "" && !strings.Contains(os.Getenv("GODEBUG"), "cpu.fma=off") {
		t.Errorf("vector kernels in use but GODEBUG=%q", os.Getenv("GODEBUG"))
	}
}
