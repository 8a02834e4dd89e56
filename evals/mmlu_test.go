package evals

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/family/lm"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/tokenizer"
)

// The prompt of a known question equals, byte for byte, the harness-style prompt built independently by
// testdata/make_prompt.js.
func TestPromptMatchesHarness(t *testing.T) {
	dev, test, hash, err := ReadMMLU(filepath.Join(golden.SharedDir(t), "mmlu"), []string{"abstract_algebra"})
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join("testdata", "abstract_algebra_5shot_q0.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if got := Prompt("abstract_algebra", dev["abstract_algebra"][:5], test["abstract_algebra"][0]); got != string(want) {
		t.Errorf("prompt differs from the harness format:\n%q\nwant\n%q", got, want)
	}
	if len(hash) != 64 || len(test["abstract_algebra"]) != 100 {
		t.Errorf("hash %q, %d questions", hash, len(test["abstract_algebra"]))
	}
}

func TestOriginalLayout(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x_test.csv")
	os.WriteFile(p, []byte("\"What is 1+1, really?\",1,2,3,4,B\nWhy?,a,b,c,d,D\n"), 0o644)
	qs, err := ReadMMLUFile(p, "x")
	if err != nil || len(qs) != 2 || qs[0].Answer != 1 || qs[1].Answer != 3 || qs[0].Question != "What is 1+1, really?" {
		t.Fatalf("%v %+v", err, qs)
	}
	os.WriteFile(p, []byte("q,a,b,c,d,E\n"), 0o644)
	if _, err := ReadMMLUFile(p, "x"); err == nil || !strings.Contains(err.Error(), "row 1") {
		t.Errorf("bad answer: %v", err)
	}
}

// forcedLM knows the right answer of every prompt and gives it all the probability.
type forcedLM struct {
	answer map[string]int
	cont   [4]int
	letter [4]int
}

func key(ids []int) string {
	var sb strings.Builder
	for _, id := range ids {
		sb.WriteRune(rune(id + 1))
	}
	return sb.String()
}

func (f *forcedLM) NextLogProbs(ctxs, cands [][]int) ([][]float64, error) {
	out := make([][]float64, len(ctxs))
	for i, c := range ctxs {
		a := f.answer[key(c)]
		out[i] = make([]float64, len(cands[i]))
		for k, id := range cands[i] {
			out[i][k] = -20
			if id == f.cont[a] || id == f.letter[a] {
				out[i][k] = 0
			}
		}
	}
	return out, nil
}

func TestForcedAnswersScoreFull(t *testing.T) {
	dev, test, _, err := ReadMMLU(filepath.Join(golden.SharedDir(t), "mmlu"), []string{"anatomy", "virology"})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(filepath.Join("..", "pretrained", "llama-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	f := &forcedLM{answer: map[string]int{}}
	for i, l := range Letters {
		ids := tok.Encode("Answer: "+l, false)
		f.cont[i] = ids[len(ids)-1]
		ids = tok.Encode(l, false)
		f.letter[i] = ids[len(ids)-1]
	}
	for s, qs := range test {
		for _, q := range qs {
			f.answer[key(tok.Encode(Prompt(s, dev[s][:5], q), true))] = q.Answer
		}
	}
	res, err := EvalMMLU(f, tok, dev, test, MMLUOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Micro.LogLikelihood != 1 || res.Micro.Letter != 1 || res.Macro.LogLikelihood != 1 {
		t.Errorf("forced answers score %+v / %+v", res.Micro, res.Macro)
	}
	if res.ByCategory["other"].Questions != len(test["anatomy"])+len(test["virology"]) {
		t.Errorf("categories %+v", res.ByCategory)
	}
}

// TestGenerationScoring: MMLU scored by generation with the shipped LLaMA (zero-shot, so the prompts fit its
// positions uncut). The replies are greedy: each reply's first token must be at least as likely as any of the
// continuations " A".." D" at the answer position (scored by the log-likelihood path, a different program), and
// when it is one of them it is the log-likelihood scoring's pick; the generation accuracy counts the replies
// that start with the right letter.
func TestGenerationScoring(t *testing.T) {
	dev, test, _, err := ReadMMLU(filepath.Join(golden.SharedDir(t), "mmlu"), []string{"anatomy", "virology"})
	if err != nil {
		t.Fatal(err)
	}
	for s := range test {
		test[s] = test[s][:12]
	}
	dir := filepath.Join("..", "pretrained", "llama-tiny")
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	m, err := llama.Load(dir, decoder.Options{})
	if err != nil {
		t.Fatal(err)
	}
	lm, err := NewModelLM(gtest.Backend(t), lm.Model{Model: m, Spec: llama.Spec}, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := EvalMMLU(lm, tok, dev, test, MMLUOptions{Generate: true, Shots: -1, BatchSize: 8})
	if err != nil {
		t.Fatal(err)
	}
	var cont [4]int
	for i, l := range Letters {
		ids := tok.Encode("Answer: "+l, false)
		cont[i] = ids[len(ids)-1]
	}
	letterFirst, correct := 0, 0
	for s, replies := range res.Generated {
		if len(replies) != len(test[s]) {
			t.Fatalf("%s: %d replies for %d questions", s, len(replies), len(test[s]))
		}
		for i, r := range replies {
			if len(r) == 0 || len(r) > GenerateTokens {
				t.Errorf("%s question %d: reply %v, want 1 to %d tokens", s, i, r, GenerateTokens)
				continue
			}
			if GeneratedAnswer(tok.Decode(r, true)) == test[s][i].Answer {
				correct++
			}
			ctx := tok.Encode(Prompt(s, nil, test[s][i]), true)
			lp, err := lm.NextLogProbs([][]int{ctx}, [][]int{append([]int{r[0]}, cont[:]...)})
			if err != nil {
				t.Fatal(err)
			}
			for k := range cont {
				if lp[0][1+k] > lp[0][0]+1e-4 {
					t.Errorf("%s question %d: greedy reply %q (log p %.4f) but \" %s\" has log p %.4f", s, i, tok.Decode(r, true), lp[0][0], Letters[k], lp[0][1+k])
				}
				if r[0] == cont[k] {
					letterFirst++
					if res.Predictions[s][i] != k {
						t.Errorf("%s question %d: generated %q, log-likelihood picked %s", s, i, tok.Decode(r, true), Letters[res.Predictions[s][i]])
					}
				}
			}
		}
	}
	if res.Micro.Generate == nil || *res.Micro.Generate != float64(correct)/24 {
		t.Errorf("micro generation accuracy %v, want %d/24", res.Micro.Generate, correct)
	}
	t.Logf("%d of 24 replies start with a continuation token; generation accuracy %.3f; first reply %q", letterFirst, float64(correct)/24,
		tok.Decode(res.Generated["anatomy"][0], false))
}

// nanLM scores every continuation NaN from its third context on (what a model with NaN weights gives).
type nanLM struct{ calls int }

func (n *nanLM) NextLogProbs(ctxs, cands [][]int) ([][]float64, error) {
	out := make([][]float64, len(ctxs))
	for i := range ctxs {
		out[i] = make([]float64, len(cands[i]))
		for k := range out[i] {
			out[i][k] = -1.5
			if n.calls+i >= 2 {
				out[i][k] = math.NaN()
			}
		}
	}
	n.calls += len(ctxs)
	return out, nil
}

// TestNonFiniteScoresRefused: NaN log-likelihoods stop the evaluation naming the question (argmax took the
// first choice and the results said 25% or 0.00%).
func TestNonFiniteScoresRefused(t *testing.T) {
	dev, test, _, err := ReadMMLU(filepath.Join(golden.SharedDir(t), "mmlu"), []string{"anatomy"})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.Load(filepath.Join("..", "pretrained", "llama-tiny"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := EvalMMLU(&nanLM{}, tok, dev, test, MMLUOptions{BatchSize: 2})
	var nf *NonFiniteError
	if res != nil || !errors.As(err, &nf) || nf.Subject != "anatomy" || nf.Question != 2 ||
		!strings.Contains(err.Error(), "MMLU anatomy question 3: the model's log-likelihood scores are not finite (NaN)") {
		t.Errorf("result %v, error %v; want a NonFiniteError for anatomy question 3", res, err)
	}
}
