//go:build xla

package memory

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

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
	inc := filepath.Join(strings.TrimSpace(string(out)), "pjrt") // go-xla v0.4.1 (v0.1.4 had pkg/pjrt)
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
