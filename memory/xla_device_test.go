//go:build xla

package memory

import (
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/gomlx/go-xla/compute/xla"
	"github.com/gomlx/go-xla/pjrt"
)

// TestGoXLAFields checks, without a plugin, that go-xla's unexported fields which XLADeviceStats and
// XLAProgramSizes read are still there with the types they expect (go-xla v0.4.13): the backend's client, a
// device's C pointer and plugin, the plugin's API table, and the executable's PJRT executable.
func TestGoXLAFields(t *testing.T) {
	for _, tc := range []struct {
		v    any
		name string
		want reflect.Type // nil: any pointer
	}{
		{&xla.Backend{}, "client", reflect.TypeFor[*pjrt.Client]()},
		{&pjrt.Device{}, "cDevice", nil},
		{&pjrt.Device{}, "plugin", reflect.TypeFor[*pjrt.Plugin]()},
		{&pjrt.Plugin{}, "api", nil},
		{&xla.Executable{}, "exec", reflect.TypeFor[*pjrt.LoadedExecutable]()},
	} {
		f, err := privateField(reflect.ValueOf(tc.v).Elem(), tc.name, tc.want)
		if err != nil {
			t.Errorf("%T.%s: %v", tc.v, tc.name, err)
			continue
		}
		if f.Kind() != reflect.Pointer {
			t.Errorf("%T.%s is %s, want a pointer", tc.v, tc.name, f.Type())
		}
	}
	if _, ok := reflect.TypeFor[pjrt.LoadedExecutable]().FieldByName("OnDeviceMemoryUsageStats"); !ok {
		t.Error("pjrt.LoadedExecutable has no OnDeviceMemoryUsageStats")
	}
}

// TestDeviceStatsLayout compiles a C program against the PJRT header that go-xla vendors and checks that memfit's
// mirror of PJRT_Device_MemoryStats_Args has the same size and member offsets (the plugin writes into it).
func TestDeviceStatsLayout(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("needs gcc")
	}
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/gomlx/go-xla").Output()
	if err != nil {
		t.Skipf("go-xla's source is not at hand: %v", err)
	}
	inc := filepath.Join(strings.TrimSpace(string(out)), "pjrt") // go-xla v0.4.x (v0.1.4 had pkg/pjrt)
	want := statsLayout()
	var src strings.Builder
	src.WriteString("#include <stdio.h>\n#include <stddef.h>\n#include \"pjrt_c_api.h\"\nint main(void) {\n")
	src.WriteString("  printf(\"struct_size %zu\\n\", (size_t)PJRT_Device_MemoryStats_Args_STRUCT_SIZE);\n")
	for name := range want {
		if name != "struct_size" {
			src.WriteString("  printf(\"" + name + " %zu\\n\", offsetof(PJRT_Device_MemoryStats_Args, " + name + "));\n")
		}
	}
	src.WriteString("  return 0;\n}\n")
	dir := t.TempDir()
	c, bin := filepath.Join(dir, "layout.c"), filepath.Join(dir, "layout")
	if err := os.WriteFile(c, []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("gcc", "-I"+inc, "-o", bin, c).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, out)
	}
	got, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(got)), "\n") {
		name, v, _ := strings.Cut(line, " ")
		n, _ := strconv.Atoi(v)
		if uintptr(n) != want[name] {
			t.Errorf("%s: PJRT header %d, memfit's mirror %d", name, n, want[name])
		}
	}
}
