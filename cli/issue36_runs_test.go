package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Issue 36 (the reliability probe of 2026-11-27, ../shared/notes/probe-2026-11-27.md): runs, resume, exports and
// the planner. Each test names the probe's case ids.

// runWithin is run with a deadline: a command that hangs fails the test instead of the whole test binary.
func runWithin(t *testing.T, limit time.Duration, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	type result struct {
		out, err string
		code     int
	}
	done := make(chan result, 1)
	go func() {
		o, e, c := run(t, args...)
		done <- result{o, e, c}
	}()
	select {
	case r := <-done:
		return r.out, r.err, r.code
	case <-time.After(limit):
		t.Fatalf("%v did not finish in %v (a hang)", args, limit)
	}
	return "", "", 0
}

// TestCalibrationCacheNeverBlocksPlanning (pc07 hang, pc06, ro05): a calibration cache that is a link to
// /dev/zero was read without a bound (memory --plan hung, its memory growing); one that is a folder, or a cache
// folder that cannot be created, failed the plan after computing it. Now the plan is made, with one warning
// saying the cache was not used or not written, and the cache path is left as it was.
func TestCalibrationCacheNeverBlocksPlanning(t *testing.T) {
	args := []string{"memory", "--model", "vit:tiny", "--num-labels", "10", "--lora-targets", "q,v", "--train-modules", "classifier",
		"--batch-size", "4", "--budget", "1.2MiB", "--plan"}
	zero := t.TempDir()
	if err := os.MkdirAll(filepath.Join(zero, "memfit"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/zero", filepath.Join(zero, "memfit", "calibration.json")); err != nil {
		t.Fatal(err)
	}
	folder := t.TempDir()
	if err := os.MkdirAll(filepath.Join(folder, "memfit", "calibration.json"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, cache, want string }{
		{"pc07 /dev/zero", zero, "the calibration cache cannot be read (" + filepath.Join(zero, "memfit", "calibration.json") + " is a character device"},
		{"pc06 folder", folder, "the calibration cache cannot be read (" + filepath.Join(folder, "memfit", "calibration.json") + " is a folder"},
		{"ro05 uncreatable", "/proc/nope", "warning: the step times were not cached (mkdir /proc/nope"},
	} {
		t.Setenv("XDG_CACHE_HOME", c.cache)
		out, stderr, code := runWithin(t, 60*time.Second, args...)
		if code != 0 || !strings.Contains(out, "plan: ") {
			t.Errorf("%s: exit %d, no plan:\n%s%s", c.name, code, out, stderr)
		}
		if !strings.Contains(stderr, c.want) {
			t.Errorf("%s: stderr lacks %q:\n%s", c.name, c.want, stderr)
		}
	}
	if l, err := os.Readlink(filepath.Join(zero, "memfit", "calibration.json")); err != nil || l != "/dev/zero" {
		t.Errorf("the link was changed: %q, %v", l, err)
	}
	if st, err := os.Stat(filepath.Join(folder, "memfit", "calibration.json")); err != nil || !st.IsDir() {
		t.Errorf("the folder was changed: %v", err)
	}
}
