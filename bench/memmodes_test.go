package bench

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/plan"
)

// TestReadMemoryModes assembles memory-modes.json from the files memory_modes.sh writes (finetune memory's and
// bench step's JSON, peft_compare.py's) and checks issue 35's targets on them.
func TestReadMemoryModes(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, v any) {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const gib = int64(1) << 30
	variant := func(name string, peak, planned int64) plan.StepMemory {
		return plan.StepMemory{Name: name, PeakBytes: peak, PeakMethod: string(memory.MethodXLACompiled), OptimizerBytes: gib / 10,
			TotalBytes: peak + gib/10, BesideTotalBytes: planned, SavedActivationBytes: peak / 2}
	}
	write("compile__llama-1b__lora__ties1.json", plan.Report{Backend: "xla", Ties: true, Beside: "Go Backend", Variants: []plan.StepMemory{
		variant("plain", 75*gib/10, 78*gib/10), variant("approx-act", 70*gib/10, 73*gib/10), variant("approx-act+mesa", 72*gib/10, 62*gib/10),
		variant("grad-ckpt", 40*gib/10, 44*gib/10), variant("approx-act+ms-norm", 68*gib/10, 70*gib/10)}})
	write("step__llama-1b__lora__plain.json", StepResult{TimedCell: TimedCell{PeakBytes: 77 * gib / 10, PeakMethod: string(memory.MethodXLACompiled), StepSeconds: 0.062},
		DevicePeakBytes: 79 * gib / 10})
	write("step__llama-1b__lora__grad-ckpt.json", StepResult{TimedCell: TimedCell{PeakBytes: 42 * gib / 10, PeakMethod: string(memory.MethodXLACompiled), StepSeconds: 0.077},
		DevicePeakBytes: 44 * gib / 10})
	write("compile__llama-1b__lora__ties0__L6.json", plan.Report{Backend: "xla", Variants: []plan.StepMemory{variant("plain", 3*gib, 0), variant("grad-ckpt", 33*gib/10, 0)}})
	write("compile__llama-1b__lora__ties1__L6.json", plan.Report{Backend: "xla", Ties: true, Variants: []plan.StepMemory{variant("plain", 3*gib, 0), variant("grad-ckpt", 2*gib, 0)}})
	write("pytorch__llama-1b__lora__plain.json", map[string]any{"peak_bytes": 9 * gib, "peak_method": "torch.cuda.max_memory_allocated", "step_seconds": 0.05, "compute": "float32"})
	write("pytorch__llama-7b__lora-bf16-for-qlora__plain.json", map[string]any{"peak_bytes": 20 * gib, "step_seconds": 0.4})
	write("compile__vit-b16__lora-all__ties1.json", plan.Report{Backend: "xla", Ties: true, Variants: []plan.StepMemory{variant("plain", 4*gib, 0), variant("approx-act+ms-norm", 29*gib/10, 0)}})
	write("step__vit-b16__lora-all__plain.json", StepResult{TimedCell: TimedCell{StepSeconds: 0.100}, DevicePeakBytes: 4 * gib})
	write("step__vit-b16__lora-all__approx-act+ms-norm.json", StepResult{TimedCell: TimedCell{StepSeconds: 0.105}, DevicePeakBytes: 3 * gib})
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("ignored"), 0o644); err != nil {
		t.Fatal(err)
	}

	m, err := ReadMemoryModes(dir)
	if err != nil {
		t.Fatal(err)
	}
	find := func(model, method, mode string, layers int, ties bool) MemoryModeRow {
		for _, r := range m.Rows {
			if r.Model == model && r.Method == method && r.Mode == mode && r.Layers == layers && (r.Ties == nil && model == "llama-7b" || r.Ties != nil && *r.Ties == ties) {
				return r
			}
		}
		t.Fatalf("no row %s %s %s L%d ties %v in %+v", model, method, mode, layers, ties, m.Rows)
		return MemoryModeRow{}
	}
	plain := find("llama-1b", "lora", "plain", 0, true)
	if plain.DevicePeakBytes == nil || *plain.DevicePeakBytes != 79*gib/10 || *plain.CompiledPeakBytes != 77*gib/10 || *plain.PlannedBytes != 78*gib/10 ||
		*plain.StepSeconds != 0.062 || !strings.Contains(plain.CompiledSource, "bench step") || len(plain.Files) != 2 {
		t.Errorf("llama-1b plain: %+v", plain)
	}
	mesa := find("llama-1b", "lora", "approx-act+mesa", 0, true)
	if mesa.DevicePeakBytes != nil || mesa.StepSeconds != nil || *mesa.CompiledPeakBytes != 72*gib/10+gib/10 || !strings.Contains(mesa.CompiledSource, "finetune memory") {
		t.Errorf("llama-1b approx-act+mesa (compile only): %+v", mesa)
	}
	if off := find("llama-1b", "lora", "grad-ckpt", 6, false); off.Ties == nil || *off.Ties || off.Layers != 6 {
		t.Errorf("cut model, ties off: %+v", off)
	}
	if py := find("llama-7b", "lora-bf16-for-qlora", "plain", 0, false); py.Side != SidePyTorch || py.Ties != nil || !strings.Contains(py.Note, "stands in for QLoRA") {
		t.Errorf("PyTorch's QLoRA stand-in: %+v", py)
	}
	// The JSON rows carry exactly the fields, null where a figure is missing.
	b, _ := json.Marshal(m.Rows)
	var generic []map[string]any
	if err := json.Unmarshal(b, &generic); err != nil {
		t.Fatal(err)
	}
	for _, r := range generic {
		for _, k := range []string{"model", "method", "mode", "device_peak_bytes", "compiled_peak_bytes", "planned_bytes", "step_seconds"} {
			if _, ok := r[k]; !ok {
				t.Errorf("row %v lacks %q", r["mode"], k)
			}
		}
	}

	status := map[string]string{}
	for _, c := range m.Checks {
		status[c.Name] = c.Status
	}
	for name, want := range map[string]string{
		"llama-1b lora grad-ckpt <= plain":                              "PASS", // device to device: 4.4 / 7.9
		"llama-1b lora grad-ckpt <= 0.60x plain":                        "PASS",
		"llama-1b lora approx-act+mesa < approx-act":                    "FAIL", // compiled 7.3 vs 7.1
		"llama-1b lora approx-act <= plain":                             "PASS",
		"llama-1b lora plain planned within 10%":                        "PASS", // 7.8 vs device 7.9
		"llama-1b lora approx-act+mesa planned within 10%":              "FAIL", // 6.2 vs compiled 7.3
		"vit-b16 lora-all approx-act+ms-norm <= 0.75x plain":            "PASS", // device 3/4
		"vit-b16 lora-all approx-act+ms-norm throughput >= 0.97x plain": "FAIL", // 0.100/0.105 = 0.952
		"llama-1b lora approx-act+ms-norm throughput >= 0.97x plain":    "SKIP",
		"vit-b16 lora-all plain planned within 10%":                     "", // no pure-Go plan in the file: no check
		"llama-1b lora approx-act+ms-norm <= plain":                     "PASS",
	} {
		if status[name] != want {
			t.Errorf("check %q: %q, want %q (checks %+v)", name, status[name], want, m.Checks)
		}
	}
	if miss := m.Missing(); len(miss) != 1 || miss[0] != "llama-1b lora approx-act+mesa" {
		t.Errorf("missing targets: %v", miss)
	}
	var md bytes.Buffer
	if err := m.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| llama-1b | lora | grad-ckpt | memfit | 4.400 GiB |", "| llama-1b | lora | 6 | grad-ckpt | 3.400 GiB | 2.100 GiB | 0.618 |", "| llama-1b | lora | plain | pytorch+peft | 9.000 GiB |",
		"| llama-1b lora approx-act+mesa < approx-act | FAIL |"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("markdown lacks %q:\n%s", want, md.String())
		}
	}
	if _, err := ReadMemoryModes(t.TempDir()); err == nil {
		t.Error("an empty folder gave no error")
	}
	write("compile__x__y.json", plan.Report{})
	if _, err := ReadMemoryModes(dir); err == nil || !strings.Contains(err.Error(), "ties{0,1}") {
		t.Errorf("a badly named file: %v", err)
	}
}
