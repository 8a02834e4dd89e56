package cli_test

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

// TestMemoryJSON runs finetune memory on an init-made folder and checks the JSON fields and the ordering the
// memory-saving variants must show.
func TestMemoryJSON(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "llama")
	if _, errOut, code := run(t, "init", "--arch", "llama", "--preset", "tiny", "--out", dir); code != 0 {
		t.Fatalf("init: exit %d: %s", code, errOut)
	}
	out, errOut, code := run(t, "memory", "--model", dir, "--lora-targets", "all-linear", "--batch-size", "2", "--seq-len", "16", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep struct {
		Variants []map[string]any `json:"variants"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	saved := map[string]float64{}
	for _, v := range rep.Variants {
		for _, key := range []string{"name", "saved_activation_bytes", "saved_by_kind", "peak_bytes", "peak_method",
			"weights_bytes", "optimizer_bytes", "trainable_params"} {
			if _, ok := v[key]; !ok {
				t.Errorf("variant %v lacks %q", v["name"], key)
			}
		}
		saved[v["name"].(string)] = v["saved_activation_bytes"].(float64)
	}
	if len(saved) != 6 {
		t.Fatalf("want 6 variants, got %v", saved)
	}
	if !(saved["mesa"] < saved["plain"]) {
		t.Errorf("Mesa keeps more than plain: %v", saved)
	}
	if !(saved["approx-act+ms-norm"] < saved["approx-act"] && saved["approx-act"] < saved["plain"] &&
		saved["ms-norm"] < saved["plain"] && saved["grad-ckpt"] < saved["approx-act+ms-norm"]) {
		t.Errorf("saved bytes not ordered as the methods promise: %v", saved)
	}

	table, errOut, code := run(t, "memory", "--model", "vit:tiny", "--num-labels", "3", "--batch-size", "2", "--variants", "plain,approx-act+ms-norm")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"approx-act+ms-norm", "saved act.: exact", "step peak: estimate", "ordering ties (docs/memory-saving.md, \"Order is data\") on"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	// --beside (on XLA the default, go): each variant planned on a second backend, its peak beside the first's.
	beside, errOut, code := run(t, "memory", "--model", "vit:tiny", "--num-labels", "3", "--batch-size", "2", "--variants", "plain,approx-act+mesa", "--beside", "go", "--json")
	if code != 0 {
		t.Fatalf("--beside go: exit %d: %s", code, errOut)
	}
	var br struct {
		Beside   string `json:"beside"`
		Ties     bool   `json:"ties"`
		Variants []struct {
			Name             string `json:"name"`
			PeakBytes        int64  `json:"peak_bytes"`
			BesidePeakBytes  int64  `json:"beside_peak_bytes"`
			BesideTotalBytes int64  `json:"beside_total_bytes"`
			TotalBytes       int64  `json:"total_bytes"`
		} `json:"variants"`
	}
	if err := json.Unmarshal([]byte(beside), &br); err != nil {
		t.Fatalf("--beside: not JSON: %v\n%s", err, beside)
	}
	if !strings.HasPrefix(br.Beside, "Go") || !br.Ties || len(br.Variants) != 2 || br.Variants[1].Name != "approx-act+mesa" {
		t.Fatalf("--beside go: %+v", br)
	}
	for _, v := range br.Variants { // the same backend twice: the same figures
		if v.BesidePeakBytes != v.PeakBytes || v.BesideTotalBytes != v.TotalBytes || v.PeakBytes == 0 {
			t.Errorf("--beside go, %s: peak %d beside %d, total %d beside %d", v.Name, v.PeakBytes, v.BesidePeakBytes, v.TotalBytes, v.BesideTotalBytes)
		}
	}
	if table, _, _ := run(t, "memory", "--model", "vit:tiny", "--num-labels", "3", "--batch-size", "2", "--variants", "plain", "--beside", "go"); !strings.Contains(table, "go peak") ||
		!strings.Contains(table, "go peak: the same step planned on Go") {
		t.Errorf("--beside go: no go peak column or note:\n%s", table)
	}
	if _, errOut, code := run(t, "memory", "--model", "vit:tiny", "--num-labels", "3", "--variants", "plain", "--beside", "xla:/nonexistent/plugin.so"); code != 2 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
		t.Errorf("--beside with a missing plugin: exit %d, %q", code, errOut)
	}
	fit, errOut, code := run(t, "memory", "--model", "llama:tiny", "--batch-size", "1", "--max-seq-len", "512", "--budget", "3MiB", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(fit, `"fits"`) || !strings.Contains(fit, `"max"`) {
		t.Errorf("--max-seq output: %s", fit)
	}
}

func TestMemoryBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"memory", "--model", "/nonexistent/model"}, 1, "neither a model folder nor a preset"},
		{[]string{"memory", "--model", "tiny"}, 1, "or llama:tiny or mistral:tiny"},
		{[]string{"memory", "--model", "vit-b16", "--method", "full", "--lora-r", "8"}, 2, "lora_r"},
		{[]string{"memory", "--model", "vit-b16", "--variants", "plain,fast"}, 2, "unknown variant"},
		{[]string{"memory", "--model", "vit-b16", "--max-batch-size", "64"}, 2, "--budget"},
		{[]string{"memory", "--model", "vit-b16", "--max-batch-size", "64", "--budget", "lots"}, 2, "not a size"},
		{[]string{"memory", "--model", "vit-b16", "--max-seq-len", "64", "--budget", "1GiB"}, 1, "LLaMA"},
		{[]string{"memory"}, 2, "--model is required"},
	} {
		_, errOut, code := run(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) || strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and one line with %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}

func TestBenchMemoryGrid(t *testing.T) {
	out, errOut, code := run(t, "bench", "memory", "--llama", "llama:tiny", "--vit-batch-size", "2", "--llama-batch-size", "1", "--llama-seq-len", "16")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"vit-b16, batch 2", "llama:tiny, batch 1, seq 16", "qlora", "lora-fa", "grad-ckpt", "mesa", "saved act.: exact"} {
		if !strings.Contains(out, want) {
			t.Errorf("grid lacks %q", want)
		}
	}
	if n := strings.Count(out, "approx-act+ms-norm"); n != 10 {
		t.Errorf("%d approx-act+ms-norm rows, want 10 (2 models x 5 methods)", n)
	}
}

// TestMemoryCompileTime: memory --compile-time builds each variant's step programs at a preset's shapes (no
// weights) and prints their compile times, as text and as JSON.
func TestMemoryCompileTime(t *testing.T) {
	out, errOut, code := run(t, "memory", "--model", "vit:tiny", "--num-labels", "3", "--lora-targets", "all-linear", "--batch-size", "2",
		"--variants", "plain,approx-act+ms-norm", "--compile-time")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"plain: compile on", "approx-act+ms-norm: compile on", "gradient step", "device-resident step"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	out, errOut, code = run(t, "memory", "--model", "vit:tiny", "--num-labels", "3", "--batch-size", "2", "--variants", "plain", "--compile-time", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep struct {
		Variant string             `json:"variant"`
		Compile map[string]float64 `json:"compile"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Variant != "plain" || rep.Compile["device_seconds"] <= 0 ||
		rep.Compile["gradient_seconds"] <= 0 {
		t.Errorf("JSON %v: %+v\n%s", err, rep, out)
	}
}
