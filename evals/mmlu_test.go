package evals

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/internal/golden"
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
