package cli_test

import (
	"bytes"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeImageFolder writes root/<class>/<i>.png: 32x32 images whose dominant channel is the class.
func writeImageFolder(t *testing.T, root string, classes []string, per int) {
	t.Helper()
	for c, class := range classes {
		os.MkdirAll(filepath.Join(root, class), 0o755)
		for i := 0; i < per; i++ {
			img := image.NewRGBA(image.Rect(0, 0, 32, 32))
			for y := 0; y < 32; y++ {
				for x := 0; x < 32; x++ {
					v := [3]uint8{uint8(30 + 7*i), uint8(30 + 5*x), uint8(30 + 3*y)}
					v[c%3] = 220
					img.Set(x, y, color.RGBA{v[0], v[1], v[2], 255})
				}
			}
			var buf bytes.Buffer
			png.Encode(&buf, img)
			os.WriteFile(filepath.Join(root, class, string(rune('a'+i))+".png"), buf.Bytes(), 0o644)
		}
	}
}

// TestTrainOnImageFolder trains from a folder of PNGs (preprocessing, augmentation, resumable loader) and
// resumes exactly.
func TestTrainOnImageFolder(t *testing.T) {
	tmp := t.TempDir()
	model := filepath.Join(tmp, "vit")
	if _, e, code := run(t, "init", "--arch", "vit", "--preset", "tiny", "--num-labels", "3", "--out", model); code != 0 {
		t.Fatal(e)
	}
	images := filepath.Join(tmp, "images")
	writeImageFolder(t, images, []string{"blue", "green", "red"}, 6)
	out := filepath.Join(tmp, "run")
	_, errOut, code := run(t, "train", "--model", model, "--data", images, "--augment", "--out", out, "--steps", "2",
		"--batch-size", "4", "--lora-targets", "q,v", "--train-modules", "classifier", "--checkpoint-every", "1")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	first := readMetrics(t, filepath.Join(out, "metrics.jsonl"))
	spec, err := os.ReadFile(filepath.Join(out, "run.yaml"))
	if err != nil || !strings.Contains(string(spec), "augment: true") {
		t.Errorf("run.yaml lacks the data options: %s", spec)
	}
	if _, errOut, code = run(t, "train", "--out", out, "--resume", "--steps", "3"); code != 0 {
		t.Fatalf("resume: exit %d: %s", code, errOut)
	}
	if got := readMetrics(t, filepath.Join(out, "metrics.jsonl")); len(got) != len(first)+1 {
		t.Errorf("metrics after resume: %d lines, before %d", len(got), len(first))
	}
}

func TestTrainDataErrors(t *testing.T) {
	tmp := t.TempDir()
	model := filepath.Join(tmp, "vit")
	run(t, "init", "--arch", "vit", "--preset", "tiny", "--num-labels", "3", "--out", model)
	empty := filepath.Join(tmp, "empty")
	os.MkdirAll(filepath.Join(empty, "cls"), 0o755)
	two := filepath.Join(tmp, "two")
	writeImageFolder(t, two, []string{"a", "b"}, 2)
	bad := filepath.Join(tmp, "bad.jsonl")
	os.WriteFile(bad, []byte("{\"instruction\": \"a\", \"output\": \"b\"}\n{oops\n"), 0o644)
	weird := filepath.Join(tmp, "train.dat")
	os.WriteFile(weird, []byte("1,2,3\n"), 0o644)
	text := filepath.Join(tmp, "story.txt")
	os.WriteFile(text, []byte(strings.Repeat("Once upon a time there was a small model. ", 50)), 0o644)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--model", filepath.Join(tmp, "missing"), "--data", two}, 1, "missing"},
		{[]string{"--model", model, "--data", empty}, 1, "holds no images"},
		{[]string{"--model", model, "--data", two}, 1, "2 classes"},
		{[]string{"--model", model, "--data", bad}, 1, "alpaca data needs a Gemma 2, Gemma 3, LLaMA, Mistral, Phi-3, Qwen2 or Qwen3 model; this model is a ViT"},
		{[]string{"--model", model, "--data", two, "--data-format", "csv"}, 1, "unknown data format"},
		{[]string{"--model", filepath.Join("..", "pretrained", "llama-tiny"), "--data", bad}, 1, "bad.jsonl:2: not a JSON object"},
		{[]string{"--model", model, "--data", two, "--mesa", "gelu"}, 2, "unknown Mesa kind"},
		{[]string{"--model", model, "--data", filepath.Join(tmp, "train.csv")}, 1, "train.csv: no such file or folder"},
		{[]string{"--model", model, "--data", weird}, 1, "cannot tell its format from the name"},
		{[]string{"--model", filepath.Join("..", "pretrained", "llama-tiny"), "--data", text, "--seq-len", "-5"}, 1, "--seq-len -5: a sequence needs 2 to"},
		{[]string{"--model", filepath.Join("..", "pretrained", "llama-tiny"), "--data", text, "--seq-len", "100000000"}, 1, "max_position_embeddings"},
	} {
		out := filepath.Join(tmp, "out")
		args := append([]string{"train", "--out", out, "--steps", "1", "--batch-size", "2"}, tc.args...)
		_, stderr, code := run(t, args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		last := lines[len(lines)-1]
		if code != tc.code || !strings.Contains(last, tc.want) {
			t.Errorf("%v: exit %d, %q; want exit %d with %q", tc.args, code, last, tc.code, tc.want)
		}
		if _, err := os.Stat(filepath.Join(out, "checkpoint-1")); err == nil {
			t.Errorf("%v: a checkpoint was written", tc.args)
		}
	}
}

// TestAlpacaTruncationReported: Alpaca examples longer than --seq-len are counted as cut, those whose response
// is cut off entirely are left out and counted, and the run says so before training.
func TestAlpacaTruncationReported(t *testing.T) {
	tmp := t.TempDir()
	path := filepath.Join(tmp, "instr.jsonl")
	long := strings.Repeat("word ", 400)
	rows := []string{
		`{"instruction": "Say hi.", "input": "", "output": "Hi."}`,
		`{"instruction": "Say hi.", "input": "", "output": "` + long + `"}`,
		`{"instruction": "` + long + `", "input": "", "output": "Hi."}`,
	}
	os.WriteFile(path, []byte(strings.Join(rows, "\n")+"\n"), 0o644)
	_, stderr, code := run(t, "train", "--model", filepath.Join("..", "pretrained", "llama-tiny"), "--data", path,
		"--out", filepath.Join(tmp, "run"), "--steps", "1", "--batch-size", "2", "--seq-len", "128")
	if code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr)
	}
	for _, want := range []string{"2 of 3 examples are longer than --seq-len 128", "1 examples have no response token within --seq-len 128"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
}
