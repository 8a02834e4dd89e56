package llamacpp_test

import (
	"context"
	"errors"
	_ "github.com/memfit/memfit/family/all" // the families finetune.LoadModel loads
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/gguf"
	"github.com/memfit/memfit/gguf/llamagguf"
	"github.com/memfit/memfit/llamacpp"
	"github.com/memfit/memfit/tokenizer"
)

func tool(t *testing.T) *llamacpp.Tool {
	t.Helper()
	tl, err := llamacpp.Install(filepath.Join("..", "tools", "llamacpp"), nil)
	if errors.Is(err, llamacpp.ErrNoNode) {
		t.Skipf("llama.cpp checks skipped: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return tl
}

// TestRun: the script answers a request on llama-tiny's GGUF (the model llama.cpp read, a tokenization, greedy
// tokens with one distribution per token, teacher-forced scores), and a file llama.cpp cannot load, a token id
// outside the vocabulary or a missing file are errors carrying the cause in one line.
func TestRun(t *testing.T) {
	tl := tool(t)
	dir := filepath.Join("..", "pretrained", "llama-tiny")
	m, err := finetune.LoadModel(dir, finetune.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	file := filepath.Join(tmp, "tiny.gguf")
	if err := finetune.ExportGGUF(file, m, m.Params(), tok, llamagguf.Options{Type: gguf.F32, Name: "tiny"}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	text := "It was a bright cold day in April"
	res, err := tl.Run(ctx, llamacpp.Request{Model: file, Tokenize: []llamacpp.TokenizeRequest{{Text: text, AddSpecial: true}},
		Generate: &llamacpp.GenerateRequest{Prompt: tok.Encode(text, true), Tokens: 4, Probabilities: true},
		Score:    &llamacpp.ScoreRequest{Sequences: [][]int{tok.Encode(text, true)}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Model.Vocab != 4096 || res.Model.VocabType != "bpe" || res.Model.BOS == nil || *res.Model.BOS != 4093 || !res.Model.AddBOS {
		t.Errorf("model %+v", res.Model)
	}
	if want := tok.Encode(text, true); len(res.Tokenize) != 1 || !equal(res.Tokenize[0], want) {
		t.Errorf("tokenize: %v, memfit %v", res.Tokenize, want)
	}
	g := res.Generate
	if g == nil || len(g.Tokens) != 4 || len(g.Probabilities) != 4 || len(g.Probabilities[0]) != 4096 {
		t.Fatalf("generate: %+v", g)
	}
	for i, p := range g.Probabilities {
		sum, best := 0.0, 0
		for id, v := range p {
			sum += v
			if v > p[best] {
				best = id
			}
		}
		if sum < 0.999 || sum > 1.001 || best != g.Tokens[i] {
			t.Errorf("step %d: probabilities sum to %g, argmax %d, token %d", i, sum, best, g.Tokens[i])
		}
	}
	n := len(tok.Encode(text, true))
	if len(res.Score) != 1 || len(res.Score[0].Top) != n || res.Score[0].Top[n-1] != g.Tokens[0] {
		t.Errorf("score %+v: the greedy token after the whole prompt should be generate's first, %d", res.Score, g.Tokens[0])
	}

	// Several requests in one process answer as each alone does, in order; a failing one fails them all.
	all, err := tl.RunAll(ctx, []llamacpp.Request{{Model: file, VocabOnly: true, Tokenize: []llamacpp.TokenizeRequest{{Text: text, AddSpecial: true}}},
		{Model: file, Generate: &llamacpp.GenerateRequest{Prompt: tok.Encode(text, true), Tokens: 4}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 || len(all[0].Tokenize) != 1 || !equal(all[0].Tokenize[0], res.Tokenize[0]) || all[1].Generate == nil || !equal(all[1].Generate.Tokens, g.Tokens) {
		t.Errorf("RunAll: %+v, %+v; want the tokenization %v and the tokens %v", all[0], all[1], res.Tokenize[0], g.Tokens)
	}
	if _, err := tl.RunAll(ctx, []llamacpp.Request{{Model: file, VocabOnly: true}, {Model: filepath.Join(tmp, "missing.gguf")}}); err == nil ||
		!strings.Contains(err.Error(), "missing.gguf: llama.cpp cannot load it") {
		t.Errorf("RunAll with a missing file: %v", err)
	}

	truncated := filepath.Join(tmp, "truncated.gguf")
	b, _ := os.ReadFile(file)
	os.WriteFile(truncated, b[:3000], 0o644)
	for _, c := range []struct {
		req  llamacpp.Request
		want string
	}{
		{llamacpp.Request{Model: truncated, VocabOnly: true}, "cannot load it"},
		{llamacpp.Request{Model: filepath.Join(tmp, "missing.gguf")}, "cannot load it"},
		{llamacpp.Request{Model: file, Generate: &llamacpp.GenerateRequest{Prompt: []int{4096}, Tokens: 1}}, "token id 4096 is outside the model's vocabulary"},
	} {
		_, err := tl.Run(ctx, c.req)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%+v: error %v, want one line with %q", c.req, err, c.want)
		}
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestFind: a folder without the script, and the script without its npm packages, are errors saying what to do.
func TestFind(t *testing.T) {
	tool(t) // node and npm are there
	tmp := t.TempDir()
	if _, err := llamacpp.Find(tmp); err == nil || !strings.Contains(err.Error(), "no llamacpp.mjs here") {
		t.Errorf("an empty folder: %v", err)
	}
	os.WriteFile(filepath.Join(tmp, "llamacpp.mjs"), []byte("// script"), 0o644)
	if _, err := llamacpp.Find(tmp); err == nil || !strings.Contains(err.Error(), "npm install") {
		t.Errorf("no node_modules: %v", err)
	}
}
