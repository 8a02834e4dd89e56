package cli_test

import (
	"maps"
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

// refusedOneLine runs args and checks what the probe's hidden rerun checks: a non-zero exit, stderr one line
// "finetune: ..." naming want (no panic, no stack), nothing on stdout, and every file under root unchanged with
// no new one.
func refusedOneLine(t *testing.T, root string, args []string, want string) {
	t.Helper()
	before := snapshot(t, root)
	stdout, stderr, code := run(t, args...)
	if code == 0 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.HasPrefix(stderr, "finetune: ") || !strings.Contains(stderr, want) || stdout != "" {
		t.Errorf("%v: exit %d, stdout %q, stderr:\n%s\nwant a non-zero exit and one line naming %q", args, code, stdout, stderr, want)
	}
	after := snapshot(t, root)
	for f, h := range before {
		if after[f] != h {
			t.Errorf("%v changed %s", args, f)
		}
	}
	for f := range after {
		if _, ok := before[f]; !ok {
			t.Errorf("%v wrote %s", args, f)
		}
	}
}

// TestExportNeverIntoManagedFolders (ex14, ex21 unclear; ex20, ex23 data loss): export refused --out RUN/best
// but suggested RUN/best/peft, and an export there (or in RUN/checkpoint-N/...) was deleted without a word when
// best/ improved or the checkpoint was pruned. Now every --out in a folder training manages (best/, checkpoint-N/,
// adapter/, a checkpoint anywhere), of every format, is refused in one line suggesting RUN/exports/..., and an
// export there survives the run going on. (ow03, ow05) export --overwrite removes an earlier export of either
// format: a merged export over a PEFT one left adapter_config.json beside config.json.
func TestExportNeverIntoManagedFolders(t *testing.T) {
	tmp, model, data := vitFixture(t)
	out := filepath.Join(tmp, "run")
	if _, stderr, code := run(t, "train", "--model", model, "--data", data, "--out", out, "--steps", "2", "--batch-size", "4",
		"--eval-split", "0.25", "--eval-every", "1", "--checkpoint-every", "1", "--keep-checkpoints", "1"); code != 0 {
		t.Fatalf("train: exit %d\n%s", code, stderr)
	}
	best, ckpt := filepath.Join(out, "best"), filepath.Join(out, "checkpoint-2")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--checkpoint", "best", "--out", filepath.Join(best, "peft")}, "--out " + filepath.Join(best, "peft") + " lies in " + best + ", the run's best checkpoint, which the run replaces whenever its validation loss improves: anything written there is lost; write to e.g. " + filepath.Join(out, "exports", "peft-best")},
		{[]string{"--checkpoint", "best", "--out", best}, "is the run's best checkpoint"},
		{[]string{"--format", "merged", "--out", filepath.Join(ckpt, "mine")}, "lies in " + ckpt + ", a checkpoint of the run, which pruning (--keep-checkpoints) or --overwrite deletes: anything written there is lost; write to e.g. " + filepath.Join(out, "exports", "merged")},
		{[]string{"--checkpoint", "2", "--out", ckpt}, "write to e.g. " + filepath.Join(out, "exports", "peft-2")},
		{[]string{"--out", filepath.Join(out, "adapter", "x")}, "the run's adapter folder, which the run rewrites when it ends"},
		{[]string{"--format", "gguf", "--checkpoint", "best", "--out", filepath.Join(best, "model.gguf")}, "write to e.g. " + filepath.Join(out, "exports", "model.gguf") + " (make the folder first: mkdir " + filepath.Join(out, "exports") + ")"},
		{[]string{"--format", "merged", "--out", out}, "is a training output folder (it holds run.yaml): export to a folder of its own, e.g. " + filepath.Join(out, "exports", "merged")},
	} {
		refusedOneLine(t, tmp, append([]string{"export", "--run", out}, c.args...), c.want)
	}
	// The suggested folder takes the export, and keeps it while the run goes on (best/ replaced, checkpoints pruned).
	mine := filepath.Join(out, "exports", "peft-best")
	if _, stderr, code := run(t, "export", "--run", out, "--checkpoint", "best", "--out", mine); code != 0 {
		t.Fatalf("export into RUN/exports: exit %d\n%s", code, stderr)
	}
	kept := snapshot(t, mine)
	if _, stderr, code := run(t, "train", "--out", out, "--resume", "--steps", "4"); code != 0 {
		t.Fatalf("resume: exit %d\n%s", code, stderr)
	}
	if after := snapshot(t, mine); len(after) != 2 || !maps.Equal(after, kept) {
		t.Errorf("the export in RUN/exports changed with the run: %v, was %v", after, kept)
	}
	// ow03, ow05: --overwrite replaces an export of the other format whole.
	x := filepath.Join(tmp, "x")
	if _, stderr, code := run(t, "export", "--run", out, "--out", x); code != 0 {
		t.Fatalf("peft: %s", stderr)
	}
	if _, stderr, code := run(t, "export", "--run", out, "--format", "merged", "--out", x); code != 2 || !strings.Contains(stderr, "already holds an export (adapter_") {
		t.Errorf("merged over peft without --overwrite: exit %d\n%s", code, stderr)
	}
	if _, stderr, code := run(t, "export", "--run", out, "--format", "merged", "--out", x, "--overwrite"); code != 0 {
		t.Fatalf("merged --overwrite: %s", stderr)
	}
	for _, f := range []string{"adapter_config.json", "adapter_model.safetensors"} {
		if _, err := os.Stat(filepath.Join(x, f)); err == nil {
			t.Errorf("merged --overwrite left the PEFT export's %s", f)
		}
	}
	if _, stderr, code := run(t, "export", "--run", out, "--out", x, "--overwrite"); code != 0 {
		t.Fatalf("peft --overwrite: %s", stderr)
	}
	for _, f := range []string{"config.json", "model.safetensors", "preprocessor_config.json"} {
		if _, err := os.Stat(filepath.Join(x, f)); err == nil {
			t.Errorf("peft --overwrite left the merged export's %s", f)
		}
	}
}
