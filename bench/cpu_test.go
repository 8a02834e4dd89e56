package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/memfit/memfit/engine"
)

// tinyCPUCases returns small cases on the vit:tiny preset (full fine-tuning), memfit's pretrained llama-tiny
// (tied embeddings, LoRA on every linear layer) at a short sequence and memfit's pretrained roberta-tiny (the
// masked LM, full fine-tuning) at a short sequence.
func tinyCPUCases(t *testing.T, dir string) []CPUCase {
	t.Helper()
	vitDir, err := PresetCheckpoint("vit:tiny", 3, dir)
	if err != nil {
		t.Fatal(err)
	}
	return []CPUCase{
		{Key: "a", Name: "vit-tiny-full", Model: vitDir, Method: "full", Batch: 3, StepGoal: 1.5, Describe: "vit:tiny"},
		{Key: "b", Name: "llama-tiny-lora", Model: filepath.Join("..", "pretrained", "llama-tiny"), Method: "lora-all", Batch: 2, Seq: 16,
			StepGoal: 2, Describe: "llama-tiny"},
		{Key: "d", Name: "roberta-tiny-full", Model: filepath.Join("..", "pretrained", "roberta-tiny"), Method: "full", Batch: 2, Seq: 16,
			StepGoal: 2, Describe: "roberta-tiny"},
	}
}

func tinySettings() CPUSettings {
	s := DefaultCPUSettings()
	s.Warmup, s.Steps = 1, 2
	return s
}

// torchPython returns the Python that has torch, or skips the test.
func torchPython(t *testing.T) string {
	t.Helper()
	py := "/usr/bin/python3"
	if err := exec.Command(py, "-c", "import torch, numpy").Run(); err != nil {
		t.Skipf("no torch in %s (Debian's python3-torch): %v", py, err)
	}
	return py
}

// TestCPUStepAgainstReference trains the tiny cases with memfit (plain and approx-act+ms-norm) and, where
// Debian's python3-torch is installed, with bench/pytorch/cpu_compare.py on the very same spec: the first-step
// losses agree to 1e-5 relative, and so does the loss change over the first AdamW update (the reference starts
// from memfit's adapters), which checks gradients and update on both sides.
func TestCPUStepAgainstReference(t *testing.T) {
	backend, err := engine.NewBackend(engine.ChooseSpec("go"))
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	dir := t.TempDir()
	s := tinySettings()
	for _, c := range tinyCPUCases(t, dir) {
		spec := CPUSpec{Case: c, Settings: s, BatchFile: filepath.Join(dir, c.Tag()+".batch"), InitFile: filepath.Join(dir, c.Tag()+".init")}
		if err := WriteCPUBatch(c, s, spec.BatchFile); err != nil {
			t.Fatal(err)
		}
		if c.Key == "d" { // the masked LM's batch: some positions labelled, the rest -100 (left out of the loss)
			b, err := ReadCPUBatch(spec.BatchFile)
			if err != nil {
				t.Fatal(err)
			}
			var labels []int32
			b["labels"].MustConstFlatData(func(f any) { labels = append(labels, f.([]int32)...) })
			ignored := 0
			for _, l := range labels {
				if l == -100 {
					ignored++
				}
			}
			if len(labels) != c.Batch*c.Seq || ignored == 0 || ignored == len(labels) || b["attention_mask"] == nil {
				t.Fatalf("d: masked-LM batch: %d labels, %d of them -100, attention mask %v", len(labels), ignored, b["attention_mask"] != nil)
			}
		}
		var plain CPUSideResult
		for i, v := range []string{"plain", "approx-act+ms-norm"} {
			o := CPUStepOptions{Case: c, Settings: s, Variant: v, BatchFile: spec.BatchFile}
			if i == 0 {
				o.InitFile = spec.InitFile
			}
			r, err := RunCPUStep(backend, o)
			if err != nil {
				t.Fatalf("%s %s: %v", c.Key, v, err)
			}
			if len(r.Losses) != 3 || len(r.StepSeconds) != 2 || r.MedianSeconds <= 0 || (runtime.GOOS == "linux" && (r.RSSBeforeTrainBytes < 1<<20 || r.MaxRSSBytes < r.RSSBeforeTrainBytes)) || r.SavedActivationBytes <= 0 || r.PeakBytes <= 0 ||
				r.Side != "memfit" || r.Case != c.Tag() || r.Unit != c.Unit() || r.Versions["go"] == "" {
				t.Errorf("%s %s: result %+v", c.Key, v, r)
			}
			if i == 0 {
				plain = r
			} else if d := math.Abs(r.FirstLoss()-plain.FirstLoss()) / plain.FirstLoss(); d > 1e-5 {
				t.Errorf("%s: approx-act+ms-norm's first loss %.9g differs from plain's %.9g", c.Key, r.FirstLoss(), plain.FirstLoss())
			}
		}
		if _, err := os.Stat(spec.InitFile); (err == nil) != (c.Method != "full") {
			t.Errorf("%s: init file written: %v (method %s)", c.Key, err == nil, c.Method)
		}
		if c.Method == "full" {
			spec.InitFile = ""
		}
		py := torchPython(t)
		specFile := filepath.Join(dir, c.Tag()+".spec.json")
		b, _ := json.Marshal(spec)
		os.WriteFile(specFile, b, 0o644)
		out := filepath.Join(dir, c.Tag()+".pytorch.json")
		if msg, err := exec.Command(py, "pytorch/cpu_compare.py", "--spec", specFile, "--json", out).CombinedOutput(); err != nil {
			t.Fatalf("%s: reference: %v\n%s", c.Key, err, msg)
		}
		b, _ = os.ReadFile(out)
		var ref CPUSideResult
		if err := json.Unmarshal(b, &ref); err != nil {
			t.Fatal(err)
		}
		if ref.Side != "pytorch" || len(ref.Losses) != 3 || ref.MedianSeconds <= 0 || ref.Versions["torch"] == "" || ref.RSSBeforeTrainBytes <= 0 || ref.MaxRSSBytes < ref.RSSBeforeTrainBytes {
			t.Errorf("%s: reference result %+v", c.Key, ref)
		}
		if d := math.Abs(plain.FirstLoss()-ref.FirstLoss()) / ref.FirstLoss(); d > 1e-5 {
			t.Errorf("%s: first loss memfit %.9g, PyTorch %.9g (relative %.2e)", c.Key, plain.FirstLoss(), ref.FirstLoss(), d)
		}
		dm, dp := plain.Losses[1]-plain.Losses[0], ref.Losses[1]-ref.Losses[0]
		if math.Abs(dm-dp) > 1e-3*math.Abs(dp) || dp == 0 {
			t.Errorf("%s: loss change over the first update: memfit %.6g, PyTorch %.6g", c.Key, dm, dp)
		}
		t.Logf("%s: first loss memfit %.9g PyTorch %.9g; first update memfit %.6g PyTorch %.6g", c.Key, plain.FirstLoss(), ref.FirstLoss(), dm, dp)
	}
}

// fakeSide writes a shell script that stands in for one side's process: it writes result (with the case and
// variant of its arguments filled in) to the file after --json, or fails when the variant is "broken".
func fakeSide(t *testing.T, dir, name string, result CPUSideResult) []string {
	t.Helper()
	b, _ := json.Marshal(result)
	canned := filepath.Join(dir, name+".json")
	os.WriteFile(canned, b, 0o644)
	script := `out=; variant=plain
while [ $# -gt 0 ]; do case "$1" in --json) out=$2; shift;; --variant) variant=$2; shift;; esac; shift; done
[ "$variant" = broken ] && { echo "it broke" >&2; exit 3; }
sed "s|VARIANT|$variant|" "` + canned + `" > "$out"`
	return []string{"/bin/sh", "-c", script, name}
}

// TestRunCPUCompare runs the driver with stand-in processes: it pairs the results, fills the ratios and the
// processes' RSS, flags a first-step loss that disagrees and a process that fails, and the table and JSON show it.
func TestRunCPUCompare(t *testing.T) {
	dir := t.TempDir()
	cases := tinyCPUCases(t, dir)[:1]
	memfit := CPUSideResult{Side: "memfit", Variant: "VARIANT", Losses: []float64{2.5, 2.4}, StepSeconds: []float64{3}, MedianSeconds: 3,
		PerSecond: 1, Unit: "images/s", MaxRSSBytes: 300 << 20, SavedActivationBytes: 1 << 20, PeakBytes: 2 << 20, PeakMethod: "estimate: test",
		Versions: map[string]string{"go": "go1.x", "gomlx": "v0.28.2"}}
	torch := CPUSideResult{Side: "pytorch", Variant: "plain", Losses: []float64{2.5, 2.41}, StepSeconds: []float64{2}, MedianSeconds: 2,
		PerSecond: 1.5, Unit: "images/s", MaxRSSBytes: 600 << 20, Versions: map[string]string{"torch": "1.13", "blas": "OpenBLAS test", "notes": "a note; another"}}
	o := CPUCompareOptions{Cases: cases, Variants: []string{"plain", "approx-act+ms-norm", "broken"}, Settings: tinySettings(), LossTol: 1e-4,
		WorkDir: filepath.Join(dir, "work"), OutDir: filepath.Join(dir, "out"), Memfit: fakeSide(t, dir, "memfit", memfit),
		Python: fakeSide(t, dir, "torch", torch)}
	run, err := RunCPUCompare(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(run.Cases) != 1 || len(run.Cases[0].Memfit) != 3 || run.Cases[0].PyTorch == nil || run.Cases[0].Memfit[2].Result != nil {
		t.Fatalf("run %+v", run)
	}
	cr := run.Cases[0]
	m := cr.Memfit[0]
	if m.StepVsPyTorch != 1.5 || m.StepVsPlain != 1 || m.FirstLossRelDiff != 0 || m.Result.MaxRSSBytes != 300<<20 || m.Result.WallSeconds <= 0 ||
		len(m.Result.Command) == 0 || cr.PyTorch.MaxRSSBytes != 600<<20 || (runtime.GOOS == "linux" && (cr.PyTorch.Wait4MaxRSSBytes <= 0 ||
		cr.PyTorch.DriverHWMBytes <= 0 || cr.PyTorch.Wait4MaxRSSBytes < cr.PyTorch.DriverHWMBytes/2)) || math.Abs(m.UpdateDelta+0.1) > 1e-12 || math.Abs(m.PyTorchUpdateDelta+0.09) > 1e-12 {
		t.Errorf("plain row %+v, result %+v", m, m.Result)
	}
	if cr.Memfit[1].Result.Variant != "approx-act+ms-norm" {
		t.Errorf("variant not passed to the process: %+v", cr.Memfit[1].Result)
	}
	if len(run.Problems) != 1 || !strings.Contains(run.Problems[0], "broken failed") || !strings.Contains(run.Problems[0], "it broke") {
		t.Errorf("problems %q", run.Problems)
	}
	if _, err := os.Stat(filepath.Join(o.WorkDir, "batch-"+cases[0].Tag()+".safetensors")); err != nil {
		t.Errorf("no batch file: %v", err)
	}
	var buf bytes.Buffer
	if err := WriteCPURun(&buf, run); err != nil {
		t.Fatal(err)
	}
	table := buf.String()
	for _, want := range []string{"(a)  PyTorch", "approx-act+ms-norm", "broken", "failed", "1.500", "all agree", "-0.1 vs -0.09",
		"goals (a): memfit plain step 1.50x PyTorch's (<= 1.5: met); approx-act+ms-norm 1.000x memfit plain's (<= 1.03: met)", "BLAS: OpenBLAS test",
		"note: a note", "note: another", "300.0 MiB", "600.0 MiB", "ru_maxrss", "VmHWM", "estimate: test", "PROBLEM: a-vit-tiny-full-memfit-broken failed"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	for _, line := range strings.Split(table, "\n") {
		if len(line) > 150 {
			t.Errorf("line longer than 150 characters: %q", line)
		}
	}
	b, err := json.Marshal(run)
	if err != nil {
		t.Fatal(err)
	}
	var back CPURun
	if err := json.Unmarshal(b, &back); err != nil || back.Cases[0].Memfit[0].StepVsPyTorch != 1.5 || back.Settings != run.Settings {
		t.Errorf("JSON round trip: %v %+v", err, back)
	}

	// A reference whose first loss differs is a failure the table shows.
	torch.Losses = []float64{2.6, 2.5}
	o.Python, o.Variants = fakeSide(t, dir, "torch", torch), []string{"plain"}
	run, err = RunCPUCompare(o)
	if err != nil {
		t.Fatal(err)
	}
	if run.Cases[0].PyTorch.StepSeconds = []float64{1, 2, 3}; len(noisyRows(run)) != 1 {
		t.Errorf("noisy rows %q", noisyRows(run))
	}
	if len(run.Problems) != 1 || !strings.Contains(run.Problems[0], "do not run the same model") {
		t.Errorf("problems %q", run.Problems)
	}
	buf.Reset()
	WriteCPURun(&buf, run)
	if !strings.Contains(buf.String(), "DISAGREEMENT") || !strings.Contains(buf.String(), "NOISE: ") {
		t.Errorf("the table does not show the disagreement:\n%s", buf.String())
	}
}

func TestCPUSettingsAndMedian(t *testing.T) {
	s := DefaultCPUSettings()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []func(*CPUSettings){func(s *CPUSettings) { s.Warmup = 0 }, func(s *CPUSettings) { s.Steps = 0 },
		func(s *CPUSettings) { s.DType = "bfloat16" }} {
		b := s
		bad(&b)
		if b.Validate() == nil {
			t.Errorf("accepted %+v", b)
		}
	}
	if _, err := s.Config(CPUCase{Method: "qlora"}, "plain"); err == nil {
		t.Error("a method the reference lacks was accepted")
	}
	if median([]float64{3, 1, 2}) != 2 || median([]float64{4, 1, 3, 2}) != 2.5 || median(nil) != 0 {
		t.Error("median")
	}
	if runtime.GOOS == "linux" && ProcHWM() <= 0 {
		t.Error("no VmHWM")
	}
	if c := (CPUCase{Batch: 4, Seq: 256}); c.PerStep() != 1024 || c.Unit() != "tokens/s" {
		t.Errorf("per step %d %s", c.PerStep(), c.Unit())
	}
	if d, err := RobertaCPUCase(filepath.Join("..", "pretrained", "roberta-tiny")); err != nil || d.Key != "d" || d.Method != "full" || d.PerStep() != 32*128 {
		t.Errorf("case d %+v, %v", d, err)
	}
	if _, err := RobertaCPUCase(t.TempDir()); err == nil {
		t.Error("a folder without config.json was accepted as case d")
	}
	if m := MachineInfo(); m.Cores <= 0 || m.CPU == "" {
		t.Errorf("machine %+v", m)
	}
}

// TestCPUQLoRARows: a LoRA case named in QLoRACases also runs memfit's QLoRA rows (the step process gets the
// qlora/ variants and trains NF4 base weights), compared with memfit's LoRA plain step only.
func TestCPUQLoRARows(t *testing.T) {
	dir := t.TempDir()
	cases := tinyCPUCases(t, dir)[:2]
	cfg, err := tinySettings().Config(cases[1], QLoRAPrefix+"approx-act+ms-norm")
	if err != nil || cfg.Method != "qlora" || !cfg.ApproxAct || !cfg.MSNorm {
		t.Fatalf("qlora config %+v, %v", cfg, err)
	}
	if _, err := tinySettings().Config(cases[0], QLoRAPrefix+"plain"); err == nil {
		t.Errorf("a QLoRA row of the full fine-tuning case was accepted")
	}
	memfit := CPUSideResult{Side: "memfit", Variant: "VARIANT", Losses: []float64{2.5, 2.4}, StepSeconds: []float64{2}, MedianSeconds: 2,
		Unit: "tokens/s", Versions: map[string]string{"go": "go1.x"}}
	torch := CPUSideResult{Side: "pytorch", Variant: "plain", Losses: []float64{2.5, 2.41}, StepSeconds: []float64{2}, MedianSeconds: 2,
		Unit: "tokens/s"}
	o := CPUCompareOptions{Cases: cases[1:], Variants: []string{"plain", "approx-act+ms-norm"}, Settings: tinySettings(), LossTol: 1e-4,
		WorkDir: filepath.Join(dir, "work"), OutDir: filepath.Join(dir, "out"), Memfit: fakeSide(t, dir, "memfit", memfit),
		Python: fakeSide(t, dir, "torch", torch), QLoRACases: []string{"b"}}
	run, err := RunCPUCompare(o)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range run.Cases[0].Memfit {
		got = append(got, m.Variant+"="+m.Result.Variant)
		if strings.HasPrefix(m.Variant, QLoRAPrefix) && (m.StepVsPyTorch != 0 || m.StepVsPlain != 1) {
			t.Errorf("QLoRA row %+v: want a ratio to memfit plain only", m)
		}
	}
	want := "plain=plain approx-act+ms-norm=approx-act+ms-norm qlora/plain=qlora/plain qlora/approx-act+ms-norm=qlora/approx-act+ms-norm"
	if strings.Join(got, " ") != want {
		t.Errorf("rows %q, want %q", strings.Join(got, " "), want)
	}
	var buf bytes.Buffer
	if err := WriteCPURun(&buf, run); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "qlora/plain 1.000x memfit plain's (LoRA; informational)") || strings.Contains(buf.String(), "qlora/plain 0.0e+00") {
		t.Errorf("table:\n%s", buf.String())
	}
}

// TestMergeRounds: a row run in rounds reports the median of the rounds' medians, every step, the largest
// resident set, and skips a failed round.
func TestMergeRounds(t *testing.T) {
	r := func(med float64, rss int64) *CPUSideResult {
		return &CPUSideResult{Losses: []float64{2}, StepSeconds: []float64{med}, MedianSeconds: med, PerSecond: 10 / med, MaxRSSBytes: rss}
	}
	m := mergeRounds([]*CPUSideResult{r(3, 100), nil, r(1, 300), r(2, 200)})
	if m.MedianSeconds != 2 || len(m.StepSeconds) != 3 || m.MaxRSSBytes != 300 || math.Abs(m.PerSecond-5) > 1e-12 ||
		len(m.RoundMedians) != 3 {
		t.Errorf("merged %+v", m)
	}
	if mergeRounds([]*CPUSideResult{nil, nil}) != nil {
		t.Errorf("all rounds failed: want nil")
	}
	if one := r(4, 1); mergeRounds([]*CPUSideResult{one}).RoundMedians != nil {
		t.Errorf("one round: want no round medians")
	}
}

// TestCPUInterleaved trains two variants of a tiny case in one process in turns: every timed step of each is
// recorded, the first variant's ratio to itself is 1, and the goals line judges the variants by the interleaved
// ratio.
func TestCPUInterleaved(t *testing.T) {
	dir := t.TempDir()
	c := tinyCPUCases(t, dir)[1]
	s := tinySettings()
	spec := CPUSpec{Case: c, Settings: s, BatchFile: filepath.Join(dir, "batch.safetensors")}
	if err := WriteCPUBatch(c, s, spec.BatchFile); err != nil {
		t.Fatal(err)
	}
	backend, err := engine.NewBackend(engine.DefaultBackend)
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	r, err := RunCPUInterleaved(backend, spec, []string{"plain", "approx-act+ms-norm"})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.StepSeconds) != 2 || len(r.StepSeconds[0]) != s.Steps || len(r.StepSeconds[1]) != s.Steps || r.RatioToFirst[0] != 1 ||
		!(r.RatioToFirst[1] > 0) || !(r.MedianSeconds[1] > 0) {
		t.Fatalf("interleaved %+v", r)
	}
	if _, err := RunCPUInterleaved(backend, spec, []string{"plain"}); err == nil {
		t.Errorf("one variant accepted")
	}
	run := CPURun{Variants: []string{"plain", "approx-act+ms-norm"}, Cases: []CPUCaseResult{{Case: c, Interleaved: &r,
		Memfit: []CPUMemfitResult{{Variant: "plain", Result: &CPUSideResult{Variant: "plain", Losses: []float64{1}, MedianSeconds: 1}},
			{Variant: "approx-act+ms-norm", Result: &CPUSideResult{Variant: "approx-act+ms-norm", Losses: []float64{1}, MedianSeconds: 1.5}, StepVsPlain: 1.5}}}}}
	var buf bytes.Buffer
	if err := WriteCPURun(&buf, run); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "interleaved in one process (1.500x in separate processes)") || !strings.Contains(buf.String(), "interleaved: memfit's variants") {
		t.Errorf("table:\n%s", buf.String())
	}
}
