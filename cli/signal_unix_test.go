//go:build unix

package cli_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestTrainSignalExitCodes: SIGINT and SIGTERM stop a run after its current step with a checkpoint and exit 130
// and 143 (not 0: the run is unfinished), and --resume continues from that checkpoint to the end.
func TestTrainSignalExitCodes(t *testing.T) {
	tmp := t.TempDir()
	model := filepath.Join(tmp, "vit")
	run(t, "init", "--arch", "vit", "--preset", "tiny", "--num-labels", "3", "--out", model)
	data := filepath.Join(tmp, "train.safetensors")
	writeImageData(t, data, 12)
	for _, c := range []struct {
		sig  syscall.Signal
		code int
		name string
	}{{syscall.SIGINT, 130, "SIGINT"}, {syscall.SIGTERM, 143, "SIGTERM"}} {
		out := filepath.Join(tmp, "run-"+c.name)
		type result struct {
			stderr string
			code   int
		}
		done := make(chan result, 1)
		go func() {
			_, stderr, code := run(t, "train", "--model", model, "--data", data, "--out", out, "--steps", "100000",
				"--log-every", "1", "--batch-size", "4")
			done <- result{stderr, code}
		}()
		metrics := filepath.Join(out, "metrics.jsonl")
		deadline := time.Now().Add(60 * time.Second)
		for {
			if b, _ := os.ReadFile(metrics); len(b) > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the run wrote no metrics line in 60 s", c.name)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err := syscall.Kill(os.Getpid(), c.sig); err != nil {
			t.Fatal(err)
		}
		r := <-done
		lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
		last := lines[len(lines)-1]
		if r.code != c.code || !strings.Contains(last, "interrupted by "+c.name) || !strings.Contains(last, "--resume") {
			t.Fatalf("%s: exit %d, last line %q; want %d", c.name, r.code, last, c.code)
		}
		if _, err := os.Stat(filepath.Join(out, "latest")); err != nil {
			t.Fatalf("%s: no checkpoint: %v", c.name, err)
		}
		var step int
		if _, err := fmt.Sscanf(last[strings.Index(last, "at step "):], "at step %d", &step); err != nil || step < 1 {
			t.Fatalf("%s: no step in %q: %v", c.name, last, err)
		}
		stdout, stderr, code := run(t, "train", "--out", out, "--resume", "--steps", fmt.Sprint(step+2))
		if code != 0 || !strings.Contains(stdout, fmt.Sprintf("run finished at step %d", step+2)) {
			t.Errorf("%s: resume from step %d: exit %d\n%s%s", c.name, step, code, stdout, stderr)
		}
	}
}
