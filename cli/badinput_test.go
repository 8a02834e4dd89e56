package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/safetensors"
)

// TestBadInputSweep runs bad commands of every kind through the CLI, as a tough user would: each must end with a
// non-zero exit and one line "finetune: ..." naming the cause (ideally the given fragment), with no panic, stack
// or Go runtime error text anywhere in the output. The count is reported in docs/reliability.md.
func TestBadInputSweep(t *testing.T) {
	tmp := t.TempDir()
	vit := filepath.Join(tmp, "vit")
	run(t, "init", "--arch", "vit", "--preset", "tiny", "--num-labels", "3", "--out", vit)
	data := filepath.Join(tmp, "train.safetensors")
	writeImageData(t, data, 12)
	llama := filepath.Join("..", "pretrained", "llama-tiny")
	text := filepath.Join(tmp, "story.txt")
	os.WriteFile(text, []byte(strings.Repeat("Once upon a time there was a model. ", 80)), 0o644)
	garbage := filepath.Join(tmp, "garbage.safetensors")
	os.WriteFile(garbage, []byte("\x10\x00\x00\x00\x00\x00\x00\x00{not json at all"), 0o644)
	empty := filepath.Join(tmp, "empty")
	os.MkdirAll(empty, 0o755)
	badJSON := filepath.Join(tmp, "inputs.json")
	os.WriteFile(badJSON, []byte("{\"input_ids\": [[1, 2, 99999999]]}"), 0o644)
	badPred := filepath.Join(tmp, "pred.txt")
	os.WriteFile(badPred, []byte("1\nx\n"), 0o644)
	out := func(name string) string { return filepath.Join(tmp, "runs", name) }
	hugeConfig := filepath.Join(tmp, "huge")
	os.MkdirAll(hugeConfig, 0o755)
	cfgBytes, _ := os.ReadFile(filepath.Join(llama, "config.json"))
	os.WriteFile(filepath.Join(hugeConfig, "config.json"), []byte(strings.Replace(string(cfgBytes), `"num_hidden_layers": 4`, `"num_hidden_layers": 1000000000`, 1)), 0o644)
	emptyRow := filepath.Join(tmp, "empty-row.json")
	os.WriteFile(emptyRow, []byte(`{"input_ids": [[]]}`), 0o644)
	bigImages := filepath.Join(tmp, "big.safetensors") // 64x64 images for a 32x32 model
	safetensors.WriteTensors(bigImages, map[string]*tensors.Tensor{
		"pixel_values": tensors.FromFlatDataAndDimensions(make([]float32, 4*3*64*64), 4, 3, 64, 64),
		"labels":       tensors.FromFlatDataAndDimensions(make([]int32, 4), 4)}, "", nil)
	intPixels := filepath.Join(tmp, "int.safetensors")
	safetensors.WriteTensors(intPixels, map[string]*tensors.Tensor{
		"pixel_values": tensors.FromFlatDataAndDimensions(make([]int32, 4*3*32*32), 4, 3, 32, 32),
		"labels":       tensors.FromFlatDataAndDimensions(make([]int32, 4), 4)}, "", nil)
	// A LLaMA with 16 positions (MMLU prompts are longer) and a sequence classifier for GLUE.
	short := filepath.Join(tmp, "short")
	os.MkdirAll(short, 0o755)
	for _, name := range []string{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(llama, name))
		if err != nil {
			t.Fatal(err)
		}
		if name == "config.json" {
			b = []byte(strings.Replace(string(b), `"max_position_embeddings": 512`, `"max_position_embeddings": 16`, 1))
		}
		os.WriteFile(filepath.Join(short, name), b, 0o644)
	}
	mmlu := filepath.Join("..", "..", "shared", "data", "mmlu")
	glue := filepath.Join("..", "..", "shared", "data", "glue")
	cifar := filepath.Join("..", "..", "shared", "data", "cifar10", "cifar10-subset-jpg.tar")
	sst2 := filepath.Join(tmp, "sst2")
	run(t, "init", "--from", llama, "--num-labels", "2", "--out", sst2)

	cases := []struct {
		args []string
		want string
	}{
		{[]string{"train"}, "--out is required"},
		{[]string{"train", "--out", out("a")}, "--model and --data are required"},
		{[]string{"train", "--model", vit, "--data", data, "--out", out("b"), "--steps", "-1"}, "steps"},
		{[]string{"train", "--model", vit, "--data", data, "--out", out("c"), "--lr", "-1"}, "lr"},
		{[]string{"train", "--model", vit, "--data", data, "--out", out("d"), "--batch-size", "0"}, "batch"},
		{[]string{"train", "--model", vit, "--data", data, "--out", out("e"), "--accum-steps", "0"}, "accum"},
		{[]string{"train", "--model", vit, "--data", data, "--out", out("f"), "--optimizer", "lion"}, "optimizer"},
		{[]string{"train", "--model", vit, "--data", data, "--out", out("g"), "--schedule", "step"}, "schedule"},
		{[]string{"train", "--model", vit, "--data", data, "--out", out("h"), "--compute-dtype", "float16"}, "compute_dtype"},
		{[]string{"train", "--model", vit, "--data", data, "--out", out("i"), "--attention", "fast"}, "attention"},
		{[]string{"train", "--model", vit, "--data", data, "--out", out("j"), "--method", "dora"}, "method"},
		{[]string{"train", "--model", vit, "--data", data, "--out", out("k"), "--keep-checkpoints", "-2"}, "keep_checkpoints"},
		{[]string{"train", "--model", vit, "--data", data, "--out", out("l"), "--divergence-factor", "-1"}, "divergence_factor"},
		{[]string{"train", "--model", vit, "--data", garbage, "--out", out("m")}, "garbage.safetensors"},
		{[]string{"train", "--model", empty, "--data", data, "--out", out("n")}, "config.json"},
		{[]string{"train", "--model", vit, "--data", filepath.Join(tmp, "none.txt"), "--out", out("o")}, "no such file"},
		{[]string{"train", "--model", vit, "--data", text, "--out", out("p")}, "LLaMA"},
		{[]string{"train", "--model", llama, "--data", text, "--out", out("q"), "--seq-len", "-5"}, "--seq-len -5"},
		{[]string{"train", "--model", llama, "--data", data, "--out", out("r")}, "train.safetensors"},
		{[]string{"train", "--out", out("never"), "--resume"}, "not a training output folder"},
		{[]string{"train", "--model", vit, "--data", data, "--out", out("s"), "--backend", "tpu"}, "unknown backend"},
		{[]string{"memory"}, "--model is required"},
		{[]string{"memory", "--model", "llama-9000b"}, "llama-9000b"},
		{[]string{"memory", "--model", "llama:tiny", "--seq-len", "100000000"}, "1048576"},
		{[]string{"memory", "--model", "llama:tiny", "--max-seq-len", "100", "--budget", "lots"}, "lots"},
		{[]string{"memory", "--model", "vit:tiny", "--variants", "plain,magic"}, "magic"},
		{[]string{"init", "--arch", "gpt", "--out", out("t")}, "gpt"},
		{[]string{"init", "--arch", "vit", "--preset", "huge", "--out", out("u")}, "huge"},
		{[]string{"init", "--arch", "vit", "--num-labels", "-3", "--out", out("v")}, "--num-labels -3"},
		{[]string{"init", "--arch", "vit", "--out", vit}, "already holds a model"},
		{[]string{"export", "--run", out("never"), "--format", "peft", "--out", out("w")}, "never"},
		{[]string{"eval", "mmlu", "--model", vit}, ""},
		{[]string{"eval", "glue", "--task", "sst2", "--predictions", badPred, "--data", filepath.Join("..", "..", "shared", "data", "glue")}, "pred.txt:2"},
		{[]string{"logits", "--model", llama, "--inputs", badJSON}, "input_ids holds 99999999"},
		{[]string{"logits", "--model", vit}, "--model and --inputs are required"},
		{[]string{"tokenize", "--tokenizer", filepath.Join(tmp, "nope"), "hello"}, "nope"},
		{[]string{"bench", "blocks", "--layers", "0"}, "--layers 0"},
		{[]string{"eval", "mmlu", "--model", short, "--data", mmlu, "--subjects", "anatomy", "--seq-len", "100"}, "more than the model's 16 positions"},
		{[]string{"eval", "mmlu", "--model", short, "--data", mmlu, "--seq-len", "-4"}, "--seq-len -4"},
		{[]string{"eval", "mmlu", "--model", short, "--data", mmlu, "--shots", "-1"}, "--shots -1"},
		{[]string{"eval", "mmlu", "--model", short, "--data", mmlu, "--batch-size", "0"}, "--batch-size 0"},
		{[]string{"eval", "mmlu", "--model", short, "--data", mmlu, "--limit", "-5"}, "--limit -5"},
		{[]string{"eval", "glue", "--task", "sst2", "--model", sst2, "--data", glue, "--seq-len", "100000"}, "--seq-len 100000"},
		{[]string{"train", "--model", vit, "--data", cifar, "--out", out("x")}, "--split train"},
		{[]string{"memory", "--model", "vit:tiny"}, "--num-labels N"},
		{[]string{"memory", "--model", "vit:tiny", "--approx-act"}, "choose them with --variants"},
		{[]string{"init", "--arch", "vit", "--max-shard-mb", "-1", "--out", out("y")}, "--max-shard-mb -1"},
		{[]string{"bench", "step", "--model", "llama:tiny", "--seq-len", "0", "--batch-size", "1", "--steps", "1"}, "--seq-len 0"},
		{[]string{"bench", "step", "--model", "llama:tiny", "--seq-len", "-5", "--batch-size", "1", "--steps", "1"}, "--seq-len -5"},
		{[]string{"bench", "step", "--model", "llama:tiny", "--seq-len", "8", "--batch-size", "0", "--steps", "1"}, "--batch-size 0"},
		{[]string{"bench", "blocks", "--batch-size", "1000000000"}, "--batch-size 1000000000"},
		{[]string{"memory", "--model", "llama-7b", "--seq-len", "512", "--batch-size", "1000000000000000000"}, "--batch-size 1000000000000000000"},
		{[]string{"memory", "--model", "vit:tiny", "--num-labels", "-3"}, "--num-labels -3"},
		{[]string{"demo", "--steps", "0"}, "--steps 0"},
		{[]string{"eval", "superglue"}, "unknown command \"superglue\""},
		{[]string{"bench", "turbo"}, "unknown command \"turbo\""},
		{[]string{"logits", "--model", llama, "--inputs", emptyRow}, "empty axis"},
		{[]string{"init", "--from", vit, "--num-labels", "5", "--out", vit, "--overwrite"}, "is the --from model"},
		{[]string{"train", "--model", vit, "--data", bigImages, "--out", out("z"), "--batch-size", "2"}, "32x32"},
		{[]string{"train", "--model", vit, "--data", intPixels, "--out", out("z2"), "--batch-size", "2"}, "pixel_values are Int32"},
		{[]string{"eval", "glue", "--task", "sst2", "--model", llama, "--data", glue}, "is not a sequence classifier over tokens"},
		{[]string{"eval", "glue", "--task", "stsb", "--model", sst2, "--data", glue}, "a classifier of 2 labels"},
		{[]string{"eval", "mmlu", "--model", short, "--data", mmlu, "--out", tmp}, "is a folder"},
		{[]string{"eval", "mmlu", "--model", short, "--data", mmlu, "--out", filepath.Join(tmp, "no", "x.json")}, "does not exist"},
		{[]string{"train", "--model", filepath.Join(vit, "config.json"), "--data", data, "--out", out("z3")}, "is a file: a model is a folder"},
		{[]string{"memory", "--model", hugeConfig}, "more than memfit takes"},
		{[]string{"init", "--from", llama, "--num-labels", "2", "--dtype", "bfloat16", "--out", out("z4")}, "leave out --arch, --preset, --dtype"},
		{[]string{"frobnicate"}, "unknown command"},
		{[]string{"train", "--no-such-flag"}, "unknown flag"},
	}
	for _, c := range cases {
		_, stderr, code := run(t, c.args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		last := lines[len(lines)-1]
		if code == 0 || !strings.HasPrefix(last, "finetune: ") || !strings.Contains(last, c.want) {
			t.Errorf("%v: exit %d, last line %q; want a non-zero exit and a line naming %q", c.args, code, last, c.want)
		}
		for _, bad := range []string{"panic", "goroutine ", "runtime error", ".go:"} {
			if strings.Contains(stderr, bad) {
				t.Errorf("%v: %q in the output:\n%s", c.args, bad, stderr)
			}
		}
	}
	t.Logf("%d bad commands, each refused with one line", len(cases))
	// The model with 16 positions is evaluated on MMLU (prompts cut from the left), not refused.
	if _, stderr, code := run(t, "eval", "mmlu", "--model", short, "--data", mmlu, "--subjects", "anatomy", "--limit", "2", "--out", filepath.Join(tmp, "mmlu.json")); code != 0 {
		t.Errorf("MMLU on a model with 16 positions: exit %d\n%s", code, stderr)
	}
}
