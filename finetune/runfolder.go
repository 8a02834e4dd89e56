package finetune

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/memfit/memfit/internal/readfile"
	"github.com/memfit/memfit/safetensors"
)

// Guarding a run's output folder: one process at a time (LockRun), a new run never mixes with an old one
// (CheckFreshRun), leftovers of a killed save are cleared (CleanStale), and old checkpoints are pruned
// (pruneCheckpoints, after every save).

// LockFile is the lock file of an output folder.
const LockFile = ".lock"

// ErrLocked is returned by LockRun when another process holds the folder.
var ErrLocked = errors.New("the output folder is in use by another finetune process")

// LockRun creates out if needed and takes its lock for this process (an advisory lock on out/.lock, released
// when the process ends, even by a kill). It fails with ErrLocked, naming the holder's process id, when another
// process holds it. Call the returned function to release it earlier.
func LockRun(out string) (unlock func(), err error) {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	path := filepath.Join(out, LockFile)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := lockFile(f); err != nil {
		b, _ := readfile.Read(path, readfile.Small)
		f.Close()
		holder := strings.TrimSpace(string(b))
		if holder == "" {
			holder = "unknown"
		}
		return nil, fmt.Errorf("%w: %s (process %s); wait for it or use another --out", ErrLocked, out, holder)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return func() { unlockFile(f); f.Close() }, nil
}

// runFiles lists what a memfit run left in its output folder: run.yaml, metrics.jsonl, latest, a DPO run's cached
// reference log-likelihoods (ReferenceFile), its checkpoints
// (checkpoint-N folders and the best one, BestDir, holding trainer_state.json: another tool's checkpoint-500 is
// not ours) and, when any of
// those is there, the exported adapter. hasCheckpoint says whether a checkpoint is among them.
func runFiles(out string) (found []string, hasCheckpoint bool, err error) {
	entries, err := os.ReadDir(out)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	adapter := false
	for _, e := range entries {
		n := e.Name()
		switch {
		case n == RunFile || n == MetricsFile || n == LatestFile || n == ReferenceFile:
			found = append(found, n)
		case n == "adapter":
			adapter = true
		case (isCheckpointName(n) || n == BestDir) && isOurCheckpoint(filepath.Join(out, n)):
			found, hasCheckpoint = append(found, n), true
		}
	}
	if adapter && len(found) > 0 {
		found = append(found, "adapter")
	}
	return found, hasCheckpoint, nil
}

// isOurCheckpoint reports whether dir is a memfit checkpoint (it holds trainer_state.json).
func isOurCheckpoint(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "trainer_state.json"))
	return err == nil
}

// MetricsFile is the metrics log of an output folder (JSONL, one line per logging step).
const MetricsFile = "metrics.jsonl"

// CheckResumable makes sure out holds a run --resume can continue: one with a checkpoint. A run that stopped
// before its first checkpoint (run.yaml, maybe metrics.jsonl, no checkpoint) is refused in one line that says to
// start it again with --overwrite.
func CheckResumable(out string) error {
	found, hasCheckpoint, err := runFiles(out)
	if err != nil || hasCheckpoint {
		return err
	}
	if _, err := LatestCheckpoint(out); err == nil {
		return nil // latest names a folder that is not there: Resume says so
	}
	return fmt.Errorf("%s holds a run that stopped before its first checkpoint (%s): there is nothing to resume: run the same train command without --resume and with --overwrite to start it again",
		out, strings.Join(found, ", "))
}

// CheckFreshRun makes sure a new run can start in out: an empty or missing folder, or one that holds no run. A
// folder with a run is refused, naming what is there, unless overwrite: then the old run's files (run.yaml,
// metrics, checkpoints, latest, the exported adapter) are removed first. Other files are left alone, and so is
// everything when one of the files to remove holds an input of the new run (inputs: the model, data, tokenizer
// and initial adapter paths), which is refused instead.
func CheckFreshRun(out string, overwrite bool, inputs ...string) error {
	found, hasCheckpoint, err := runFiles(out)
	if err != nil || len(found) == 0 {
		return err
	}
	if !overwrite {
		if !hasCheckpoint {
			return fmt.Errorf("%s holds a run that stopped before its first checkpoint (%s): pass --overwrite to delete it and start again",
				out, strings.Join(found, ", "))
		}
		return fmt.Errorf("%s already holds a training run (%s): continue it with --resume, or pass --overwrite to delete it and start again",
			out, strings.Join(found, ", "))
	}
	for _, n := range found {
		for _, in := range inputs {
			if in != "" && within(in, filepath.Join(out, n)) {
				return fmt.Errorf("--overwrite would delete %s, which this run reads (%s): copy it out of %s first, or choose another --out",
					filepath.Join(out, n), in, out)
			}
		}
	}
	for _, n := range found {
		if err := os.RemoveAll(filepath.Join(out, n)); err != nil {
			return err
		}
	}
	return nil
}

// within reports whether path is dir or lies inside it (after making both absolute and resolving links).
func within(path, dir string) bool {
	abs := func(p string) string {
		if a, err := filepath.Abs(p); err == nil {
			p = a
		}
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		return p
	}
	rel, err := filepath.Rel(abs(dir), abs(path))
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// CleanStale removes what a killed save leaves in out: temporary checkpoint folders and "latest" files. A
// checkpoint moved aside while being replaced (see Save) is put back if its replacement never arrived, and
// removed otherwise.
func CleanStale(out string) error {
	entries, err := os.ReadDir(out)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		n := e.Name()
		switch {
		case strings.HasPrefix(n, ".latest-"), isSaveTemp(n) && strings.Contains(n, ".tmp-"):
			if err := os.RemoveAll(filepath.Join(out, n)); err != nil {
				return err
			}
		case isSaveTemp(n) && strings.Contains(n, ".old-"):
			orig := strings.TrimPrefix(n[:strings.Index(n, ".old-")], ".")
			if _, err := os.Stat(filepath.Join(out, orig)); errors.Is(err, fs.ErrNotExist) {
				if err := os.Rename(filepath.Join(out, n), filepath.Join(out, orig)); err != nil {
					return err
				}
			} else if err := os.RemoveAll(filepath.Join(out, n)); err != nil {
				return err
			}
		}
	}
	return nil
}

// isSaveTemp reports whether n is a temporary folder of Save: ".checkpoint-N.tmp-*", ".best.old-*" ...
func isSaveTemp(n string) bool {
	return strings.HasPrefix(n, ".checkpoint-") || strings.HasPrefix(n, "."+BestDir+".")
}

// isCheckpointName reports whether n is "checkpoint-<step>".
func isCheckpointName(n string) bool {
	_, ok := checkpointStep(n)
	return ok
}

func checkpointStep(n string) (int, bool) {
	s, ok := strings.CutPrefix(n, "checkpoint-")
	if !ok {
		return 0, false
	}
	step, err := strconv.Atoi(s)
	return step, err == nil && step >= 0
}

// pruneCheckpoints removes all but the newest keep checkpoints of out (keep 0: none is removed), never the one
// "latest" names.
func pruneCheckpoints(out string, keep int) error {
	if keep <= 0 {
		return nil
	}
	entries, err := os.ReadDir(out)
	if err != nil {
		return err
	}
	latest, _ := LatestCheckpoint(out)
	var steps []int
	for _, e := range entries {
		if s, ok := checkpointStep(e.Name()); ok && e.IsDir() && isOurCheckpoint(filepath.Join(out, e.Name())) {
			steps = append(steps, s)
		}
	}
	sort.Sort(sort.Reverse(sort.IntSlice(steps)))
	for _, s := range steps[min(keep, len(steps)):] {
		dir := filepath.Join(out, fmt.Sprintf("checkpoint-%d", s))
		if dir == latest {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			return err
		}
	}
	return nil
}

// TrimMetrics rewrites the metrics log at path (atomically) keeping only its whole, valid lines of steps up to
// step: a resumed run continues from its checkpoint's step, so the lines a killed run wrote after that checkpoint
// would otherwise repeat, and a line cut by a kill or a full disk would glue onto the next. It returns how many
// lines it dropped; a missing file is no error.
func TrimMetrics(path string, step int) (int, error) {
	data, err := readfile.Read(path, readfile.Log)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	var kept []string
	dropped := 0
	for _, line := range strings.SplitAfter(string(data), "\n") {
		if line == "" {
			continue
		}
		var rec struct {
			Step *int `json:"step"`
		}
		if !strings.HasSuffix(line, "\n") || json.Unmarshal([]byte(line), &rec) != nil || rec.Step == nil || *rec.Step > step {
			dropped++
			continue
		}
		kept = append(kept, line)
	}
	if dropped == 0 {
		return 0, nil
	}
	return dropped, safetensors.WriteAtomic(path, func(w *bufio.Writer) error {
		for _, l := range kept {
			if _, err := w.WriteString(l); err != nil {
				return err
			}
		}
		return nil
	})
}

// ResumeCheckpoint returns the checkpoint folder a resume of the output folder out continues from: the one
// "latest" names, or best/ in a run that has no latest (written by a memfit that kept only best/ in a run without
// --checkpoint-every, killed before its end; fromBest is then true). out may also be a checkpoint folder itself.
func ResumeCheckpoint(out string) (dir string, fromBest bool, err error) {
	if _, err := os.Stat(filepath.Join(out, StateFile)); err == nil {
		return out, false, nil
	}
	latest, err := LatestCheckpoint(out)
	if err == nil {
		return latest, false, nil
	}
	best := filepath.Join(out, BestDir)
	if errors.Is(err, fs.ErrNotExist) && isOurCheckpoint(best) {
		return best, true, nil
	}
	return "", false, fmt.Errorf("%s is neither a checkpoint nor an output folder with one: %w", out, err)
}

// checkpointStateStep returns the step a checkpoint folder's trainer_state.json records (-1 when dir holds none).
func checkpointStateStep(dir string) int {
	raw, err := readfile.Read(filepath.Join(dir, StateFile), readfile.Config)
	if err != nil {
		return -1
	}
	var s struct {
		Step int `json:"step"`
	}
	if json.Unmarshal(raw, &s) != nil {
		return -1
	}
	return s.Step
}

// BestStep returns the step of the checkpoint in out's best/ folder (-1 when there is none): what `finetune
// export --checkpoint best` exports.
func BestStep(out string) int { return checkpointStateStep(filepath.Join(out, BestDir)) }

// SyncBest makes out's best/ agree with the resumed trainer's evaluation state (EvalState.BestStep, the best
// step the resumed checkpoint knows), before the resumed run trains: a kill between the checkpoint of an
// evaluation that improved and its copy to best/ leaves best/ at an earlier step, and a run written before Fit
// ordered them could leave best/ at a step after the checkpoint (k8r). When the checkpoint is itself the best,
// best/ is restored from it; a best/ from a step after the checkpoint whose best has no copy left is removed (the
// next evaluation that improves writes one). It returns a note saying what it did ("" when nothing).
func SyncBest(out string, tr *Trainer) (string, error) {
	if out == "" || tr.resumedFrom == "" {
		return "", nil
	}
	best := filepath.Join(out, BestDir)
	have, want := BestStep(out), tr.EvalState.BestStep
	switch {
	case have == want || want == 0 && have < 0:
		return "", nil
	case want == tr.Step && !within(tr.resumedFrom, best):
		if err := copyCheckpoint(tr.resumedFrom, best); err != nil {
			return "", fmt.Errorf("restoring the best checkpoint: %w", err)
		}
		return fmt.Sprintf("%s held step %d, not the best evaluation the resumed checkpoint records (step %d, this checkpoint): restored from %s", best, have, want, tr.resumedFrom), nil
	case have > tr.Step:
		if err := os.RemoveAll(best); err != nil {
			return "", err
		}
		return fmt.Sprintf("%s held step %d, after the resumed checkpoint (step %d), whose best evaluation (step %d) has no checkpoint left: removed it; the next evaluation that improves writes best/ again", best, have, tr.Step, want), nil
	}
	return "", nil
}
