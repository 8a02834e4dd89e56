package cli_test

import (
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The parquet fixtures (data/hfdata/testdata) were written by DuckDB and parquet-wasm (arrow-rs) from the JSONL
// beside them: training on the parquet file must start from the loss of training on its source.

const hfTestdata = "../data/hfdata/testdata"

// firstLoss trains one step and returns its loss.
func firstLoss(t *testing.T, args ...string) float64 {
	t.Helper()
	out := filepath.Join(t.TempDir(), "run")
	args = append([]string{"train", "--out", out, "--steps", "1", "--log-every", "1", "--seed", "3"}, args...)
	_, stderr, code := run(t, args...)
	if code != 0 {
		t.Fatalf("%v: exit %d\n%s", args, code, stderr)
	}
	m := readMetrics(t, filepath.Join(out, "metrics.jsonl"))
	loss, ok := m[0]["loss"].(float64)
	if !ok {
		t.Fatalf("metrics %v has no loss", m[0])
	}
	t.Logf("%v: first loss %v", args[8:], loss)
	return loss
}

// TestTrainOnAlpacaParquet: llama-tiny on the Alpaca parquet files of both writers (LZ4_RAW ones too), on the hub folder's train
// split and through --columns starts from the loss of the Alpaca JSONL they were made from.
func TestTrainOnAlpacaParquet(t *testing.T) {
	llama := filepath.Join("..", "pretrained", "llama-tiny")
	common := []string{"--model", llama, "--batch-size", "4", "--seq-len", "96", "--method", "lora"}
	want := firstLoss(t, append(common, "--data", filepath.Join(hfTestdata, "alpaca.jsonl"))...)
	// probe/alpaca-lz4*: LZ4_RAW pages, v1 and v2 (issue 36, pq29_lz4).
	for _, data := range []string{"alpaca.duckdb.parquet", "alpaca.arrow.parquet", "probe/alpaca-lz4.duckdb.parquet", "probe/alpaca-lz4-v2.arrow.parquet"} {
		if got := firstLoss(t, append(common, "--data", filepath.Join(hfTestdata, data))...); got != want {
			t.Errorf("%s: first loss %v, the JSONL's %v", data, got, want)
		}
	}
	// The hub folder's train split holds the JSONL's first 40 rows: the same loss as those rows as JSONL.
	lines, _ := os.ReadFile(filepath.Join(hfTestdata, "alpaca.jsonl"))
	head := filepath.Join(t.TempDir(), "head.jsonl")
	os.WriteFile(head, []byte(strings.Join(strings.SplitAfter(string(lines), "\n")[:40], "")), 0o644)
	want40 := firstLoss(t, append(common, "--data", head)...)
	if got := firstLoss(t, append(common, "--data", filepath.Join(hfTestdata, "hub-alpaca"), "--split", "train")...); got != want40 {
		t.Errorf("hub-alpaca --split train: first loss %v, its rows' JSONL %v", got, want40)
	}
	_, stderr, _ := run(t, append([]string{"train", "--out", filepath.Join(t.TempDir(), "run"), "--steps", "1", "--data", filepath.Join(hfTestdata, "hub-alpaca")}, common...)...)
	if !strings.Contains(stderr, "hub-alpaca (split train): 2 parquet file(s): read as Alpaca rows (instruction, input, output)") {
		t.Errorf("the run does not say what it read:\n%s", stderr)
	}
	if want40 == want {
		t.Errorf("the 40-row subset should draw another first batch than the 48 rows")
	}
}

// TestTrainOnTextParquetColumns: a text parquet read through --columns text=sentence trains from the loss of
// the same sentences as a plain-text file's paragraphs.
func TestTrainOnTextParquetColumns(t *testing.T) {
	llama := filepath.Join("..", "pretrained", "llama-tiny")
	var paras []string
	raw, _ := os.ReadFile(filepath.Join(hfTestdata, "sst2.jsonl"))
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var r struct{ Sentence string }
		json.Unmarshal([]byte(line), &r)
		paras = append(paras, r.Sentence)
	}
	txt := filepath.Join(t.TempDir(), "sst2.txt")
	os.WriteFile(txt, []byte(strings.Join(paras, "\n\n")+"\n"), 0o644)
	common := []string{"--model", llama, "--batch-size", "2", "--seq-len", "32", "--method", "lora"}
	want := firstLoss(t, append(common, "--data", txt)...)
	got := firstLoss(t, append(common, "--data", filepath.Join(hfTestdata, "sst2.duckdb.parquet"), "--columns", "text=sentence")...)
	if got != want {
		t.Errorf("parquet text=sentence: first loss %v, the text file's %v", got, want)
	}
}

// TestTrainOnImageParquet: a ViT on the CIFAR-10 images parquet (PNG bytes in datasets' image struct) starts
// from the loss of the same PNGs as an image folder.
func TestTrainOnImageParquet(t *testing.T) {
	tmp := t.TempDir()
	model := filepath.Join(tmp, "vit")
	if _, e, code := run(t, "init", "--arch", "vit", "--preset", "tiny", "--num-labels", "10", "--out", model); code != 0 {
		t.Fatal(e)
	}
	raw, _ := os.ReadFile(filepath.Join(hfTestdata, "images.jsonl"))
	folder := filepath.Join(tmp, "images")
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var r struct {
			Image struct{ Bytes, Path string }
		}
		json.Unmarshal([]byte(line), &r)
		b, _ := base64.StdEncoding.DecodeString(r.Image.Bytes)
		p := filepath.Join(folder, filepath.FromSlash(r.Image.Path))
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, b, 0o644)
	}
	common := []string{"--model", model, "--batch-size", "4", "--method", "lora", "--lora-targets", "q,v", "--train-modules", "classifier"}
	want := firstLoss(t, append(common, "--data", folder)...)
	for _, data := range []string{"images.duckdb.parquet", "images.arrow.parquet"} {
		if got := firstLoss(t, append(common, "--data", filepath.Join(hfTestdata, data))...); got != want {
			t.Errorf("%s: first loss %v, the image folder's %v", data, got, want)
		}
	}
	// JPEG bytes in a plain binary column against the same JPEGs as a folder.
	raw, _ = os.ReadFile(filepath.Join(hfTestdata, "images-jpeg.jsonl"))
	jpegs := filepath.Join(tmp, "jpegs")
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var r struct{ Image, Path string }
		json.Unmarshal([]byte(line), &r)
		b, _ := base64.StdEncoding.DecodeString(r.Image)
		p := filepath.Join(jpegs, filepath.FromSlash(r.Path))
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, b, 0o644)
	}
	want = firstLoss(t, append(common, "--data", jpegs)...)
	if got := firstLoss(t, append(common, "--data", filepath.Join(hfTestdata, "images-jpeg.duckdb.parquet"))...); got != want {
		t.Errorf("images-jpeg.duckdb.parquet: first loss %v, the JPEG folder's %v", got, want)
	}
}

// TestTrainOnGLUEParquet: a LLaMA sequence classifier on the hub-style SST-2 parquet (sentence, label) with
// --task sst2 starts from the loss of the same rows as a GLUE TSV root.
func TestTrainOnGLUEParquet(t *testing.T) {
	tmp := t.TempDir()
	cls := filepath.Join(tmp, "cls")
	if _, e, code := run(t, "init", "--from", filepath.Join("..", "pretrained", "llama-tiny"), "--num-labels", "2", "--out", cls); code != 0 {
		t.Fatal(e)
	}
	raw, _ := os.ReadFile(filepath.Join(hfTestdata, "sst2.jsonl"))
	tsv := "sentence\tlabel\n"
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var r struct {
			Sentence string
			Label    int
		}
		json.Unmarshal([]byte(line), &r)
		tsv += r.Sentence + "\t" + string(rune('0'+r.Label)) + "\n"
	}
	root := filepath.Join(tmp, "glue")
	os.MkdirAll(filepath.Join(root, "SST-2"), 0o755)
	os.WriteFile(filepath.Join(root, "SST-2", "train.tsv"), []byte(tsv), 0o644)
	common := []string{"--model", cls, "--batch-size", "4", "--seq-len", "48", "--method", "lora", "--task", "sst2"}
	want := firstLoss(t, append(common, "--data", root, "--data-format", "glue")...)
	if got := firstLoss(t, append(common, "--data", filepath.Join(hfTestdata, "sst2.duckdb.parquet"))...); got != want {
		t.Errorf("sst2 parquet: first loss %v, the TSV's %v", got, want)
	}
}

// TestResumeOnParquetSplit: a run on a hub folder's split resumes from its checkpoint (run.yaml keeps --split and
// --columns) and continues with the losses of the uninterrupted run.
func TestResumeOnParquetSplit(t *testing.T) {
	tmp := t.TempDir()
	args := func(out, steps string) []string {
		return []string{"train", "--model", filepath.Join("..", "pretrained", "llama-tiny"), "--data", filepath.Join(hfTestdata, "hub-text"),
			"--split", "test", "--columns", "text=text", "--out", out, "--steps", steps, "--batch-size", "2", "--seq-len", "64",
			"--method", "lora", "--log-every", "1", "--checkpoint-every", "1"}
	}
	whole, part := filepath.Join(tmp, "whole"), filepath.Join(tmp, "part")
	for _, a := range [][]string{args(whole, "3"), args(part, "2"), {"train", "--out", part, "--resume", "--steps", "3"}} {
		if _, stderr, code := run(t, a...); code != 0 {
			t.Fatalf("%v: exit %d\n%s", a, code, stderr)
		}
	}
	spec, _ := os.ReadFile(filepath.Join(part, "run.yaml"))
	if !strings.Contains(string(spec), "split: test") || !strings.Contains(string(spec), "columns: text=text") {
		t.Errorf("run.yaml lacks the parquet options:\n%s", spec)
	}
	w, p := readMetrics(t, filepath.Join(whole, "metrics.jsonl")), readMetrics(t, filepath.Join(part, "metrics.jsonl"))
	if len(w) != 3 || len(p) != 3 || w[2]["loss"] != p[2]["loss"] {
		t.Errorf("step 3: uninterrupted %v, resumed %v", w[len(w)-1], p[len(p)-1])
	}
}

// TestTrainOnMessagesParquet: conversations from parquet (the OpenAI messages form written by DuckDB and by
// arrow-rs, and ShareGPT's form renamed with --columns) train from the loss of the same conversations as JSONL,
// packed or not.
func TestTrainOnMessagesParquet(t *testing.T) {
	llama := filepath.Join("..", "pretrained", "llama-tiny")
	for _, packing := range []bool{false, true} {
		common := []string{"--model", llama, "--batch-size", "4", "--seq-len", "128", "--method", "lora"}
		if packing {
			common = append(common, "--packing")
		}
		want := firstLoss(t, append(common, "--data", filepath.Join(hfTestdata, "messages.jsonl"))...)
		for _, args := range [][]string{
			{"--data", filepath.Join(hfTestdata, "messages.duckdb.parquet")},
			{"--data", filepath.Join(hfTestdata, "messages.arrow.parquet")},
			{"--data", filepath.Join(hfTestdata, "sharegpt.duckdb.parquet"), "--columns", "messages=conversations"},
		} {
			if got := firstLoss(t, append(common, args...)...); got != want {
				t.Errorf("packing %v, %v: first loss %v, the JSONL's %v", packing, args, got, want)
			}
		}
	}
}
