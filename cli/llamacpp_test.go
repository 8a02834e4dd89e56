package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/family/lm"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/llamacpp"
	"github.com/memfit/memfit/runner"
	"github.com/memfit/memfit/safetensors"
	"github.com/memfit/memfit/tokenizer"
)

// llamaCpp returns the repository's tools/llamacpp, installed into memfit's npm tool cache on first use
// (llamacpp.Install), skipping the test only where node or npm is missing (a failed install or a broken tooling
// fails the test).
func llamaCpp(t *testing.T) *llamacpp.Tool {
	t.Helper()
	tool, err := llamacpp.Install(filepath.Join("..", "tools", "llamacpp"), nil)
	if errors.Is(err, llamacpp.ErrNoNode) {
		t.Skipf("llama.cpp checks skipped: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	return tool
}

func runLlamaCpp(t *testing.T, tool *llamacpp.Tool, req llamacpp.Request) *llamacpp.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := tool.Run(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// memfitLM is a LLaMA causal LM as memfit runs it: the model and its adapters (none for a merged model).
type memfitLM struct {
	model lm.Model
	set   *adapter.Set
}

func loadMemfitLM(t *testing.T, model, adapterDir string) memfitLM {
	t.Helper()
	m, err := finetune.LoadModel(model, finetune.Defaults())
	if err != nil {
		t.Fatal(err)
	}
	l, ok := m.(lm.Model)
	if !ok {
		t.Fatalf("%s is not a LLaMA", model)
	}
	lm := memfitLM{model: l}
	if adapterDir != "" {
		a, err := finetune.ReadAdapter(adapterDir, m)
		if err != nil {
			t.Fatal(err)
		}
		for n, x := range a.Modules {
			m.Params()[n] = x
		}
		lm.set = a.Set
	}
	return lm
}

// greedy is memfit's generate: n tokens decoded greedily after prompt, with the key/value cache.
func (lm memfitLM) greedy(t *testing.T, prompt []int, n int) []int {
	t.Helper()
	gen := runner.NewGenerator(gtest.Backend(t), lm.model, nil, lm.set)
	out, _, err := gen.Generate([][]int{prompt}, runner.GenerateOptions{MaxNewTokens: n, TopP: 1,
		Pad: max(lm.model.Config.PadTokenID, 0), MaxPositions: lm.model.Config.MaxPositionEmbeddings})
	if err != nil {
		t.Fatal(err)
	}
	return out[0].Tokens
}

// softmax returns memfit's next-token distribution after every prefix of seq (float64 softmax of its float32
// logits).
func (lm memfitLM) softmax(t *testing.T, seq []int) [][]float64 {
	t.Helper()
	ids, mask := make([]int32, len(seq)), make([]int32, len(seq))
	for i, id := range seq {
		ids[i], mask[i] = int32(id), 1
	}
	logits, err := runner.Logits(gtest.Backend(t), lm.model, nil, lm.set, runner.Batch{
		"input_ids": tensors.FromFlatDataAndDimensions(ids, 1, len(seq)), "attention_mask": tensors.FromFlatDataAndDimensions(mask, 1, len(seq))})
	if err != nil {
		t.Fatal(err)
	}
	defer logits.MustFinalizeAll()
	vocab := logits.Shape().Dimensions[2]
	out := make([][]float64, len(seq))
	tensors.ConstFlatData[float32](logits, func(f []float32) {
		for p := range seq {
			row := f[p*vocab : (p+1)*vocab]
			top := math.Inf(-1)
			for _, v := range row {
				top = math.Max(top, float64(v))
			}
			probs, sum := make([]float64, vocab), 0.0
			for i, v := range row {
				probs[i] = math.Exp(float64(v) - top)
				sum += probs[i]
			}
			for i := range probs {
				probs[i] /= sum
			}
			out[p] = probs
		}
	})
	return out
}

// llamaCppCase is one model checked against llama.cpp: the GGUF exports (f32 and q8_0) and memfit's model they
// were exported from.
type llamaCppCase struct {
	name      string
	f32, q8   string
	lm        memfitLM
	text      string  // the prompt's text (llama.cpp's tokenization of it must be prompt; "": not checked)
	prompt    []int   // greedy decoding starts here
	sequences [][]int // teacher-forced positions for the q8_0 top-1 agreement (256 in all)
}

const (
	greedyTokens = 32   // llama.cpp's greedy tokens on the f32 GGUF equal memfit's for this many tokens
	probTol      = 1e-3 // and its next-token probabilities are within this of memfit's softmax
	q8Agreement  = 0.95 // with q8_0, the top-1 next token agrees with memfit's at this share of positions
	q8NearTie    = 0.02 // and where it does not, memfit's probabilities of the two tokens are this close
)

// checkAgainstLlamaCpp runs the case's GGUFs through llama.cpp and compares with memfit: greedy tokens and
// next-token probabilities on the f32 file, top-1 agreement on the q8_0 file.
func checkAgainstLlamaCpp(t *testing.T, tool *llamacpp.Tool, c llamaCppCase) {
	t.Helper()
	want := c.lm.greedy(t, c.prompt, greedyTokens)
	if len(want) != greedyTokens {
		t.Fatalf("%s: memfit generated %d tokens, want %d", c.name, len(want), greedyTokens)
	}
	// A float32 key/value cache: llama.cpp's default float16 one moves the probabilities by up to about 1e-3 on
	// its own (measured: 8.5e-4 on the tied golden variant, 1e-6 with float32), which would hide the export's error.
	// One llama.cpp thread: its spinning threads cost these tiny models far more than they save (measured 18 s
	// against 4 s for 32 tokens on a loaded machine).
	req := llamacpp.Request{Model: c.f32, KVCacheType: "F32", Threads: 1,
		Generate: &llamacpp.GenerateRequest{Prompt: c.prompt, Tokens: greedyTokens, Probabilities: true}}
	if c.text != "" {
		req.Tokenize = []llamacpp.TokenizeRequest{{Text: c.text, Special: true, AddSpecial: true}}
	}
	res := runLlamaCpp(t, tool, req)
	if res.Generate == nil || (c.text != "" && len(res.Tokenize) != 1) {
		t.Fatalf("%s: llama.cpp's answer lacks parts: %+v", c.name, res)
	}
	if c.text != "" && fmt.Sprint(res.Tokenize[0]) != fmt.Sprint(c.prompt) {
		t.Errorf("%s: llama.cpp tokenizes the prompt as\n%v\nmemfit as\n%v", c.name, res.Tokenize[0], c.prompt)
	}
	got := res.Generate
	if fmt.Sprint(got.Tokens) != fmt.Sprint(want) {
		t.Fatalf("%s: llama.cpp's greedy tokens on the f32 GGUF differ from memfit's generate:\nllama.cpp %v\nmemfit    %v", c.name, got.Tokens, want)
	}
	// memfit's distributions at the same positions: after the prompt and each generated token but the last.
	seq := append(append([]int{}, c.prompt...), want[:greedyTokens-1]...)
	ref := c.lm.softmax(t, seq)[len(c.prompt)-1:]
	worst, at := 0.0, 0
	for i, p := range got.Probabilities {
		if len(p) != len(ref[i]) {
			t.Fatalf("%s: llama.cpp gives %d probabilities, memfit %d", c.name, len(p), len(ref[i]))
		}
		for id := range p {
			if d := math.Abs(p[id] - ref[i][id]); d > worst {
				worst, at = d, i
			}
		}
	}
	t.Logf("%s: %d greedy tokens equal; next-token probabilities within %.2g of memfit's (worst at step %d)", c.name, len(want), worst, at)
	if worst > probTol || len(got.Probabilities) != greedyTokens {
		t.Errorf("%s: llama.cpp's next-token probabilities (%d steps) differ from memfit's softmax by %.3g at step %d (bound %g)",
			c.name, len(got.Probabilities), worst, at, probTol)
	}

	// q8_0: top-1 agreement over the teacher-forced positions, as users run it (llama.cpp's float16 key/value cache).
	// A context with room beyond the longest sequence: node-llama-cpp scores the second of two sequences wrong in a
	// context exactly its length (measured: probabilities off by up to 0.08 on qwen2_a).
	longest := 0
	for _, s := range c.sequences {
		longest = max(longest, len(s))
	}
	res = runLlamaCpp(t, tool, llamacpp.Request{Model: c.q8, Threads: 1, ContextSize: 2 * longest, Score: &llamacpp.ScoreRequest{Sequences: c.sequences}})
	if len(res.Score) != len(c.sequences) {
		t.Fatalf("%s: llama.cpp scored %d sequences of %d", c.name, len(res.Score), len(c.sequences))
	}
	agree, total, widest := 0, 0, 0.0
	for i, s := range c.sequences {
		ref := c.lm.softmax(t, s)
		if len(res.Score[i].Top) != len(s) {
			t.Fatalf("%s: llama.cpp scored %d positions of sequence %d's %d", c.name, len(res.Score[i].Top), i, len(s))
		}
		for p := range s {
			total++
			top := argmax(ref[p])
			if res.Score[i].Top[p] == top {
				agree++
			} else {
				// memfit's margin between its top token and llama.cpp's choice: q8_0 rounding flips near-ties only.
				widest = math.Max(widest, ref[p][top]-ref[p][res.Score[i].Top[p]])
			}
		}
	}
	share := float64(agree) / float64(total)
	t.Logf("%s: q8_0 top-1 agreement %d/%d (%.1f%%); where they differ, memfit's probabilities of the two tokens are at most %.3g apart",
		c.name, agree, total, 100*share, widest)
	if widest > q8NearTie {
		t.Errorf("%s: the q8_0 GGUF's top-1 token differs from memfit's where memfit's probabilities are %.3g apart (more than %g: not a rounding near-tie)",
			c.name, widest, q8NearTie)
	}
	if total < 256 || share < q8Agreement {
		t.Errorf("%s: q8_0 GGUF's top-1 next token agrees with memfit at %d of %d positions (%.1f%%), want >= %.0f%% over at least 256",
			c.name, agree, total, 100*share, 100*q8Agreement)
	}
}

// exportGGUF runs `finetune export --format gguf` with args and the tensor type typ into dir and returns the file.
func exportGGUF(t *testing.T, dir, name, typ string, args ...string) string {
	t.Helper()
	out := filepath.Join(dir, name+"-"+typ+".gguf")
	args = append([]string{"export", "--format", "gguf", "--gguf-type", typ, "--out", out}, args...)
	if _, errOut, code := run(t, args...); code != 0 {
		t.Fatalf("%v: exit %d: %s", args, code, errOut)
	}
	return out
}

// exportMerged runs `finetune export --format merged` with args into dir/name and returns the folder.
func exportMerged(t *testing.T, dir, name string, args ...string) string {
	t.Helper()
	out := filepath.Join(dir, name)
	args = append([]string{"export", "--format", "merged", "--out", out}, args...)
	if _, errOut, code := run(t, args...); code != 0 {
		t.Fatalf("%v: exit %d: %s", args, code, errOut)
	}
	return out
}

// goldenLlamaVariant copies the golden llama_a (transformers' GQA LLaMA, no tokenizer: its GGUF gets
// placeholder tokens) to dir with its config edited by edit, and, when tie, lm_head.weight dropped and
// tie_word_embeddings set.
func goldenLlamaVariant(t *testing.T, dir string, tie bool, edit func(cfg map[string]any)) string {
	t.Helper()
	if !tie && edit == nil {
		return filepath.Join(golden.SharedDir(t), "golden", "llama_a") // the folder as transformers wrote it
	}
	return golden.Variant(t, "llama_a", dir, func(cfg map[string]any, w map[string]*tensors.Tensor) {
		if edit != nil {
			edit(cfg)
		}
		if tie {
			cfg["tie_word_embeddings"] = true
			delete(w, "lm_head.weight")
		}
	})
}

// passage returns n bytes of War and Peace from offset off (the shared plain text).
func passage(t *testing.T, off, n int) string {
	t.Helper()
	b := mustRead(t, filepath.Join(golden.SharedDir(t), "text", "war-and-peace.txt"))
	if len(b) < off+n {
		t.Fatalf("war-and-peace.txt has %d bytes", len(b))
	}
	return string(b[off : off+n])
}

// TestLlamaCppRunsGoldenGGUF: transformers' golden LLaMA (GQA, untied head; no tokenizer, so its GGUF holds
// placeholder tokens), and variants of it with Llama-3 rope scaling and with a tied head, exported as GGUF, run
// in llama.cpp as in memfit: the same 32 greedy tokens on
// the f32 file, next-token probabilities within 1e-3 of memfit's softmax, and q8_0's top-1 next token agreeing
// with memfit's at >= 95% of 256 positions of real text (bytes of War and Peace, the models' 256 ids).
func TestLlamaCppRunsGoldenGGUF(t *testing.T) {
	tool := llamaCpp(t)
	g := golden.Load(t, "llama_a")
	var prompt []int
	for _, id := range g.Array(t, "inputs", "input_ids").Int32s()[:12] { // row 0: 12 real tokens
		prompt = append(prompt, int(id))
	}
	var seqs [][]int
	for i := range 2 { // llama_a's context is 128 positions
		var s []int
		for _, b := range []byte(passage(t, 200000+i*5000, 128)) {
			s = append(s, int(b))
		}
		seqs = append(seqs, s)
	}
	tmp := t.TempDir()
	for i, v := range []struct {
		name string
		tie  bool
		edit func(cfg map[string]any)
	}{
		{"llama_a (GQA, untied head)", false, nil},
		{"llama_a with llama3 rope scaling", false, func(cfg map[string]any) {
			cfg["rope_theta"] = 500000.0
			cfg["rope_scaling"] = map[string]any{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
				"original_max_position_embeddings": 32}
		}},
		{"llama_a with a tied head", true, nil},
	} {
		t.Run(v.name, func(t *testing.T) {
			dir := goldenLlamaVariant(t, filepath.Join(tmp, fmt.Sprintf("golden%d", i)), v.tie, v.edit)
			checkAgainstLlamaCpp(t, tool, llamaCppCase{name: v.name,
				f32: exportGGUF(t, tmp, filepath.Base(dir), "f32", "--model", dir),
				q8:  exportGGUF(t, tmp, filepath.Base(dir), "q8_0", "--model", dir),
				lm:  loadMemfitLM(t, dir, ""), prompt: prompt, sequences: seqs})
		})
	}
}

// TestLlamaCppRunsFineTunedGGUF: fine-tuned LLaMAs exported as GGUF run in llama.cpp as the merged model runs in
// memfit (32 greedy tokens on the f32 file, probabilities within 1e-3, q8_0 top-1 >= 95% of 256 positions of
// War and Peace), and llama.cpp tokenizes the prompt as memfit does: the shipped llama-tiny with its Alpaca
// adapter (exported with --model --adapter), and a LoRA run trained here with MS-norm (exported with --run: the
// norm affines restored).
func TestLlamaCppRunsFineTunedGGUF(t *testing.T) {
	tool := llamaCpp(t)
	base := filepath.Join("..", "pretrained", "llama-tiny")
	tok, err := tokenizer.Load(base)
	if err != nil {
		t.Fatal(err)
	}
	text := tokenizer.AlpacaPrompt("Give three tips for staying healthy.", "")
	prompt := tok.Encode(text, true)
	sequences := [][]int{tok.Encode(passage(t, 100000, 4000), true)[:256]}
	tmp := t.TempDir()

	t.Run("llama-tiny with the Alpaca adapter", func(t *testing.T) {
		from := []string{"--model", base, "--adapter", filepath.Join("..", "pretrained", "llama-tiny-alpaca")}
		checkAgainstLlamaCpp(t, tool, llamaCppCase{name: "llama-tiny + Alpaca adapter",
			f32: exportGGUF(t, tmp, "alpaca", "f32", from...), q8: exportGGUF(t, tmp, "alpaca", "q8_0", from...),
			lm: loadMemfitLM(t, exportMerged(t, tmp, "alpaca-merged", from...), ""), text: text, prompt: prompt, sequences: sequences})
	})

	t.Run("MS-norm LoRA run", func(t *testing.T) {
		data := filepath.Join(tmp, "instr.jsonl")
		var rows []string
		for _, r := range []struct{ in, out string }{{"Name a colour.", "Blue."}, {"Name a fruit.", "An apple."},
			{"Say hello.", "Hello!"}, {"Count to three.", "One, two, three."}} {
			b, _ := json.Marshal(map[string]string{"instruction": r.in, "input": "", "output": r.out})
			rows = append(rows, string(b))
		}
		if err := os.WriteFile(data, []byte(strings.Join(rows, "\n")+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(tmp, "run")
		if _, errOut, code := run(t, "train", "--model", base, "--data", data, "--seq-len", "64", "--out", out, "--lora-targets", "all-linear",
			"--ms-norm", "--steps", "6", "--batch-size", "4", "--lr", "1e-2"); code != 0 {
			t.Fatalf("train: exit %d: %s", code, errOut)
		}
		from := []string{"--run", out}
		checkAgainstLlamaCpp(t, tool, llamaCppCase{name: "MS-norm LoRA run",
			f32: exportGGUF(t, tmp, "msnorm", "f32", from...), q8: exportGGUF(t, tmp, "msnorm", "q8_0", from...),
			lm: loadMemfitLM(t, exportMerged(t, tmp, "msnorm-merged", from...), ""), text: text, prompt: prompt, sequences: sequences})
	})
}

// tinyLlamaFor writes to dir a one-layer LLaMA causal LM with random weights and vocab tokens (the vocabulary of
// the tokenizer it is exported with): enough for a GGUF that carries that tokenizer.
func tinyLlamaFor(t *testing.T, dir string, vocab, bos, eos int) string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const hidden, inter, heads, headDim = 32, 64, 2, 16
	cfg := map[string]any{"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama", "vocab_size": vocab,
		"hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": 1, "num_attention_heads": heads,
		"num_key_value_heads": 1, "head_dim": headDim, "max_position_embeddings": 256, "rms_norm_eps": 1e-5,
		"rope_theta": 10000.0, "tie_word_embeddings": true, "bos_token_id": bos, "eos_token_id": eos, "hidden_act": "silu"}
	ones := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = 1
		}
		return x
	}
	p := "model.layers.0."
	ts := map[string]*tensors.Tensor{
		"model.embed_tokens.weight":           gtest.Tensor(gtest.Rand(1, vocab*hidden, 0.02), vocab, hidden),
		"model.norm.weight":                   gtest.Tensor(ones(hidden), hidden),
		p + "input_layernorm.weight":          gtest.Tensor(ones(hidden), hidden),
		p + "post_attention_layernorm.weight": gtest.Tensor(ones(hidden), hidden),
		p + "self_attn.q_proj.weight":         gtest.Tensor(gtest.Rand(2, heads*headDim*hidden, 0.1), heads*headDim, hidden),
		p + "self_attn.k_proj.weight":         gtest.Tensor(gtest.Rand(3, headDim*hidden, 0.1), headDim, hidden),
		p + "self_attn.v_proj.weight":         gtest.Tensor(gtest.Rand(4, headDim*hidden, 0.1), headDim, hidden),
		p + "self_attn.o_proj.weight":         gtest.Tensor(gtest.Rand(5, hidden*heads*headDim, 0.1), hidden, heads*headDim),
		p + "mlp.gate_proj.weight":            gtest.Tensor(gtest.Rand(6, inter*hidden, 0.1), inter, hidden),
		p + "mlp.up_proj.weight":              gtest.Tensor(gtest.Rand(7, inter*hidden, 0.1), inter, hidden),
		p + "mlp.down_proj.weight":            gtest.Tensor(gtest.Rand(8, hidden*inter, 0.1), hidden, inter),
	}
	if err := safetensors.WriteTensors(filepath.Join(dir, "model.safetensors"), ts, "", nil); err != nil {
		t.Fatal(err)
	}
	c, _ := json.MarshalIndent(cfg, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "config.json"), c, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// tokenizerRefs reads the reference encodings of a JSONL file ({"text", "ids"} per line).
func tokenizerRefs(t *testing.T, path string) (texts []string, ids [][]int) {
	t.Helper()
	for _, line := range strings.Split(strings.TrimSpace(string(mustRead(t, path))), "\n") {
		var r struct {
			Text string
			IDs  []int
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		texts, ids = append(texts, r.Text), append(ids, r.IDs)
	}
	return texts, ids
}

// llama2Refs reads the prompts and ids of llama2.c's tokenizer test (the shared excerpt).
func llama2Refs(t *testing.T, path string) (texts []string, ids [][]int) {
	t.Helper()
	src := string(mustRead(t, path))
	prompts := regexp.MustCompile(`char\s*\*\s*prompt\d*\s*=\s*"((?:[^"\\]|\\.)*)";`).FindAllStringSubmatch(src, -1)
	expected := regexp.MustCompile(`int expected_tokens\d*\[\]\s*=\s*\{([^}]*)\};`).FindAllStringSubmatch(src, -1)
	if len(prompts) != 5 || len(expected) != 5 {
		t.Fatalf("%s: found %d prompts and %d expectations", path, len(prompts), len(expected))
	}
	for i := range prompts {
		text, err := strconv.Unquote(`"` + prompts[i][1] + `"`)
		if err != nil {
			t.Fatal(err)
		}
		var want []int
		for _, f := range strings.Split(expected[i][1], ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, n)
		}
		texts, ids = append(texts, text), append(ids, want)
	}
	return texts, ids
}

// TestLlamaCppTokenizesAsMemfit: each kind of tokenizer GGUF export writes (byte-level BPE as "gpt2": Llama-3's
// and llama-tiny's; SentencePiece as "llama": Llama-2's tokenizer.model and Mistral's tokenizer.json with byte
// fallback) is read by llama.cpp, which then encodes the shared tokenizer test strings (and the edge cases of
// tokenizer/testdata) exactly as memfit does, and as the reference encodings say.
func TestLlamaCppTokenizesAsMemfit(t *testing.T) {
	tool := llamaCpp(t)
	shared := filepath.Join(golden.SharedDir(t), "tokenizers")
	edge := filepath.Join("..", "tokenizer", "testdata")
	tmp := t.TempDir()
	for _, c := range []struct {
		name, tokenizer, kind string
		refs                  []string
		more                  []string // strings to encode without a reference for this tokenizer
		// plain says the tokenizer reads special-token text ("<s>") as text, as SentencePiece does with a bare
		// tokenizer.model (a tokenizer.json's added tokens are matched in the text): llama.cpp is then asked not
		// to parse special tokens either.
		plain bool
	}{
		{"llama3", filepath.Join(shared, "llama3"), "bpe", []string{filepath.Join(shared, "llama3", "golden.jsonl"), filepath.Join(edge, "llama3.edge.jsonl")}, nil, false},
		{"llama-tiny", filepath.Join("..", "pretrained", "llama-tiny"), "bpe", []string{filepath.Join(edge, "memfit-bpe4k.edge.jsonl")}, nil, false},
		{"llama2", filepath.Join(shared, "llama2", "tokenizer.model"), "spm", []string{filepath.Join(shared, "llama2", "llama2c_test_excerpt.txt")},
			[]string{filepath.Join(shared, "mistral", "golden.jsonl"), filepath.Join(edge, "mistral.edge.jsonl")}, true},
		{"mistral", filepath.Join(shared, "mistral"), "spm", []string{filepath.Join(shared, "mistral", "golden.jsonl"), filepath.Join(edge, "mistral.edge.jsonl")}, nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			tok, err := tokenizer.Load(c.tokenizer)
			if err != nil {
				t.Fatal(err)
			}
			var texts []string
			var refs [][]int
			for _, r := range c.refs {
				var tx []string
				var ids [][]int
				if strings.HasSuffix(r, ".txt") {
					tx, ids = llama2Refs(t, r)
				} else {
					tx, ids = tokenizerRefs(t, r)
				}
				texts, refs = append(texts, tx...), append(refs, ids...)
			}
			for _, m := range c.more {
				tx, _ := tokenizerRefs(t, m)
				texts, refs = append(texts, tx...), append(refs, make([][]int, len(tx))...)
			}
			bos, _ := tok.BOS()
			eos, _ := tok.EOS()
			model := tinyLlamaFor(t, filepath.Join(tmp, c.name), tok.VocabSize(), bos, eos)
			file := exportGGUF(t, tmp, c.name, "q8_0", "--model", model, "--tokenizer", c.tokenizer)
			req := llamacpp.Request{Model: file, VocabOnly: true}
			for _, tx := range texts {
				req.Tokenize = append(req.Tokenize, llamacpp.TokenizeRequest{Text: tx, Special: !c.plain, AddSpecial: true})
			}
			res := runLlamaCpp(t, tool, req)
			if len(res.Tokenize) != len(texts) {
				t.Fatalf("llama.cpp tokenized %d strings of %d", len(res.Tokenize), len(texts))
			}
			if res.Model.VocabType != c.kind {
				t.Errorf("llama.cpp reads the vocabulary as %q, want %q", res.Model.VocabType, c.kind)
			}
			same := 0
			for i, tx := range texts {
				got, want := res.Tokenize[i], tok.Encode(tx, true)
				if fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("%q: llama.cpp %v, memfit %v (reference %v)", tx, got, want, refs[i])
					continue
				}
				same++
				if refs[i] != nil && fmt.Sprint(got) != fmt.Sprint(refs[i]) {
					t.Errorf("%q: llama.cpp and memfit %v, the reference %v", tx, got, refs[i])
				}
			}
			t.Logf("%s (%s): llama.cpp encodes %d of %d strings as memfit does", c.name, res.Model.VocabType, same, len(texts))
		})
	}
}

// TestBenchGenerateLlamaCppColumn: `bench generate` exports the model as GGUF and times llama.cpp's decoding of
// the same prompts beside memfit's and PyTorch's: llama.cpp's greedy tokens equal memfit's for every row, its
// tokens/s and prefill are measured, and the table has the column.
func TestBenchGenerateLlamaCppColumn(t *testing.T) {
	llamaCpp(t)
	out := filepath.Join(t.TempDir(), "bench")
	stdout, errOut, code := run(t, "bench", "generate", "--model", filepath.Join("..", "pretrained", "llama-tiny"), "--batch-sizes", "1,3",
		"--prompt-len", "8", "--new-tokens", "10", "--runs", "1", "--out", out, "--script", filepath.Join("..", "bench", "pytorch", "generate_compare.py"),
		"--llama-cpp", filepath.Join("..", "tools", "llamacpp"), "--llama-cpp-threads", "1")
	var res struct {
		LlamaCpp map[string]string `json:"llamacpp"`
		Problems []string
		Cases    []struct {
			Batch      int
			LlamaCpp   float64                  `json:"llamacpp_decode_tokens_per_second"`
			Prefill    float64                  `json:"llamacpp_prefill_seconds"`
			Same       bool                     `json:"llamacpp_same_tokens"`
			Difference string                   `json:"llamacpp_first_difference"`
			Side       struct{ Tokens [][]int } `json:"LlamaCppSide"`
		}
	}
	if err := json.Unmarshal(mustRead(t, filepath.Join(out, "generate.json")), &res); err != nil {
		t.Fatalf("exit %d: %s; generate.json: %v", code, errOut, err)
	}
	for _, p := range res.Problems {
		if strings.Contains(p, "llama.cpp") {
			t.Errorf("problem: %s", p)
		}
	}
	if len(res.Cases) != 2 || res.LlamaCpp["threads"] != "1" || res.LlamaCpp["gguf_type"] != "f32" {
		t.Fatalf("%d cases, llama.cpp %v", len(res.Cases), res.LlamaCpp)
	}
	for _, c := range res.Cases {
		if !c.Same || c.LlamaCpp <= 0 || c.Prefill <= 0 || len(c.Side.Tokens) != c.Batch || len(c.Side.Tokens[0]) != 10 {
			t.Errorf("batch %d: llama.cpp same tokens %v (%s), %g tokens/s, prefill %g s, tokens %v", c.Batch, c.Same, c.Difference, c.LlamaCpp, c.Prefill, c.Side.Tokens)
		}
	}
	if !strings.Contains(stdout, "llama.cpp decode") || !strings.Contains(stdout, "memfit / llama.cpp") {
		t.Errorf("the table has no llama.cpp column:\n%s", stdout)
	}
}

// TestBenchGenerateLlamaCppBadInput: bad llama.cpp flags of `bench generate` are refused before anything runs,
// with one line naming the flag, and nothing is written.
func TestBenchGenerateLlamaCppBadInput(t *testing.T) {
	tmp := t.TempDir()
	notGGUF := filepath.Join(tmp, "model.gguf")
	if err := os.WriteFile(notGGUF, []byte("PK\x03\x04 a zip, not a GGUF"), 0o644); err != nil {
		t.Fatal(err)
	}
	model := filepath.Join("..", "pretrained", "llama-tiny")
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--gguf", notGGUF}, "not a GGUF file"},
		{[]string{"--gguf", filepath.Join(tmp, "missing.gguf")}, "--gguf"},
		{[]string{"--llama-cpp-threads", "-3"}, "--llama-cpp-threads -3"},
		{[]string{"--llama-cpp", tmp}, "no llamacpp.mjs here"},
	}
	if _, err := llamacpp.Install(filepath.Join("..", "tools", "llamacpp"), nil); !errors.Is(err, llamacpp.ErrNoNode) {
		// The script without its package files (only where node and npm are there: without them the column is
		// left out with a note).
		bare := filepath.Join(tmp, "bare")
		if err := os.MkdirAll(bare, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(bare, "llamacpp.mjs"), mustRead(t, filepath.Join("..", "tools", "llamacpp", "llamacpp.mjs")), 0o644); err != nil {
			t.Fatal(err)
		}
		cases = append(cases, struct {
			args []string
			want string
		}{[]string{"--llama-cpp", bare}, bare + ": no package.json to install the tool from"})
	}
	for _, c := range cases {
		out := filepath.Join(tmp, "out")
		args := append([]string{"bench", "generate", "--model", model, "--out", out, "--runs", "1", "--new-tokens", "2", "--batch-sizes", "1"}, c.args...)
		_, errOut, code := run(t, args...)
		if code == 0 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want one line with %q", c.args, code, errOut, c.want)
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%v: %s was written", c.args, out)
		}
	}
}
