//go:build xla

package engine

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestPreloadLibrariesInRounds builds libdep.so and libuser.so (which needs libdep.so, in a folder the loader
// does not search) and preloads them user first: the first round fails on the missing dependency, the second
// loads both. A file that is not a library is reported as failed.
func TestPreloadLibrariesInRounds(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("needs gcc")
	}
	dir := t.TempDir()
	write := func(name, src string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	dep := filepath.Join(dir, "libmemfitdep.so")
	user := filepath.Join(dir, "libmemfituser.so")
	run := func(args ...string) {
		if out, err := exec.Command("gcc", args...).CombinedOutput(); err != nil {
			t.Fatalf("gcc %v: %v\n%s", args, err, out)
		}
	}
	run("-shared", "-fPIC", "-Wl,-soname,libmemfitdep.so", "-o", dep, write("dep.c", "int memfit_dep(void) { return 42; }\n"))
	run("-shared", "-fPIC", "-o", user, write("user.c", "int memfit_dep(void);\nint memfit_user(void) { return memfit_dep() + 1; }\n"),
		"-L"+dir, "-lmemfitdep")
	bogus := write("libbogus.so", "not a library")
	failed, err := PreloadLibraries([]string{user, dep, bogus})
	if len(failed) != 1 || failed[0] != bogus || err == nil {
		t.Errorf("failed %v (%v), want only %s", failed, err, bogus)
	}
}
