package finetune_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models/vit"
)

// TestRunFolderGuards: the lock admits one holder at a time; a folder with a run is refused without overwrite
// and cleared (its run files only) with it; a killed save's leftovers are cleaned, an aside checkpoint restored.
func TestRunFolderGuards(t *testing.T) {
	out := filepath.Join(t.TempDir(), "run")
	unlock, err := finetune.LockRun(out)
	if err != nil {
		t.Fatal(err)
	}
	if runtime.GOOS != "windows" {
		if _, err := finetune.LockRun(out); !errors.Is(err, finetune.ErrLocked) || !strings.Contains(err.Error(), "process") {
			t.Errorf("second lock: %v, want ErrLocked naming the holder", err)
		}
	}
	unlock()
	unlock2, err := finetune.LockRun(out)
	if err != nil {
		t.Fatalf("lock after unlock: %v", err)
	}
	unlock2()

	if err := finetune.CheckFreshRun(out, false); err != nil {
		t.Errorf("empty folder: %v", err)
	}
	for _, f := range []string{finetune.RunFile, finetune.MetricsFile, finetune.LatestFile, "notes.txt"} {
		os.WriteFile(filepath.Join(out, f), []byte("x\n"), 0o644)
	}
	err = finetune.CheckFreshRun(out, false)
	if err == nil || !strings.Contains(err.Error(), "stopped before its first checkpoint") {
		t.Errorf("a run without a checkpoint: %v", err)
	}
	os.MkdirAll(filepath.Join(out, "checkpoint-3"), 0o755)
	os.WriteFile(filepath.Join(out, "checkpoint-3", "trainer_state.json"), []byte("{}"), 0o644)
	os.MkdirAll(filepath.Join(out, "checkpoint-500"), 0o755) // another tool's checkpoint: not ours to delete
	os.WriteFile(filepath.Join(out, "checkpoint-500", "config.json"), []byte("{}"), 0o644)
	err = finetune.CheckFreshRun(out, false)
	if err == nil || !strings.Contains(err.Error(), "--overwrite") || !strings.Contains(err.Error(), "checkpoint-3") || strings.Contains(err.Error(), "checkpoint-500") {
		t.Errorf("used folder: %v", err)
	}
	// --overwrite never deletes what the new run reads (its model here lies in the old checkpoint).
	err = finetune.CheckFreshRun(out, true, filepath.Join(out, "checkpoint-3", "trainable.safetensors"))
	if err == nil || !strings.Contains(err.Error(), "which this run reads") {
		t.Errorf("overwrite of an input: %v", err)
	}
	if err := finetune.CheckFreshRun(out, true, filepath.Join(out, "checkpoint-500")); err != nil {
		t.Fatal(err)
	}
	names := list(t, out)
	if strings.Join(names, ",") != ".lock,checkpoint-500,notes.txt" {
		t.Errorf("after overwrite the folder holds %v, want .lock, checkpoint-500 and notes.txt", names)
	}
	os.RemoveAll(filepath.Join(out, "checkpoint-500"))

	for _, d := range []string{".checkpoint-3.tmp-1", ".checkpoint-4.old-1", ".checkpoint-5.old-1", "checkpoint-5"} {
		os.MkdirAll(filepath.Join(out, d), 0o755)
		os.WriteFile(filepath.Join(out, d, "trainer_state.json"), []byte("{}"), 0o644)
		os.MkdirAll(filepath.Join(out, d), 0o755)
	}
	os.WriteFile(filepath.Join(out, ".latest-9"), nil, 0o644)
	if err := finetune.CleanStale(out); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(list(t, out), ","); got != ".lock,checkpoint-4,checkpoint-5,notes.txt" {
		t.Errorf("after CleanStale: %s", got)
	}
}

func list(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

// TestTrimMetrics: a resumed run's log keeps whole lines up to its checkpoint's step; lines after it and a line
// cut short are dropped.
func TestTrimMetrics(t *testing.T) {
	path := filepath.Join(t.TempDir(), finetune.MetricsFile)
	os.WriteFile(path, []byte(`{"step":1,"loss":2}
{"step":2,"loss":1.9}
{"step":3,"loss":1.8}
{"step":4,"loss":1.7}
{"step":5,"lo`), 0o644)
	n, err := finetune.TrimMetrics(path, 3)
	if err != nil || n != 2 {
		t.Fatalf("dropped %d, %v; want 2", n, err)
	}
	b, _ := os.ReadFile(path)
	if string(b) != "{\"step\":1,\"loss\":2}\n{\"step\":2,\"loss\":1.9}\n{\"step\":3,\"loss\":1.8}\n" {
		t.Errorf("trimmed log:\n%s", b)
	}
	if n, err := finetune.TrimMetrics(filepath.Join(t.TempDir(), "none"), 3); n != 0 || err != nil {
		t.Errorf("missing file: %d, %v", n, err)
	}
}

// TestKeepCheckpoints: a run checkpointing every step keeps only the newest KeepCheckpoints, the latest among
// them, and can resume from it.
func TestKeepCheckpoints(t *testing.T) {
	model, data := imageTask(t, vit.Options{})
	cfg := config(finetune.MethodLoRA, 5)
	cfg.CheckpointEvery, cfg.KeepCheckpoints = 1, 2
	tr, _ := finetune.New(model, cfg, gtest.Backend(t))
	loader, _ := finetune.NewLoader(data, 4, cfg.Seed, true)
	out := t.TempDir()
	if err := tr.Fit(context.Background(), loader, out, nil, finetune.Hooks{}); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(list(t, out), ","); got != "checkpoint-4,checkpoint-5,latest" {
		t.Errorf("output folder: %s", got)
	}
	loader2, _ := finetune.NewLoader(data, 4, cfg.Seed, true)
	if tr2, err := finetune.Resume(out, model, gtest.Backend(t), loader2); err != nil || tr2.Step != 5 {
		t.Errorf("resume: %v", err)
	}
}

// TestCorruptCheckpointRefused: a checkpoint whose tensor bytes changed after the save (one flipped bit) is
// refused by Resume (and so by export), naming the file; the untouched one resumes.
func TestCorruptCheckpointRefused(t *testing.T) {
	model, data := imageTask(t, vit.Options{})
	cfg := config(finetune.MethodLoRA, 2)
	tr, _ := finetune.New(model, cfg, gtest.Backend(t))
	loader, _ := finetune.NewLoader(data, 4, cfg.Seed, true)
	out := t.TempDir()
	if err := tr.Fit(context.Background(), loader, out, nil, finetune.Hooks{}); err != nil {
		t.Fatal(err)
	}
	if _, err := finetune.Resume(out, model, gtest.Backend(t), nil); err != nil {
		t.Fatalf("intact checkpoint: %v", err)
	}
	path := filepath.Join(out, "checkpoint-2", finetune.TrainableFile)
	b, _ := os.ReadFile(path)
	b[len(b)-3] ^= 0x10
	os.WriteFile(path, b, 0o644)
	_, err := finetune.Resume(out, model, gtest.Backend(t), nil)
	if !errors.Is(err, finetune.ErrCorruptCheckpoint) || !strings.Contains(err.Error(), finetune.TrainableFile) {
		t.Errorf("flipped bit: %v", err)
	}
	// Deleting the checksums does not turn the check off: the checkpoint is refused, not read unchecked.
	state := filepath.Join(out, "checkpoint-2", finetune.StateFile)
	raw, _ := os.ReadFile(state)
	var fields map[string]any
	if err := json.Unmarshal(raw, &fields); err != nil {
		t.Fatal(err)
	}
	for _, drop := range []func(){
		func() { delete(fields, "checksums") },
		func() { fields["checksums"] = map[string]any{finetune.OptimizerFile: "00"} },
	} {
		drop()
		raw, _ = json.Marshal(fields)
		os.WriteFile(state, raw, 0o644)
		_, err = finetune.Resume(out, model, gtest.Backend(t), nil)
		if !errors.Is(err, finetune.ErrCorruptCheckpoint) || !strings.Contains(err.Error(), "has no checksum of "+finetune.TrainableFile) {
			t.Errorf("checksums removed: %v", err)
		}
	}
}

// fullDisk is a metrics file on a disk with room for only `room` more bytes: a write past it stores what fits
// and fails with ENOSPC, as write(2) does.
type fullDisk struct {
	*os.File
	room int
}

func (d *fullDisk) Write(p []byte) (int, error) {
	if len(p) <= d.room {
		d.room -= len(p)
		return d.File.Write(p)
	}
	n, _ := d.File.Write(p[:d.room])
	d.room = 0
	return n, syscall.ENOSPC
}

// TestMetricsAfterFullDiskAndKill: a metrics write that fills the disk leaves no torn line (the partial line is
// cut back), the run stops with a checkpoint of the step done and an error naming the cause; after a kill, the
// resumed run drops the lines past its checkpoint; the log ends with every step once, each line whole, and the
// resumed losses equal the uninterrupted run's.
func TestMetricsAfterFullDiskAndKill(t *testing.T) {
	cfg := config(finetune.MethodLoRA, 6)
	cfg.CheckpointEvery = 2
	model, data := imageTask(t, vit.Options{})
	whole, _ := fit(t, model, data, cfg, 3)

	out := t.TempDir()
	path := filepath.Join(out, finetune.MetricsFile)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	line := func(s finetune.StepStats) int { b, _ := json.Marshal(s); return len(b) + 1 }
	disk := &fullDisk{File: f, room: line(whole[0]) + line(whole[1]) + 40} // step 3's line does not fit
	log, err := finetune.NewMetricsLog(disk, path)
	if err != nil {
		t.Fatal(err)
	}
	tr, _ := finetune.New(model, cfg, gtest.Backend(t))
	loader, _ := finetune.NewLoader(data, 3, cfg.Seed, true)
	err = tr.Fit(context.Background(), loader, out, log, finetune.Hooks{})
	log.Close()
	if err == nil || !strings.Contains(err.Error(), "no space left on device") || !strings.Contains(err.Error(), "checkpoint written at step 3") {
		t.Fatalf("error %v", err)
	}
	steps := func() []int {
		b, _ := os.ReadFile(path)
		var got []int
		for _, l := range strings.SplitAfter(string(b), "\n") {
			if l == "" {
				continue
			}
			var rec finetune.StepStats
			if !strings.HasSuffix(l, "\n") || json.Unmarshal([]byte(l), &rec) != nil {
				t.Fatalf("torn line %q", l)
			}
			got = append(got, rec.Step)
		}
		return got
	}
	if got := steps(); fmt.Sprint(got) != "[1 2]" {
		t.Fatalf("after the full disk the log holds steps %v, want [1 2]", got)
	}

	// Space freed: resume from step 3 and run to step 5; then a kill after step 5's line but before its
	// checkpoint (simulated: the line appended by hand, and a cut line after it).
	loader2, _ := finetune.NewLoader(data, 3, cfg.Seed, true)
	tr2, err := finetune.Resume(out, model, gtest.Backend(t), loader2)
	if err != nil || tr2.Step != 3 {
		t.Fatalf("resume: %v, %v", tr2, err)
	}
	var stats []finetune.StepStats
	hooks := finetune.Hooks{OnStep: func(s finetune.StepStats) { stats = append(stats, s) }}
	tr2.Config.Steps = 4
	log2, _ := finetune.OpenMetrics(path)
	if err := tr2.Fit(context.Background(), loader2, out, log2, hooks); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(finetune.StepStats{Step: 5, Loss: 1})
	log2.Write(append(b, '\n'))
	log2.Write([]byte(`{"step":6,"lo`)) // a kill mid-line
	log2.Close()

	if n, err := finetune.TrimMetrics(path, 4); err != nil || n != 2 {
		t.Fatalf("trim: dropped %d, %v; want 2", n, err)
	}
	loader3, _ := finetune.NewLoader(data, 3, cfg.Seed, true)
	tr3, err := finetune.Resume(out, model, gtest.Backend(t), loader3)
	if err != nil || tr3.Step != 4 {
		t.Fatalf("resume: %v, %v", tr3, err)
	}
	tr3.Config.Steps = 6
	log3, _ := finetune.OpenMetrics(path)
	if err := tr3.Fit(context.Background(), loader3, out, log3, hooks); err != nil {
		t.Fatal(err)
	}
	log3.Close()
	// Step 3's line was the one the full disk refused: the step itself is in the checkpoint.
	if got := steps(); fmt.Sprint(got) != "[1 2 4 5 6]" {
		t.Errorf("final log holds steps %v, want [1 2 4 5 6]", got)
	}
	for i, s := range stats {
		if w := whole[3+i]; s.Step != w.Step || s.Loss != w.Loss {
			t.Errorf("resumed step %d loss %v, uninterrupted step %d %v", s.Step, s.Loss, w.Step, w.Loss)
		}
	}
}
