package demo_test

import (
	"bytes"
	"context"
	"encoding/json"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/demo"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/memory"
)

// TestDemo runs the README's first command as a library call, with its defaults, and checks what it promises:
// accuracy clearly above the start and above chance, the memory-saving run's saved activations clearly lower
// and its accuracy within a point or so, and the plot and summary written.
func TestDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("the demo takes about a minute")
	}
	backend, err := engine.NewBackend(engine.ChooseSpec("go"))
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	out := t.TempDir()
	res, err := demo.Main(context.Background(), demo.Options{Backend: backend, Out: out})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 2 {
		t.Fatalf("%d runs", len(res.Runs))
	}
	plain, saving := res.Runs[0], res.Runs[1]
	for _, r := range res.Runs {
		t.Logf("%s: accuracy %.1f%% -> %.1f%%, saved %d B, peak %d B, %.0f img/s", r.Name, 100*r.AccuracyBefore,
			100*r.AccuracyAfter, r.SavedActivationBytes, r.PeakBytes, r.ImagesPerSecond)
		if r.AccuracyBefore > 0.35 {
			t.Errorf("%s: accuracy before fine-tuning %.3f, expected about chance (0.2): the head knows other classes", r.Name, r.AccuracyBefore)
		}
		if r.AccuracyAfter < 0.75 || r.AccuracyAfter < r.AccuracyBefore+0.4 {
			t.Errorf("%s: accuracy after fine-tuning %.3f (before %.3f)", r.Name, r.AccuracyAfter, r.AccuracyBefore)
		}
		if len(r.Steps) != 150 {
			t.Errorf("%s: %d steps recorded", r.Name, len(r.Steps))
		}
	}
	if ratio := float64(saving.SavedActivationBytes) / float64(plain.SavedActivationBytes); ratio > 0.75 {
		t.Errorf("approx-act+ms-norm keeps %.3fx plain's activations", ratio)
	}
	if saving.PeakBytes >= plain.PeakBytes {
		t.Errorf("approx-act+ms-norm step peak %d >= plain %d", saving.PeakBytes, plain.PeakBytes)
	}
	if d := math.Abs(saving.AccuracyAfter - plain.AccuracyAfter); d > 0.02 {
		t.Errorf("accuracies differ by %.1f points", 100*d)
	}
	f, err := os.Open(filepath.Join(out, "demo.png"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if img, err := png.Decode(f); err != nil || img.Bounds().Dx() < 500 {
		t.Errorf("demo.png: %v", err)
	}
	var summary demo.Result
	data, err := os.ReadFile(filepath.Join(out, "summary.json"))
	if err != nil || json.Unmarshal(data, &summary) != nil || len(summary.Runs) != 2 {
		t.Errorf("summary.json unreadable: %v", err)
	}
	for _, name := range []string{"plain.jsonl", "approx-act+ms-norm.jsonl"} {
		if st, err := os.Stat(filepath.Join(out, name)); err != nil || st.Size() == 0 {
			t.Errorf("%s missing: %v", name, err)
		}
	}
}

// TestDemoPeakUnavailable forces the Go backend's peak to be unavailable (a compute version the executor model
// was not written for) and checks that the demo says so everywhere instead of reporting 0 B: the progress lines,
// the table and its note, the plot (no peak bars) and summary.json (peak_bytes 0, peak_method with the reason).
func TestDemoPeakUnavailable(t *testing.T) {
	restore := memory.SetComputeVersionForTest("v0.1.99")
	defer restore()
	backend, err := engine.NewBackend(engine.ChooseSpec("go"))
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	out := t.TempDir()
	var log bytes.Buffer
	res, err := demo.Main(context.Background(), demo.Options{Backend: backend, Out: out, Steps: 3, BatchSize: 8, Log: &log})
	if err != nil {
		t.Fatal(err)
	}
	const reason = "modelled for compute v0.1.14, running v0.1.99"
	if !strings.Contains(log.String(), "step peak unavailable ("+reason+")") || strings.Contains(log.String(), "step peak 0 B") {
		t.Errorf("progress lines do not say the peak is unavailable:\n%s", log.String())
	}
	for _, r := range res.Runs {
		if r.PeakBytes != 0 || r.PeakMethod != "unavailable: "+reason {
			t.Errorf("%s: peak %d %q", r.Name, r.PeakBytes, r.PeakMethod)
		}
	}
	var table bytes.Buffer
	if err := demo.WriteTable(&table, res.Runs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "unavailable") || !strings.Contains(table.String(), "step peak: unavailable: "+reason) ||
		strings.Contains(table.String(), " 0 B") {
		t.Errorf("table:\n%s", table.String())
	}
	var summary struct {
		Runs []map[string]any `json:"runs"`
	}
	data, err := os.ReadFile(filepath.Join(out, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &summary); err != nil || len(summary.Runs) != 2 ||
		summary.Runs[0]["peak_bytes"] != 0.0 || summary.Runs[0]["peak_method"] != "unavailable: "+reason {
		t.Errorf("summary.json: %v (%v)", summary.Runs, err)
	}
	if _, err := os.Stat(filepath.Join(out, "demo.png")); err != nil {
		t.Error(err)
	}
}
