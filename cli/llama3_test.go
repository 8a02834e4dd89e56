package cli_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/safetensors"
)

// llama3Style copies pretrained/llama-tiny to dir with its config.json changed the way Llama-3.x Instruct
// configs differ from it: eos_token_id a list, llama3 rope scaling (and rope_theta 500000), and, when untied,
// tie_word_embeddings false with an lm_head.weight of its own (the embedding's copy). eos is the list.
func llama3Style(t *testing.T, dir string, eos []int, untied bool) {
	t.Helper()
	src := filepath.Join("..", "pretrained", "llama-tiny")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"model.safetensors", "tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(src, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := map[string]any{}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["eos_token_id"] = eos
	cfg["rope_theta"] = 500000.0
	cfg["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
		"original_max_position_embeddings": 128}
	if untied {
		cfg["tie_word_embeddings"] = false
		f, err := safetensors.Open(filepath.Join(src, "model.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		ts := map[string]*tensors.Tensor{}
		for _, n := range f.Names() {
			if ts[n], err = f.Tensor(n); err != nil {
				t.Fatal(err)
			}
		}
		f.Close()
		if ts["lm_head.weight"], err = ts["model.embed_tokens.weight"].Clone(); err != nil {
			t.Fatal(err)
		}
		if err := safetensors.WriteTensors(filepath.Join(dir, "model.safetensors"), ts, "", nil); err != nil {
			t.Fatal(err)
		}
	}
	out, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), out, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestLlama3StyleConfig: a model whose config.json reads like a Llama-3.x Instruct one (eos_token_id a list,
// llama3 rope scaling; tied and untied embeddings) trains, generates and exports through the CLI; generation stops
// at any id of the eos list (the second one here); the exported model keeps the list and the scaling.
func TestLlama3StyleConfig(t *testing.T) {
	tmp := t.TempDir()
	text := filepath.Join(tmp, "story.txt")
	os.WriteFile(text, []byte(strings.Repeat("Once upon a time there was a little model that liked to read. ", 40)), 0o644)
	prompt := "It was a bright cold day in April"
	generate := func(model string) generated {
		t.Helper()
		stdout, errOut, code := run(t, "generate", "--model", model, "--prompt", prompt, "--max-new-tokens", "12", "--json")
		if code != 0 {
			t.Fatalf("generate %s: exit %d: %s", model, code, errOut)
		}
		g := readGenerated(t, stdout)
		if len(g) != 1 {
			t.Fatalf("generate %s: %s", model, stdout)
		}
		return g[0]
	}
	for _, untied := range []bool{false, true} {
		name := map[bool]string{false: "tied", true: "untied"}[untied]
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join(tmp, name)
			// The eos list as the shipped model's EOS and another id: which one, the first token this model
			// generates (found with the one-id list), so that stopping at the second id shows.
			llama3Style(t, dir, []int{4094}, untied)
			first := generate(dir)
			if first.NewTokens < 2 || first.Completion == "" {
				t.Fatalf("the model generates %+v: want some tokens before EOS", first)
			}
			stdout, errOut, code := run(t, "generate", "--model", dir, "--prompt", prompt, "--max-new-tokens", "1", "--json", "--ignore-eos")
			if code != 0 {
				t.Fatalf("generate 1 token: exit %d: %s", code, errOut)
			}
			one := readGenerated(t, stdout)[0].Completion
			stdout, errOut, code = run(t, "tokenize", "--tokenizer", dir, "--no-special", one)
			var tok struct{ IDs []int }
			if code != 0 || json.Unmarshal([]byte(stdout), &tok) != nil || len(tok.IDs) != 1 {
				t.Fatalf("tokenize %q: exit %d, %s %s: want one id", one, code, stdout, errOut)
			}
			llama3Style(t, dir, []int{4094, tok.IDs[0]}, untied)
			c, err := llama.LoadConfig(dir)
			if err != nil || !slices.Equal(c.EOSIDs(), []int{4094, tok.IDs[0]}) || c.RopeScaling == nil {
				t.Fatalf("config: %+v, %v", c, err)
			}
			if g := generate(dir); g.Stop != "eos" || g.Completion != "" || g.NewTokens != 0 {
				t.Errorf("with eos_token_id [4094, %d] (the first token generated): %+v; want a stop at eos before any text", tok.IDs[0], g)
			}
			// generation_config.json's eos ids stop generation too (transformers' generate reads them; Llama-3
			// Instruct lists <|eot_id|> only there), and an id outside the vocabulary there is refused naming the file.
			llama3Style(t, dir, []int{4094}, untied)
			genCfg := filepath.Join(dir, "generation_config.json")
			os.WriteFile(genCfg, []byte(fmt.Sprintf(`{"bos_token_id": 1, "eos_token_id": [4094, %d]}`, tok.IDs[0])), 0o644)
			if g := generate(dir); g.Stop != "eos" || g.NewTokens != 0 {
				t.Errorf("with generation_config.json eos_token_id [4094, %d]: %+v; want a stop at eos before any text", tok.IDs[0], g)
			}
			os.WriteFile(genCfg, []byte(`{"eos_token_id": 99999}`), 0o644)
			if _, errOut, code := run(t, "generate", "--model", dir, "--prompt", prompt, "--max-new-tokens", "2"); code != 1 ||
				!strings.Contains(errOut, "generation_config.json: field \"eos_token_id\" holds 99999") {
				t.Errorf("generation_config.json eos 99999: exit %d, %q", code, errOut)
			}
			os.Remove(genCfg)
			llama3Style(t, dir, []int{4094, tok.IDs[0]}, untied)
			out := filepath.Join(tmp, name+"-run")
			if _, errOut, code := run(t, "train", "--model", dir, "--data", text, "--seq-len", "32", "--out", out,
				"--steps", "2", "--batch-size", "2", "--lora-targets", "all-linear"); code != 0 {
				t.Fatalf("train: exit %d: %s", code, errOut)
			}
			merged := filepath.Join(tmp, name+"-merged")
			if _, errOut, code := run(t, "export", "--run", out, "--format", "merged", "--out", merged); code != 0 {
				t.Fatalf("export merged: exit %d: %s", code, errOut)
			}
			if _, errOut, code := run(t, "export", "--run", out, "--format", "peft", "--out", filepath.Join(tmp, name+"-peft")); code != 0 {
				t.Fatalf("export peft: exit %d: %s", code, errOut)
			}
			m, err := llama.LoadConfig(merged)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(m.EOSIDs(), c.EOSIDs()) || m.RopeScaling == nil || !reflect.DeepEqual(*m.RopeScaling, *c.RopeScaling) || m.RopeTheta != 500000 ||
				m.TieWordEmbeddings == untied {
				t.Errorf("the merged export's config: eos %v, rope %+v theta %g, tied %v; want those of %s", m.EOSIDs(), m.RopeScaling, m.RopeTheta, m.TieWordEmbeddings, dir)
			}
			if _, errOut, code := run(t, "generate", "--model", merged, "--tokenizer", dir, "--prompt", prompt, "--max-new-tokens", "4"); code != 0 {
				t.Errorf("generate from the merged export: exit %d: %s", code, errOut)
			}
			if _, errOut, code := run(t, "generate", "--model", dir, "--adapter", filepath.Join(out, "adapter"), "--prompt", prompt, "--max-new-tokens", "4"); code != 0 {
				t.Errorf("generate with the adapter: exit %d: %s", code, errOut)
			}
		})
	}
}
