package cli_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/memfit/memfit/cli"
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
// folder that cannot be created, failed the plan after computing it. Now a cache that no cache can be (a device,
// a file larger than any cache) is refused at once in one line, the link left as it was; a folder at its path or
// an uncreatable cache folder: the plan is made, with one warning saying the times were not cached.
func TestCalibrationCacheNeverBlocksPlanning(t *testing.T) {
	args := []string{"memory", "--model", "vit:tiny", "--num-labels", "10", "--lora-targets", "q,v", "--train-modules", "classifier",
		"--batch-size", "4", "--budget", "1.2MiB", "--plan"}
	zero := t.TempDir()
	cache := filepath.Join(zero, "memfit", "calibration.json")
	if err := os.MkdirAll(filepath.Dir(cache), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/zero", cache); err != nil {
		t.Fatal(err)
	}
	t.Setenv("XDG_CACHE_HOME", zero)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// (the link is not snapshotted: reading it is the hang)
		refusedOneLine(t, t.TempDir(), args, "the calibration cache cannot be used: "+cache+" is a character device, not a regular file")
		tmp, model, data := vitFixture(t)
		refusedOneLine(t, tmp, []string{"train", "--model", model, "--data", data, "--out", filepath.Join(tmp, "run"), "--steps", "1",
			"--batch-size", "4", "--budget", "64MiB"}, "the calibration cache cannot be used: "+cache+" is a character device")
	}()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("memory --plan with a cache linked to /dev/zero did not finish (a hang)")
	}
	if l, err := os.Readlink(cache); err != nil || l != "/dev/zero" {
		t.Errorf("the link was changed: %q, %v", l, err)
	}
	folder := t.TempDir()
	if err := os.MkdirAll(filepath.Join(folder, "memfit", "calibration.json"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, cache, want string }{
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
	tmp, _, _, out := vitRun(t, "--steps", "2", "--batch-size", "4", "--eval-split", "0.25", "--eval-every", "1", "--checkpoint-every", "1", "--keep-checkpoints", "1")
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

// vitRun trains, in a new folder of vitFixture's (returned with its model, data and the run folder), the tiny
// ViT with train's extra flags.
func vitRun(t *testing.T, extra ...string) (tmp, model, data, out string) {
	t.Helper()
	tmp, model, data = vitFixture(t)
	out = filepath.Join(tmp, "run")
	if _, stderr, code := run(t, append([]string{"train", "--model", model, "--data", data, "--out", out}, extra...)...); code != 0 {
		t.Fatalf("train: exit %d\n%s", code, stderr)
	}
	return tmp, model, data, out
}

// trainedStep returns the step a checkpoint folder's trainer_state.json records.
func trainedStep(t *testing.T, dir string) int {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "trainer_state.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s struct {
		Step int `json:"step"`
	}
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	return s.Step
}

// replaceWith makes dir a copy of the folder from (files only, one level and init-adapter below).
func replaceWith(t *testing.T, from, dir string) {
	t.Helper()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	copyTree(t, from, dir)
}

// TestBestNeverAheadOfTheRun (k8r, k8e): validation wrote best/ before the checkpoint of the same step, so a kill
// between the two left best/ at step 2 and latest at checkpoint-1; `--resume --steps 1` then reported the best
// as step 1 while best/ (and export --checkpoint best) held step 2. Now an evaluation that improves writes its
// checkpoint first and copies it to best/, and a resume makes best/ agree with the resumed checkpoint: restored
// from it when it is itself the best (both the old kill and a kill between the new order's two writes).
func TestBestNeverAheadOfTheRun(t *testing.T) {
	tmp, _, _, out := vitRun(t, "--steps", "2", "--batch-size", "4", "--eval-split", "0.25", "--eval-every", "1", "--lr", "0.003", "--train-modules", "classifier")
	// Every evaluation improved (the training and held-out examples share their labels' pattern): checkpoint-1 was
	// written by its evaluation though --checkpoint-every is 0.
	best := filepath.Join(out, "best")
	if got := trainedStep(t, best); got != 2 {
		t.Fatalf("best/ holds step %d, want 2 (the test needs every evaluation to improve)", got)
	}
	for _, c := range []string{"checkpoint-1", "checkpoint-2"} {
		if _, err := os.Stat(filepath.Join(out, c, "trainer_state.json")); err != nil {
			t.Fatalf("%s was not written by its improving evaluation: %v", c, err)
		}
	}
	// The probe's kill: best/ at step 2, checkpoint-2 not written, latest at checkpoint-1.
	os.RemoveAll(filepath.Join(out, "checkpoint-2"))
	os.WriteFile(filepath.Join(out, "latest"), []byte("checkpoint-1\n"), 0o644)
	stdout, stderr, code := run(t, "train", "--out", out, "--resume", "--steps", "1")
	if code != 0 {
		t.Fatalf("resume: exit %d\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "note: "+best+" held step 2, not the best evaluation the resumed checkpoint records (step 1, this checkpoint): restored from "+filepath.Join(out, "checkpoint-1")) {
		t.Errorf("no note of best/ restored:\n%s", stderr)
	}
	if got := trainedStep(t, best); got != 1 || !strings.Contains(stdout, "at step 1) in "+best) {
		t.Errorf("best/ holds step %d after the resume:\n%s", got, stdout)
	}
	exp := filepath.Join(tmp, "exp")
	if stdout, stderr, code := run(t, "export", "--run", out, "--checkpoint", "best", "--out", exp); code != 0 || !strings.Contains(stdout, "step 1)") {
		t.Errorf("export --checkpoint best: exit %d\n%s%s", code, stdout, stderr)
	}
	// The new order's kill: checkpoint-2 (best at step 2) and latest written, best/ still at step 1.
	if _, stderr, code := run(t, "train", "--out", out, "--resume", "--steps", "2"); code != 0 {
		t.Fatalf("resume to 2: exit %d\n%s", code, stderr)
	}
	replaceWith(t, filepath.Join(out, "checkpoint-1"), best)
	_, stderr, code = run(t, "train", "--out", out, "--resume", "--steps", "2")
	if code != 0 || !strings.Contains(stderr, "held step 1, not the best evaluation the resumed checkpoint records (step 2") || trainedStep(t, best) != 2 {
		t.Errorf("best/ not restored from checkpoint-2: exit %d\n%s", code, stderr)
	}
}

// TestRunWithOnlyBestResumes (bk1r, bk1n): with the default --checkpoint-every 0 and --eval-every, a run killed
// after an evaluation had only best/: --resume failed ("open RUN/latest: no such file"), a rerun said "continue
// it with --resume", and only --overwrite got out, deleting best/. Now every improving evaluation writes the
// step's checkpoint (so latest exists: TestBestNeverAheadOfTheRun), and a folder with only best/ (from an older
// memfit) resumes from best/, saying so.
func TestRunWithOnlyBestResumes(t *testing.T) {
	_, _, _, out := vitRun(t, "--steps", "1", "--batch-size", "4", "--eval-split", "0.25", "--eval-every", "1")
	for _, f := range []string{"checkpoint-1", "latest", "adapter"} {
		os.RemoveAll(filepath.Join(out, f))
	}
	_, stderr, code := run(t, "train", "--out", out, "--resume", "--steps", "2")
	if code != 0 || !strings.Contains(stderr, "note: "+out+" has no latest checkpoint (the run was stopped before writing one): resuming from its best checkpoint "+filepath.Join(out, "best")+" (step 1)") {
		t.Fatalf("resume from best/: exit %d\n%s", code, stderr)
	}
	if got := trainedStep(t, filepath.Join(out, "checkpoint-2")); got != 2 {
		t.Errorf("the resumed run's last checkpoint is at step %d", got)
	}
}

// TestResumeRefusesChangedValidationSet (rs01): the validation set was not fingerprinted: replaced between runs,
// --resume accepted it and chose the best checkpoint by comparing losses from two sets. Now it is refused as
// changed training data is, naming --eval-data, and nothing in the run changes.
func TestResumeRefusesChangedValidationSet(t *testing.T) {
	tmp, model, data := vitFixture(t)
	eval := filepath.Join(tmp, "eval.safetensors")
	writeMislabelled(t, eval, 9)
	out := filepath.Join(tmp, "run")
	if _, stderr, code := run(t, "train", "--model", model, "--data", data, "--eval-data", eval, "--out", out, "--steps", "1",
		"--batch-size", "4", "--eval-every", "1"); code != 0 {
		t.Fatalf("train: exit %d\n%s", code, stderr)
	}
	orig, _ := os.ReadFile(eval)
	writeMislabelled(t, eval, 6)
	refusedOneLine(t, tmp, []string{"train", "--out", out, "--resume", "--steps", "2"},
		"--eval-data "+eval+": the data differs from the checkpoint's: it had 9 validation examples, the data now has 6")
	changed := append([]byte(nil), orig...)
	changed[len(changed)-100] ^= 1
	os.WriteFile(eval, changed, 0o644)
	refusedOneLine(t, tmp, []string{"train", "--out", out, "--resume", "--steps", "2"}, "the same number of validation examples (9) but other contents")
	os.WriteFile(eval, orig, 0o644)
	if _, stderr, code := run(t, "train", "--out", out, "--resume", "--steps", "2"); code != 0 {
		t.Errorf("resume with the original validation set: exit %d\n%s", code, stderr)
	}
}

// TestResumeStepsKeepTheSchedule: `--resume --steps N` stretched a decaying schedule to the new length without a
// word (the learning rate of every step to come changed); the docs promise an exact continuation. Now another
// --steps is refused for a linear or cosine schedule, saying how to train further; a constant schedule (the
// default) still extends exactly. (k7r) --steps below the checkpoint named RUN/adapter where there was none.
func TestResumeStepsKeepTheSchedule(t *testing.T) {
	tmp, _, _, out := vitRun(t, "--steps", "2", "--batch-size", "4", "--schedule", "linear", "--checkpoint-every", "1")
	refusedOneLine(t, tmp, []string{"train", "--out", out, "--resume", "--steps", "4"},
		"--steps 4: the run's linear learning-rate schedule decays over its 2 steps, and a resume continues it exactly")
	os.RemoveAll(filepath.Join(out, "adapter"))
	refusedOneLine(t, tmp, []string{"train", "--out", out, "--resume", "--steps", "1"},
		"--steps 1 is below the step the checkpoint reached (2): give more steps to continue; export what it reached with finetune export --run "+out)
}

// TestCheckpointsReadableAndBestMessages (ro03, cc1): checkpoints were created 0700 (os.MkdirTemp), so another
// user who reads a shared run folder could not read them, and export --checkpoint best said "only runs with a
// validation set keep one" of a run that has one but has not evaluated yet. Now checkpoints take the run
// folder's permissions, and the message says the first evaluation writes best/.
func TestCheckpointsReadableAndBestMessages(t *testing.T) {
	tmp, _, _, out := vitRun(t, "--steps", "1", "--batch-size", "4", "--eval-split", "0.25", "--eval-every", "5")
	st, _ := os.Stat(out)
	for _, f := range []string{"checkpoint-1", "best", "latest", "checkpoint-1/trainer_state.json", "best/trainable.safetensors"} {
		fst, err := os.Stat(filepath.Join(out, f))
		if err != nil {
			t.Fatal(err)
		}
		if fst.Mode().Perm()&0o044 != st.Mode().Perm()&0o044 {
			t.Errorf("%s has mode %v; the run folder %v (others who read the run cannot read it)", f, fst.Mode().Perm(), st.Mode().Perm())
		}
	}
	os.RemoveAll(filepath.Join(out, "best"))
	refusedOneLine(t, tmp, []string{"export", "--run", out, "--checkpoint", "best", "--out", filepath.Join(tmp, "x")},
		"--checkpoint best: "+out+" has no best checkpoint yet ("+filepath.Join(out, "best")+"): the run has a validation set, and its first evaluation (at step 1) writes one")
	// A checkpoint file that is a link to /dev/zero was hashed without end (its checksum is checked before it is
	// read): refused in one line.
	weights := filepath.Join(out, "checkpoint-1", "trainable.safetensors")
	os.Remove(weights)
	os.Symlink("/dev/zero", weights)
	if _, stderr, code := runWithin(t, 60*time.Second, "export", "--run", out, "--out", filepath.Join(tmp, "y")); code == 0 || strings.Count(strings.TrimSpace(stderr), "\n") != 0 || !strings.Contains(stderr, weights+" is a character device, not a regular file") {
		t.Errorf("a checkpoint linked to /dev/zero: exit %d\n%s", code, stderr)
	}
}

// TestBudgetUnits (pl_1PiB_, pl_2PiB_, pl____, au06): `--budget 1PiB` was "not a size" while the limit was stated
// as "at most 1PiB"; `--budget ”` with --plan blamed --max-batch-size; `--for-backend` without --plan read as
// if a backend "go" were meant. Each is now one line naming the cause, and 1PiB is a size.
func TestBudgetUnits(t *testing.T) {
	tmp := t.TempDir()
	plan := func(extra ...string) []string {
		return append([]string{"memory", "--model", "vit:tiny", "--num-labels", "10", "--batch-size", "4"}, extra...)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{plan("--budget", "2PiB", "--plan"), "--budget 2PiB is 2.25e+15 bytes, more than memfit plans for (at most 1PiB): is the unit right?"},
		{plan("--budget", "", "--plan"), `--budget "": give a size (examples: 24GiB, 80GB, 1.5e9)`},
		{plan("--plan"), "--plan needs --budget SIZE (e.g. --budget 24GiB): the memory its per-block plan must fit"},
		{plan("--for-backend", "xla:cuda"), "--for-backend is a setting of the memory autopilot: it goes with --budget SIZE --plan"},
		{plan("--calibrate=false"), "--calibrate is a setting of the memory autopilot: it goes with --budget SIZE --plan"},
		{[]string{"train", "--model", "x", "--data", "y", "--out", filepath.Join(tmp, "o"), "--budget", ""}, `--budget "": give a size`},
	} {
		refusedOneLine(t, tmp, c.args, c.want)
	}
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	if out, stderr, code := run(t, plan("--lora-targets", "q,v", "--train-modules", "classifier", "--budget", "1PiB", "--plan", "--calibrate=false")...); code != 0 || !strings.Contains(out, "budget 1.000 PiB") {
		t.Errorf("--budget 1PiB: exit %d\n%s%s", code, out, stderr)
	}
}

// widest returns the widest line of s (lines end at "\n" or a progress bar's "\r") in runes, and that line.
func widest(s string) (int, string) {
	n, line := 0, ""
	for _, l := range strings.FieldsFunc(s, func(r rune) bool { return r == '\n' || r == '\r' }) {
		if w := utf8.RuneCountInString(l); w > n {
			n, line = w, l
		}
	}
	return n, line
}

// TestOutputFitsTheTerminal (walk-through): the memory table was about 215 columns wide and the training
// progress line about 150, so an 80-column terminal wrapped them (a progress bar that wraps adds a line per
// redraw). On a terminal they now fit its width: the table is split into tables of fewer columns, each starting
// with the variant; the progress line keeps its first parts. Written anywhere else the layout stays one line per
// row (stable for programs). `memory` says which variant it plans, with the time so far (the llama-7b example
// printed nothing for 92 s).
func TestOutputFitsTheTerminal(t *testing.T) {
	args := []string{"memory", "--model", "vit:tiny", "--num-labels", "10", "--lora-targets", "q,v", "--train-modules", "classifier", "--batch-size", "4"}
	wide, stderr, code := run(t, args...)
	if code != 0 {
		t.Fatalf("memory: exit %d\n%s", code, stderr)
	}
	header := ""
	for _, l := range strings.Split(wide, "\n") {
		if strings.Contains(l, "variant") {
			header = l
		}
	}
	if !strings.Contains(header, "saved act.") || !strings.Contains(header, "trainable") {
		t.Errorf("off a terminal the table is not one line per row: header %q", header)
	}
	for _, want := range []string{"memory: planning plain (variant 1 of 6, 0 s so far)", "memory: planning mesa (variant 6 of 6", "memory: 6 variants planned in "} {
		if !strings.Contains(stderr, want) {
			t.Errorf("no progress %q:\n%s", want, stderr)
		}
	}
	restore := cli.SetTerminalColumnsForTest(80)
	defer restore()
	narrow, _, code := run(t, args...)
	if n, l := widest(narrow); code != 0 || n > 80 {
		t.Errorf("memory on 80 columns: exit %d, a line of %d columns: %q\n%s", code, n, l, narrow)
	}
	for _, cell := range []string{"variant", "saved act.", "step peak", "optimizer", "trainable", "approx-act+ms-norm"} {
		if !strings.Contains(narrow, cell) {
			t.Errorf("memory on 80 columns lost %q:\n%s", cell, narrow)
		}
	}
	t.Setenv("XDG_CACHE_HOME", t.TempDir())
	planned, _, code := run(t, append(args, "--budget", "1.2MiB", "--plan")...)
	if n, l := widest(planned); code != 0 || n > 80 {
		t.Errorf("memory --plan on 80 columns: exit %d, a line of %d columns: %q\n%s", code, n, l, planned)
	}
	tmp, model, data := vitFixture(t)
	_, stderr, code = run(t, "train", "--model", model, "--data", data, "--out", filepath.Join(tmp, "run"), "--steps", "3",
		"--batch-size", "4", "--log-every", "1", "--eval-split", "0.25", "--eval-every", "2")
	if n, l := widest(stderr); code != 0 || n > 80 || !strings.Contains(stderr, "loss ") {
		t.Errorf("train progress on 80 columns: exit %d, a line of %d columns: %q\n%s", code, n, l, stderr)
	}
	var buf bytes.Buffer
	progress := cli.CountProgressForTest(&buf, "export: writing "+strings.Repeat("/a-long-folder-name", 8)+"/model.gguf (q8_0), tensors")
	for i := 0; i <= 1234; i += 100 {
		progress(i, 1234)
	}
	if n, l := widest(buf.String()); n > 80 {
		t.Errorf("a count progress bar of %d columns: %q", n, l)
	}
}

// TestGGUFAndEvalOutputs: (gi17) `logits --model X.gguf` with NaN weights printed NaN logits with exit 0 (the same
// weights as safetensors are refused when loaded); now a GGUF's weights are checked at load, and logits, generate
// and eval stop there in one line. (gi03) `eval mmlu --model FILE.gguf` wrote its default results file inside the
// GGUF path, and eval wrote into model and adapter folders; now the default is the current folder (or the run
// folder of a run's checkpoint or adapter), and the output says where. (gg17, gg18) `--out DIR.gguf` naming a
// folder suggested DIR.gguf/results.json. The PEFT adapter's base_model_name_or_path is the model as given.
func TestGGUFAndEvalOutputs(t *testing.T) {
	tmp := t.TempDir()
	llama, _ := filepath.Abs(filepath.Join("..", "pretrained", "llama-tiny"))
	mmlu, _ := filepath.Abs(filepath.Join("..", "..", "shared", "data", "mmlu"))
	gg := filepath.Join(tmp, "t.gguf")
	if _, stderr, code := run(t, "export", "--model", llama, "--format", "gguf", "--gguf-type", "f16", "--out", gg); code != 0 {
		t.Fatalf("export: %s", stderr)
	}
	b, _ := os.ReadFile(gg)
	n := len(b)
	for i := n - 200000; i < n-100000; i += 2 {
		b[i], b[i+1] = 0x00, 0x7e // f16 NaN
	}
	nan := filepath.Join(tmp, "nan.gguf")
	os.WriteFile(nan, b, 0o644)
	in := filepath.Join(tmp, "in.json")
	os.WriteFile(in, []byte(`{"input_ids": [[4093, 1516, 311]]}`), 0o644)
	for _, args := range [][]string{
		{"logits", "--model", nan, "--inputs", in},
		{"generate", "--model", nan, "--prompt", "It was", "--max-new-tokens", "2"},
		{"eval", "mmlu", "--model", nan, "--data", mmlu, "--subjects", "anatomy", "--limit", "1", "--out", filepath.Join(tmp, "r.json")},
	} {
		refusedOneLine(t, tmp, args, nan+": tensor ")
		refusedOneLine(t, tmp, args, "holds NaN")
	}
	// gg17, gg18: a folder named like a GGUF file.
	folder := filepath.Join(tmp, "dir.gguf")
	os.Mkdir(folder, 0o755)
	refusedOneLine(t, tmp, []string{"export", "--model", llama, "--format", "gguf", "--out", folder},
		"--out "+folder+" is a folder: give a file name, e.g. "+filepath.Join(folder, "model.gguf"))
	// gi03: the default results file of a GGUF model, in the current folder, said in the output.
	work := filepath.Join(tmp, "work")
	os.Mkdir(work, 0o755)
	t.Chdir(work)
	before := snapshot(t, tmp)
	out, stderr, code := run(t, "eval", "mmlu", "--model", gg, "--data", mmlu, "--subjects", "anatomy", "--limit", "1", "--shots", "0")
	if code != 0 || !strings.Contains(out, "results in eval-mmlu-t.json") {
		t.Fatalf("eval mmlu --model FILE.gguf: exit %d\n%s%s", code, out, stderr)
	}
	after := snapshot(t, tmp)
	for f := range after {
		if _, ok := before[f]; !ok && f != filepath.Join(work, "eval-mmlu-t.json") {
			t.Errorf("eval wrote %s", f)
		}
	}
	// A run's adapter: the results go to the run folder; and the adapter names the base model as given.
	_, model, data := vitFixture(t)
	rel := "vit-model"
	copyTree(t, model, filepath.Join(work, rel))
	run1 := filepath.Join(tmp, "run")
	if _, stderr, code := run(t, "train", "--model", rel, "--data", data, "--out", run1, "--steps", "1", "--batch-size", "4"); code != 0 {
		t.Fatalf("train: %s", stderr)
	}
	raw, _ := os.ReadFile(filepath.Join(run1, "adapter", "adapter_config.json"))
	var peft map[string]any
	if err := json.Unmarshal(raw, &peft); err != nil || peft["base_model_name_or_path"] != rel {
		t.Errorf("base_model_name_or_path %v, want the path given, %q", peft["base_model_name_or_path"], rel)
	}
	if got := cli.ResultPathForTest(filepath.Join(run1, "adapter")); got != filepath.Join(run1, "eval-mmlu-adapter.json") {
		t.Errorf("results of a run's adapter go to %s", got)
	}
	if got := cli.ResultPathForTest(filepath.Join(run1, "best")); got != filepath.Join(run1, "eval-mmlu-best.json") {
		t.Errorf("results of a run's best checkpoint go to %s", got)
	}
}

// TestPackingCountsSequences (pk07, walk-through): 24 short conversations packed at --seq-len 512 make 3
// sequences, and --batch-size 8 said "batch size 8 must be in 1..4 (the dataset size)"; --eval-split held out
// packed sequences but said "examples". Now the refusal names the packing, the hold-out says what it holds out,
// and the evaluation counts the examples packed into its sequences.
func TestPackingCountsSequences(t *testing.T) {
	tmp := t.TempDir()
	llama, _ := filepath.Abs(filepath.Join("..", "pretrained", "llama-tiny"))
	var rows []string
	for i := range 24 {
		rows = append(rows, fmt.Sprintf(`{"messages": [{"role": "user", "content": "Say %d."}, {"role": "assistant", "content": "%d, as you asked."}]}`, i, i))
	}
	chats := filepath.Join(tmp, "chats.jsonl")
	os.WriteFile(chats, []byte(strings.Join(rows, "\n")+"\n"), 0o644)
	refusedOneLine(t, tmp, []string{"train", "--model", llama, "--data", chats, "--packing", "--seq-len", "512", "--batch-size", "8", "--out", filepath.Join(tmp, "a")},
		"--packing made 24 examples into 3 sequences, fewer than --batch-size 8 (a batch is of packed sequences): lower --batch-size to 3 or less")
	_, stderr, code := run(t, "train", "--model", llama, "--data", chats, "--packing", "--seq-len", "128", "--batch-size", "2",
		"--eval-split", "0.25", "--eval-every", "1", "--steps", "1", "--out", filepath.Join(tmp, "b"))
	if code != 0 {
		t.Fatalf("train: exit %d\n%s", code, stderr)
	}
	var held, packed int
	note, i := strings.Index(stderr, "note: --eval-split 0.25 holds out "), strings.Index(stderr, "packed sequences (")
	if note < 0 || i < 0 {
		t.Fatalf("no note of the hold-out saying it holds out packed sequences:\n%s", stderr)
	}
	fmt.Sscanf(stderr[note:], "note: --eval-split 0.25 holds out %d of the", &held)
	fmt.Sscanf(stderr[i:], "packed sequences (%d of the 24 examples", &packed)
	if packed <= held || !strings.Contains(stderr, fmt.Sprintf("(%d examples, ", packed)) {
		t.Errorf("%d sequences holding %d examples; the evaluation line should count the examples:\n%s", held, packed, stderr)
	}
}

// TestWalkThroughMessages: `finetune version` names the module version of an installed release (go install
// ...@v0.4.0 stamps it; it printed "(devel)" for every build), or the commit of a development build; `train
// --dry-run` refuses a model_type memfit cannot train (it printed the run and exited 0); `train --help` no longer
// says --data is safetensors.
func TestWalkThroughMessages(t *testing.T) {
	for _, c := range []struct {
		info debug.BuildInfo
		want string
	}{
		{debug.BuildInfo{Main: debug.Module{Path: "github.com/memfit/memfit", Version: "v0.4.0"}}, "v0.4.0"},
		{debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20261127092220-9f05182dddf8+dirty"}}, "v0.0.0-20261127092220-9f05182dddf8+dirty"},
		{debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "9f05182dddf823ea803387fe65b38734bd90e1a6"},
			{Key: "vcs.time", Value: "2026-11-27T09:22:20Z"}, {Key: "vcs.modified", Value: "true"}}}, "(devel) commit 9f05182dddf8 of 2026-11-27T09:22:20Z, with uncommitted changes"},
		{debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}, "(devel: built from a source tree without version information; go install github.com/memfit/memfit/cmd/finetune@VERSION names its version)"},
	} {
		if got := cli.ModuleVersionForTest(&c.info); got != c.want {
			t.Errorf("version of %+v: %q, want %q", c.info.Main, got, c.want)
		}
	}
	if out, _, code := run(t, "version"); code != 0 || !strings.HasPrefix(out, "memfit v") && !strings.HasPrefix(out, "memfit (devel") {
		t.Errorf("version: %q", out)
	}
	tmp := t.TempDir()
	gpt2 := filepath.Join(tmp, "gpt2")
	os.Mkdir(gpt2, 0o755)
	os.WriteFile(filepath.Join(gpt2, "config.json"), []byte(`{"model_type": "gpt2", "n_layer": 2}`), 0o644)
	data := filepath.Join(tmp, "d.jsonl")
	os.WriteFile(data, []byte(`{"instruction": "a", "input": "", "output": "b"}`+"\n"), 0o644)
	refusedOneLine(t, tmp, []string{"train", "--model", gpt2, "--data", data, "--out", filepath.Join(tmp, "o"), "--dry-run"},
		`field "model_type" is "gpt2": memfit supports`)
	help, _, _ := run(t, "train", "--help")
	if strings.Contains(help, "(safetensors)") || !strings.Contains(help, "training data: a file or folder in any format") {
		t.Errorf("train --help on --data:\n%s", help)
	}
}

// TestDocsGoCommandsCarryTheSettings (walk-through): the docs' `go run` lines lacked the README's toolchain
// settings, so a reader's Go 1.26 refused them (GoMLX needs Go 1.27) or built without the vector kernels. Every
// go run / build / install / test line of memfit's commands of a shell block in README.md and docs/ sets GOTOOLCHAIN and GOEXPERIMENT
// on it, or exported earlier in its block.
func TestDocsGoCommandsCarryTheSettings(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("..", "docs", "*.md"))
	more, _ := filepath.Glob(filepath.Join("..", "docs", "*", "*.md"))
	files = append(append(files, filepath.Join("..", "README.md")), more...)
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		inBlock, exported := false, false
		for i, line := range strings.Split(string(raw), "\n") {
			switch trimmed := strings.TrimSpace(line); {
			case strings.HasPrefix(trimmed, "```"):
				inBlock, exported = !inBlock && (trimmed == "```sh" || trimmed == "```bash"), false
			case !inBlock:
			case strings.HasPrefix(trimmed, "export GOTOOLCHAIN="):
				exported = true
			default:
				memfit := strings.Contains(line, "./cmd/") || strings.Contains(line, "github.com/memfit/") || strings.Contains(line, "go test ./")
				for _, cmd := range []string{"go run ", "go build ", "go install ", "go test "} {
					if memfit && strings.Contains(line, cmd) && !exported && !(strings.Contains(line, "GOTOOLCHAIN=") && strings.Contains(line, "GOEXPERIMENT=simd")) {
						t.Errorf("%s:%d: %s without the README's GOTOOLCHAIN=go1.27.3 GOEXPERIMENT=simd", f, i+1, trimmed)
					}
				}
			}
		}
	}
}
