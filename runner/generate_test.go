package runner_test

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/family/lm"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/runner"
)

// scaled returns random parameters for cfg with the linear and embedding weights scaled up (std 0.02 * by), so
// the logits spread and greedy choices are not decided by rounding.
func scaled(cfg decoder.Config, seed uint64, by float32) models.Params {
	p := decoder.RandomParams(cfg, seed)
	for name, t := range p {
		if t.Rank() < 2 {
			continue
		}
		v := gtest.Float32s(t)
		for i := range v {
			v[i] *= by
		}
		p[name] = tensors.FromFlatDataAndDimensions(v, t.Shape().Dimensions...)
	}
	return p
}

// decoders are the models the generation tests run: the shipped llama-tiny (GQA, tied embeddings, real
// weights), a multi-head model with its own head, and a GQA model with one key/value head built with MS-norm
// (the final norm folded into the head).
func decoders(t *testing.T) map[string]lm.Model {
	t.Helper()
	tiny, err := llama.Load("../pretrained/llama-tiny", decoder.Options{})
	if err != nil {
		t.Fatal(err)
	}
	base := decoder.Config{VocabSize: 97, HiddenSize: 32, IntermediateSize: 64, NumHiddenLayers: 2, NumAttentionHeads: 4,
		NumKeyValueHeads: 4, HeadDim: 8, MaxPositionEmbeddings: 128, RMSNormEps: 1e-5, RopeTheta: 10000,
		PadTokenID: 0, BOSTokenID: 1, EOSTokenID: 2, Task: decoder.CausalLM}
	mha, err := decoder.New(base, scaled(base, 3, 20), decoder.Options{})
	if err != nil {
		t.Fatal(err)
	}
	gqa := base
	gqa.NumKeyValueHeads = 1
	gqa.NumHiddenLayers = 3
	ms, err := decoder.New(gqa, scaled(gqa, 4, 20), decoder.Options{MSNorm: true})
	if err != nil {
		t.Fatal(err)
	}
	return map[string]lm.Model{"llama-tiny": {Model: tiny, Spec: llama.Spec}, "mha-untied": {Model: mha, Spec: llama.Spec}, "gqa1-msnorm": {Model: ms, Spec: llama.Spec}}
}

// fullForwardGreedy continues prompt by n tokens, each the argmax of the last position's logits of a full
// forward pass over the whole sequence so far (no cache, no padding).
func fullForwardGreedy(t *testing.T, m lm.Model, prompt []int, n int) ([]int, [][]float32) {
	t.Helper()
	seq := append([]int(nil), prompt...)
	var out []int
	var logits [][]float32
	for range n {
		ids := make([]int32, len(seq))
		for i, id := range seq {
			ids[i] = int32(id)
		}
		l, err := runner.Logits(gtest.Backend(t), m, nil, nil, runner.Batch{"input_ids": tensors.FromFlatDataAndDimensions(ids, 1, len(seq))})
		if err != nil {
			t.Fatal(err)
		}
		v := gtest.Float32s(l)
		vocab := l.Shape().Dim(2)
		last := v[len(v)-vocab:]
		best := 0
		for i, x := range last {
			if x > last[best] {
				best = i
			}
		}
		out = append(out, best)
		logits = append(logits, last)
		seq = append(seq, best)
	}
	return out, logits
}

// TestGreedyEqualsFullForward: greedy decoding with the key/value cache, three prompts of different lengths
// left-padded into one batch, gives token for token the argmax continuation of repeated full forward passes of
// each prompt alone.
func TestGreedyEqualsFullForward(t *testing.T) {
	for name, m := range decoders(t) {
		t.Run(name, func(t *testing.T) {
			vocab := m.Config.VocabSize
			r := rand.New(rand.NewPCG(7, 7))
			var prompts [][]int
			for _, n := range []int{3, 11, 20} {
				p := []int{m.Config.BOSTokenID}
				for len(p) < n {
					p = append(p, 3+r.IntN(vocab-3))
				}
				prompts = append(prompts, p)
			}
			const steps = 12
			gen := runner.NewGenerator(gtest.Backend(t), m, nil, nil)
			got, st, err := gen.Generate(prompts, runner.GenerateOptions{MaxNewTokens: steps, Pad: m.Config.PadTokenID})
			if err != nil {
				t.Fatal(err)
			}
			for i, p := range prompts {
				want, _ := fullForwardGreedy(t, m, p, steps)
				if fmt.Sprint(got[i].Tokens) != fmt.Sprint(want) || got[i].Stop != runner.StopLength {
					t.Errorf("prompt %d (%d tokens): cached greedy %v (%s), full forward %v", i, len(p), got[i].Tokens, got[i].Stop, want)
				}
			}
			if st.NewTokens != 3*steps || st.DecodeSteps != steps-1 || st.PromptTokens != 34 {
				t.Errorf("stats %+v: want 36 new tokens, 11 decode steps, 34 prompt tokens", st)
			}
			// A second call reuses the compiled programs.
			if _, st2, err := gen.Generate(prompts[:1], runner.GenerateOptions{MaxNewTokens: 2}); err != nil || st2.CompileSeconds == 0 {
				t.Logf("batch 1 compiles its own programs: %v %+v", err, st2)
			}
			if _, st3, err := gen.Generate(prompts, runner.GenerateOptions{MaxNewTokens: steps}); err != nil || st3.CompileSeconds != 0 {
				t.Errorf("the same shapes again compiled %g s (%v)", st3.CompileSeconds, err)
			}
		})
	}
}

// TestStops: EOS ends a row without being part of its output; a stop string ends it with its text cut before
// the string; the other rows go on.
func TestStops(t *testing.T) {
	m := decoders(t)["mha-untied"]
	prompts := [][]int{{1, 5, 6, 7}, {1, 9}}
	want0, _ := fullForwardGreedy(t, m, prompts[0], 8)
	want1, _ := fullForwardGreedy(t, m, prompts[1], 8)
	detok := func(ids []int) string {
		var sb strings.Builder
		for _, id := range ids {
			fmt.Fprintf(&sb, "<%d>", id)
		}
		return sb.String()
	}
	// Row 0 ends at the first occurrence of its 4th token, taken as EOS; row 1 at its 3rd token as a stop string.
	eos := want0[3]
	cut := firstIndex(want0, eos)
	stop := fmt.Sprintf("<%d>", want1[2])
	stopAt := firstIndex(want1, want1[2])
	if eos == want1[2] || firstIndex(want1[:stopAt+1], eos) >= 0 {
		t.Skip("the two rows share the chosen tokens; pick other ones")
	}
	var streamed [2][]int
	gen := runner.NewGenerator(gtest.Backend(t), m, nil, nil)
	got, _, err := gen.Generate(prompts, runner.GenerateOptions{MaxNewTokens: 8, EOS: []int{eos}, StopStrings: []string{stop},
		Detokenize: detok, OnToken: func(row, tok int) { streamed[row] = append(streamed[row], tok) }})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got[0].Tokens) != fmt.Sprint(want0[:cut]) || got[0].Stop != runner.StopEOS || got[0].Text != detok(want0[:cut]) {
		t.Errorf("row 0: %v %q (%s), want %v ended by EOS %d", got[0].Tokens, got[0].Text, got[0].Stop, want0[:cut], eos)
	}
	if fmt.Sprint(streamed[0]) != fmt.Sprint(want0[:cut+1]) {
		t.Errorf("row 0 streamed %v, want %v (EOS included)", streamed[0], want0[:cut+1])
	}
	if fmt.Sprint(got[1].Tokens) != fmt.Sprint(want1[:stopAt+1]) || got[1].Stop != runner.StopString || got[1].Text != detok(want1[:stopAt]) {
		t.Errorf("row 1: %v %q (%s), want %v and text %q ended by %q", got[1].Tokens, got[1].Text, got[1].Stop, want1[:stopAt+1], detok(want1[:stopAt]), stop)
	}
}

func firstIndex(xs []int, x int) int {
	for i, v := range xs {
		if v == x {
			return i
		}
	}
	return -1
}

// TestSampledGeneration: sampling is deterministic for a seed, differs between seeds, does not depend on the
// other prompts of the batch, and top-k 1 is greedy.
func TestSampledGeneration(t *testing.T) {
	m := decoders(t)["llama-tiny"]
	prompts := [][]int{{m.Config.BOSTokenID, 100, 200, 300}, {m.Config.BOSTokenID, 400}}
	gen := runner.NewGenerator(gtest.Backend(t), m, nil, nil)
	run := func(ps [][]int, o runner.GenerateOptions) []runner.Generation {
		o.MaxNewTokens = 16
		out, _, err := gen.Generate(ps, o)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	o := runner.GenerateOptions{Temperature: 1.0, TopP: 0.95, TopK: 50, Seed: 5}
	a, b := run(prompts, o), run(prompts, o)
	if fmt.Sprint(a[0].Tokens, a[1].Tokens) != fmt.Sprint(b[0].Tokens, b[1].Tokens) {
		t.Errorf("the same seed sampled %v and %v", a, b)
	}
	o.Seed = 6
	c := run(prompts, o)
	if fmt.Sprint(a[0].Tokens) == fmt.Sprint(c[0].Tokens) && fmt.Sprint(a[1].Tokens) == fmt.Sprint(c[1].Tokens) {
		t.Errorf("seeds 5 and 6 sampled the same tokens %v", a)
	}
	o.Seed = 5
	alone := run(prompts[:1], o)
	if fmt.Sprint(alone[0].Tokens) != fmt.Sprint(a[0].Tokens) {
		t.Errorf("prompt 0 alone sampled %v, in the batch %v", alone[0].Tokens, a[0].Tokens)
	}
	greedy := run(prompts, runner.GenerateOptions{})
	top1 := run(prompts, runner.GenerateOptions{Temperature: 0.7, TopK: 1, Seed: 9})
	if fmt.Sprint(greedy[0].Tokens, greedy[1].Tokens) != fmt.Sprint(top1[0].Tokens, top1[1].Tokens) {
		t.Errorf("top-k 1 sampled %v, greedy %v", top1, greedy)
	}
}

// TestSampledStreamsKeyedByIndex: a prompt's random stream is keyed by its index in the input (Indices), not
// by its row in the batch: three identical prompts decoded one at a time sample three different completions,
// each the same as in one batch of three.
func TestSampledStreamsKeyedByIndex(t *testing.T) {
	m := decoders(t)["llama-tiny"]
	p := []int{m.Config.BOSTokenID, 100, 200, 300}
	gen := runner.NewGenerator(gtest.Backend(t), m, nil, nil)
	o := runner.GenerateOptions{MaxNewTokens: 12, Temperature: 1, Seed: 7}
	batched, _, err := gen.Generate([][]int{p, p, p}, o)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i := range 3 {
		o.Indices = []int{i}
		alone, _, err := gen.Generate([][]int{p}, o)
		if err != nil {
			t.Fatal(err)
		}
		got := fmt.Sprint(alone[0].Tokens)
		if want := fmt.Sprint(batched[i].Tokens); got != want {
			t.Errorf("prompt %d at batch size 1 sampled %s, at batch size 3 %s", i, got, want)
		}
		seen[got] = true
	}
	if len(seen) != 3 {
		t.Errorf("three identical prompts with indices 0, 1, 2 sampled %d different completions, want 3: %v", len(seen), seen)
	}
	// Two of the three in one batch, in the other order, sample what they sample at their own indices.
	o.Indices = []int{2, 0}
	two, _, err := gen.Generate([][]int{p, p}, o)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(two[0].Tokens, two[1].Tokens) != fmt.Sprint(batched[2].Tokens, batched[0].Tokens) {
		t.Errorf("indices 2, 0 sampled %v %v; want %v %v", two[0].Tokens, two[1].Tokens, batched[2].Tokens, batched[0].Tokens)
	}
}

// TestNonFiniteLogitsStop: a row whose logits hold NaN stops the call with an error naming the prompt's index
// and the new token, not a completion of token 0 (greedy) or of arbitrary tokens (sampled).
func TestNonFiniteLogitsStop(t *testing.T) {
	m := decoders(t)["mha-untied"] // its own head: the embeddings feed only the input side
	backend := gtest.Backend(t)
	prompt := []int{m.Config.BOSTokenID, 10, 20, 30}
	out, _, err := runner.NewGenerator(backend, m, nil, nil).Generate([][]int{prompt}, runner.GenerateOptions{MaxNewTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	first := out[0].Tokens[0]
	// The embedding of the first generated token set to NaN: the first token is chosen from finite logits, the
	// second from NaN ones.
	params := models.Params{}
	for n, v := range m.Params() {
		params[n] = v
	}
	emb := params[decoder.EmbedTokens]
	v := gtest.Float32s(emb)
	hidden := emb.Shape().Dim(1)
	for i := range hidden {
		v[first*hidden+i] = float32(math.NaN())
	}
	params[decoder.EmbedTokens] = tensors.FromFlatDataAndDimensions(v, emb.Shape().Dimensions...)
	gen := runner.NewGenerator(backend, m, params, nil)
	for _, o := range []runner.GenerateOptions{{MaxNewTokens: 4, Indices: []int{5, 6}}, {MaxNewTokens: 4, Indices: []int{5, 6}, Temperature: 1, Seed: 3}} {
		// Row 0 never feeds that token (its first token differs) unless it samples it; row 1 does.
		_, _, err := gen.Generate([][]int{{m.Config.BOSTokenID, first}, prompt}, o)
		var nf *runner.NonFiniteError
		if !errors.As(err, &nf) {
			t.Fatalf("temperature %g: error %v, want a NonFiniteError", o.Temperature, err)
		}
		if nf.Prompt != 5 && nf.Prompt != 6 || nf.Step < 1 || !strings.Contains(err.Error(), "are not finite (NaN") {
			t.Errorf("temperature %g: %v", o.Temperature, err)
		}
		if o.Temperature == 0 && (nf.Prompt != 5 || nf.Step != 1) {
			t.Errorf("greedy: %v; want prompt 5 (its prompt holds the NaN embedding), new token 1", err)
		}
		t.Log(err)
	}
	// Greedy on the prompt alone: the NaN arrives with the second new token.
	_, _, err = gen.Generate([][]int{prompt}, runner.GenerateOptions{MaxNewTokens: 4, Indices: []int{3}})
	var nf *runner.NonFiniteError
	if !errors.As(err, &nf) || nf.Prompt != 3 || nf.Step != 2 {
		t.Errorf("error %v, want prompt 3, new token 2", err)
	}
}

// TestSampleDistribution: the sampler draws from the temperature-scaled softmax restricted by top-k and top-p.
func TestSampleDistribution(t *testing.T) {
	// Probabilities 1/7, 2/7, 4/7 at temperature 1; at temperature 2, proportional to 1, sqrt 2, 2.
	logits := []float32{0, float32(math.Log(2)), float32(math.Log(4)), float32(math.Inf(-1))}
	cases := []struct {
		name  string
		temp  float64
		k     int
		p     float64
		probs []float64
	}{
		{"softmax", 1, 0, 0, []float64{1.0 / 7, 2.0 / 7, 4.0 / 7, 0}},
		{"temperature 2", 2, 0, 0, []float64{1 / (3 + math.Sqrt2), math.Sqrt2 / (3 + math.Sqrt2), 2 / (3 + math.Sqrt2), 0}},
		{"top-k 2", 1, 2, 0, []float64{0, 1.0 / 3, 2.0 / 3, 0}},
		{"top-p 0.8", 1, 0, 0.8, []float64{0, 1.0 / 3, 2.0 / 3, 0}},
		{"top-p 0.5", 1, 0, 0.5, []float64{0, 0, 1, 0}},
		{"greedy", 0, 0, 0, []float64{0, 0, 1, 0}},
	}
	for _, c := range cases {
		r := rand.New(rand.NewPCG(1, 2))
		const n = 40000
		counts := make([]float64, len(logits))
		for range n {
			counts[runner.Sample(logits, c.temp, c.k, c.p, r)]++
		}
		for i := range counts {
			if got := counts[i] / n; math.Abs(got-c.probs[i]) > 0.01 {
				t.Errorf("%s: token %d drawn %.4f of the time, want %.4f", c.name, i, got, c.probs[i])
			}
		}
	}
}

// TestGenerateRefuses: bad requests get an error, not a panic.
func TestGenerateRefuses(t *testing.T) {
	m := decoders(t)["mha-untied"]
	gen := runner.NewGenerator(gtest.Backend(t), m, nil, nil)
	for _, c := range []struct {
		prompts [][]int
		o       runner.GenerateOptions
		want    string
	}{
		{[][]int{{1, 2}}, runner.GenerateOptions{}, "at least 1"},
		{[][]int{{}}, runner.GenerateOptions{MaxNewTokens: 2}, "empty"},
		{[][]int{{1, 2}}, runner.GenerateOptions{MaxNewTokens: 2, TopP: 1.5}, "top-p"},
		{[][]int{{1, 2}}, runner.GenerateOptions{MaxNewTokens: 2, StopStrings: []string{"x"}}, "detokenizer"},
		{[][]int{make([]int, 120)}, runner.GenerateOptions{MaxNewTokens: 10, MaxPositions: 128}, "positions"},
		{[][]int{{1, 2}}, runner.GenerateOptions{MaxNewTokens: 2, Temperature: math.NaN()}, "temperature NaN"},
		{[][]int{{1, 2}}, runner.GenerateOptions{MaxNewTokens: 2, Temperature: math.Inf(1)}, "temperature +Inf"},
		{[][]int{{1, 2}}, runner.GenerateOptions{MaxNewTokens: 2, Temperature: -0.5}, "temperature -0.5"},
		{[][]int{{1, 2}}, runner.GenerateOptions{MaxNewTokens: 2, TopP: math.NaN()}, "top-p NaN"},
		{[][]int{{1, 2}}, runner.GenerateOptions{MaxNewTokens: 2, TopP: -0.1}, "top-p -0.1"},
		{[][]int{{1, 2}}, runner.GenerateOptions{MaxNewTokens: 2, TopK: -1}, "top-k -1"},
		{[][]int{{1, 2}}, runner.GenerateOptions{MaxNewTokens: 2, StopStrings: []string{""}, Detokenize: func([]int) string { return "" }}, "stop string 0 is empty"},
		{[][]int{{1, 2}, {3}}, runner.GenerateOptions{MaxNewTokens: 2, Indices: []int{4}}, "1 prompt indices for 2 prompts"},
		{[][]int{{1, 2}, {3}}, runner.GenerateOptions{MaxNewTokens: 2, Indices: []int{4, 4}}, "distinct"},
		{[][]int{{1, 2}, {}}, runner.GenerateOptions{MaxNewTokens: 2, Indices: []int{4, 9}}, "prompt 9 is empty"},
	} {
		if _, _, err := gen.Generate(c.prompts, c.o); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: error %v, want one saying %q", c.o, err, c.want)
		}
	}
}

// BenchmarkDecode times greedy decoding of 64 tokens after 32-token prompts with the shipped llama-tiny, one and
// eight rows (go test ./runner -run '^$' -bench Decode -cpuprofile cpu.out for where a step's time goes).
func BenchmarkDecode(b *testing.B) {
	tiny, err := llama.Load("../pretrained/llama-tiny", decoder.Options{})
	if err != nil {
		b.Fatal(err)
	}
	gen := runner.NewGenerator(gtest.Backend(b), lm.Model{Model: tiny, Spec: llama.Spec}, nil, nil)
	for _, rows := range []int{1, 8} {
		b.Run(fmt.Sprintf("batch%d", rows), func(b *testing.B) {
			prompts := make([][]int, rows)
			for r := range prompts {
				for i := range 32 {
					prompts[r] = append(prompts[r], 100+i+r)
				}
			}
			o := runner.GenerateOptions{MaxNewTokens: 64}
			if _, _, err := gen.Generate(prompts, o); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			var st runner.GenerateStats
			var err error
			for range b.N {
				if _, st, err = gen.Generate(prompts, o); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(st.DecodeTokensPerSecond(), "tokens/s")
		})
	}
}
