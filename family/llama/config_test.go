package llama_test

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/models/decoder"
)

func TestGoldenConfigs(t *testing.T) {
	dir := golden.SharedDir(t)
	for _, tc := range []struct {
		name, arch string
		labels     int
	}{{"llama_a", decoder.CausalLM, 0}, {"llama_c", decoder.SequenceClassification, 3}} {
		c, err := llama.LoadConfig(filepath.Join(dir, "golden", tc.name))
		if err != nil {
			t.Fatal(err)
		}
		if c.Task != tc.arch || len(c.Labels) != tc.labels || c.NumKeyValueHeads != 2 || c.HeadDim != 16 ||
			c.RMSNormEps != 1e-5 || c.VocabSize != 256 || c.IntermediateSize != 172 || c.TieWordEmbeddings || len(c.Unknown) != 0 {
			t.Errorf("%s: decoded %+v", tc.name, c)
		}
	}
}

// TestInvFreqMatchesGolden compares the rotary inverse frequencies with transformers'.
func TestInvFreqMatchesGolden(t *testing.T) {
	g := golden.Load(t, "llama_a")
	c, err := llama.LoadConfig(g.Dir)
	if err != nil {
		t.Fatal(err)
	}
	want := g.Array(t, "rope_inv_freq").Float32s()
	got := c.InvFreq()
	if len(got) != len(want) {
		t.Fatalf("%d frequencies, want %d", len(got), len(want))
	}
	for i := range want {
		if math.Abs(float64(got[i]-want[i])) > 1e-7*math.Abs(float64(want[i]))+1e-12 {
			t.Errorf("inv_freq[%d] = %g, want %g", i, got[i], want[i])
		}
	}
}

// TestLlama3Scaling checks the llama3 frequency adjustment against hand-derived values: high frequencies are
// unchanged, low ones divided by the factor, the middle band interpolated.
func TestLlama3Scaling(t *testing.T) {
	c, err := llama.ParseConfig([]byte(`{"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":16,
		"num_hidden_layers":1,"num_attention_heads":1,"head_dim":8,"rope_theta":500000,
		"rope_scaling":{"rope_type":"llama3","factor":8,"low_freq_factor":1,"high_freq_factor":4,"original_max_position_embeddings":8192}}`))
	if err != nil {
		t.Fatal(err)
	}
	got := c.InvFreq()
	for i, f := range got {
		plain := 1 / math.Pow(500000, float64(2*i)/8)
		wavelen := 2 * math.Pi / plain
		var want float64
		switch {
		case wavelen < 8192.0/4:
			want = plain
		case wavelen > 8192:
			want = plain / 8
		default:
			s := (8192/wavelen - 1) / 3
			want = (1-s)*plain/8 + s*plain
		}
		if math.Abs(float64(f)-want) > 1e-6*want {
			t.Errorf("inv_freq[%d] = %g, want %g", i, f, want)
		}
	}
}

func TestConfigErrors(t *testing.T) {
	base := `"vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2`
	for _, tc := range []struct{ json, want string }{
		{`{"model_type":"gpt2",` + base + `}`, `"model_type" is "gpt2"`},
		{`{` + base + `}`, `"model_type" is missing`},
		{`{"model_type":"llama","hidden_size":8}`, `"vocab_size" is missing`},
		{`{"model_type":"llama",` + base + `,"hidden_act":"gelu"}`, `"hidden_act"`},
		{`{"model_type":"llama",` + base + `,"rope_scaling":{"rope_type":"yarn","factor":4}}`, `rope_scaling type "yarn" is not supported by memfit: supported are default, linear, llama3 and longrope`},
		{`{"model_type":"llama",` + base + `,"rope_scaling":{"type":"dynamic","factor":2}}`, `rope_scaling type "dynamic" is not supported`},
		{`{"model_type":"llama",` + base + `,"rope_scaling":{"rope_type":"longrope","factor":2}}`, `"short_factor" is missing (rope_type "longrope" needs it)`},
		{`{"model_type":"llama",` + base + `,"rope_parameters":{"rope_type":"yarn","factor":4,"rope_theta":10000}}`, `rope_parameters type "yarn" is not supported`},
		{`{"model_type":"llama",` + base + `,"rope_scaling":"llama3"}`, `field "rope_scaling" is "llama3": want an object`},
		{`{"model_type":"llama",` + base + `,"rope_scaling":[8]}`, `field "rope_scaling" is [8]: want an object`},
		{`{"model_type":"llama",` + base + `,"rope_scaling":{"factor":8}}`, `field "rope_scaling": no rope_type`},
		{`{"model_type":"llama",` + base + `,"rope_scaling":{"rope_type":8}}`, `"rope_type" is 8: want a string`},
		{`{"model_type":"llama",` + base + `,"rope_scaling":{"rope_type":"linear","factor":"2"}}`, `"factor" is "2": want a number`},
		{`{"model_type":"llama",` + base + `,"rope_scaling":{"rope_type":"linear"}}`, `"factor" is missing`},
		{`{"model_type":"llama",` + base + `,"rope_scaling":{"rope_type":"linear","factor":-2}}`, `"factor" is -2: it must be positive`},
		{`{"model_type":"llama",` + base + `,"rope_scaling":{"rope_type":"linear","factor":2,"beta_fast":32}}`, `option "beta_fast" is not supported with rope_type "linear"`},
		{`{"model_type":"llama",` + base + `,"rope_scaling":{"rope_type":"llama3","type":"linear","factor":2}}`, `rope_type "llama3" and type "linear" differ`},
		{`{"model_type":"llama",` + base + `,"rope_scaling":{"rope_type":"linear","factor":2},"rope_parameters":{"rope_type":"default"}}`, `both given`},
		{`{"model_type":"llama",` + base + `,"rope_theta":500000,"rope_parameters":{"rope_type":"default","rope_theta":10000}}`, `"rope_theta" is 500000 but rope_parameters' rope_theta is 10000`},
		{`{"model_type":"llama",` + base + `,"partial_rotary_factor":0.5}`, `"partial_rotary_factor" is 0.5`},
		{`{"model_type":"llama",` + base + `,"max_position_embeddings":0}`, `"max_position_embeddings" must be positive, got 0`},
		{`{"model_type":"llama",` + base + `,"max_position_embeddings":-4}`, `"max_position_embeddings" must be positive, got -4`},
		{`{"model_type":"llama",` + base + `,"eos_token_id":[2,10]}`, `field "eos_token_id" holds 10, outside the vocabulary [0, 10) (vocab_size)`},
		{`{"model_type":"llama",` + base + `,"eos_token_id":-3}`, `field "eos_token_id" holds -3, outside the vocabulary`},
		{`{"model_type":"llama",` + base + `,"eos_token_id":"</s>"}`, `field "eos_token_id" is "</s>": want a token id (a whole number) or a list of token ids`},
		{`{"model_type":"llama",` + base + `,"eos_token_id":[]}`, `field "eos_token_id" is []: want a token id`},
		{`{"model_type":"llama",` + base + `,"eos_token_id":[1.5]}`, `field "eos_token_id" is [1.5]: want a token id`},
		{`{"model_type":"llama",` + base + `,"bos_token_id":12}`, `field "bos_token_id" is 12, outside the vocabulary [0, 10)`},
		{`{"model_type":"llama",` + base + `,"bos_token_id":[1,2]}`, `field "bos_token_id" lists 2 ids: give one`},
		{`{"model_type":"llama",` + base + `,"pad_token_id":10}`, `field "pad_token_id" is 10, outside the vocabulary [0, 10) (vocab_size): give an id inside it, or -1 or null for none`},
		{`{"model_type":"llama",` + base + `,"pad_token_id":-2}`, `field "pad_token_id" is -2`},
		{`{"model_type":"llama",` + base + `,"hidden_size":9}`, `field "hidden_size" (9) is not a multiple of "num_attention_heads" (2), and no head_dim is given`},
		{`{"model_type":"llama",` + base + `,"rms_norm_eps":0}`, `field "rms_norm_eps" must be positive, got 0`},
		{`{"model_type":"llama",` + base + `,"rope_theta":-1}`, `field "rope_theta" must be positive, got -1`},
		{`{"model_type":"llama",` + base + `,"num_hidden_layers":"four"}`, `field "num_hidden_layers" is "four": want a whole number`},
		{`{"model_type":"llama",` + base + `,"tie_word_embeddings":"yes"}`, `field "tie_word_embeddings" is "yes": want true or false`},
		{`{"model_type":"llama",` + base + `,"architectures":"LlamaForCausalLM"}`, `field "architectures" is "LlamaForCausalLM": want a list of strings`},
		{`{"model_type":"llama",` + base + `,"num_key_value_heads":3}`, `"num_key_value_heads"`},
		{`{"model_type":"llama",` + base + `,"architectures":["LlamaForQuestionAnswering"]}`, `"architectures"`},
		{`{"model_type":"llama",` + base + `,"architectures":["LlamaForSequenceClassification"],"num_labels":2}`, `"pad_token_id"`},
		{`{"model_type":"llama",` + base + `,"hidden_size":"big"}`, `field "hidden_size"`},
		{`[1,2]`, `not a JSON object`},
	} {
		_, err := llama.ParseConfig([]byte(tc.json))
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error %v, want one line containing %s", tc.json, err, tc.want)
		}
		for _, goType := range []string{"Go value", "interface {}", "map[", "json:", "float64", "type int"} {
			if err != nil && strings.Contains(err.Error(), goType) && !strings.Contains(tc.want, goType) {
				t.Errorf("%s: error %v names a Go type (%s)", tc.json, err, goType)
			}
		}
	}
	if _, err := llama.LoadConfig(t.TempDir()); err == nil || !strings.Contains(err.Error(), "no config.json") {
		t.Errorf("missing config.json: %v", err)
	}
}

func TestConfigRoundTripAndPresets(t *testing.T) {
	for _, name := range []string{"tiny", "llama-1b", "llama-7b"} {
		for _, labels := range []int{0, 3} {
			c, err := llama.Preset(name, labels)
			if err != nil {
				t.Fatal(err)
			}
			data, err := llama.JSON(c)
			if err != nil {
				t.Fatal(err)
			}
			back, err := llama.ParseConfig(data)
			if err != nil {
				t.Fatalf("%s: written config does not parse: %v\n%s", name, err, data)
			}
			if len(back.Unknown) != 0 || back.HiddenSize != c.HiddenSize || back.Task != c.Task || len(back.Labels) != labels {
				t.Errorf("%s: round trip %+v -> %+v", name, c, back)
			}
		}
	}
	if _, err := llama.Preset("llama-70b", 0); err == nil {
		t.Error("unknown preset accepted")
	}
	_ = os.Remove
}

// TestHuggingFaceConfigForms: the forms transformers reads that memfit takes too: eos_token_id as a list (every
// Llama-3.x Instruct config), null or -1 pad ids, rope_scaling "default" and "linear", transformers 5's
// rope_parameters, head_dim given with a hidden size the heads do not divide.
func TestHuggingFaceConfigForms(t *testing.T) {
	base := `"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2`
	parse := func(extra string) decoder.Config {
		t.Helper()
		c, err := llama.ParseConfig([]byte(`{` + base + extra + `}`))
		if err != nil {
			t.Fatalf("%s: %v", extra, err)
		}
		return c
	}
	c := parse(`,"bos_token_id":1,"eos_token_id":[2,7,9],"pad_token_id":null`)
	if c.EOSTokenID != 2 || !slices.Equal(c.EOSIDs(), []int{2, 7, 9}) || c.PadTokenID != -1 || c.BOSTokenID != 1 {
		t.Errorf("eos list: EOSTokenID %d, EOSIDs %v, pad %d", c.EOSTokenID, c.EOSIDs(), c.PadTokenID)
	}
	data, err := llama.JSON(c)
	if err != nil {
		t.Fatal(err)
	}
	if back, err := llama.ParseConfig(data); err != nil || !slices.Equal(back.EOSIDs(), []int{2, 7, 9}) {
		t.Errorf("eos list round trip: %v, %v\n%s", back.EOSIDs(), err, data)
	}
	if c := parse(`,"eos_token_id":2,"pad_token_id":-1`); !slices.Equal(c.EOSIDs(), []int{2}) || c.PadTokenID != -1 {
		t.Errorf("one eos id: %v, pad %d", c.EOSIDs(), c.PadTokenID)
	}
	if ids := (decoder.Config{EOSTokenID: 3}).EOSIDs(); !slices.Equal(ids, []int{3}) {
		t.Errorf("a Go config with EOSTokenID alone: EOSIDs %v", ids)
	}
	if ids := (decoder.Config{EOSTokenID: -1}).EOSIDs(); len(ids) != 0 {
		t.Errorf("no eos: EOSIDs %v", ids)
	}
	plain := parse(``).InvFreq()
	if c := parse(`,"rope_scaling":{"rope_type":"default"}`); c.RopeScaling != nil {
		t.Errorf("rope_type default: scaling %+v, want none", c.RopeScaling)
	}
	lin := parse(`,"rope_scaling":{"type":"linear","factor":4}`)
	for i, f := range lin.InvFreq() {
		if f != plain[i]/4 {
			t.Errorf("linear: inv_freq[%d] = %g, want %g / 4", i, f, plain[i])
		}
	}
	data, _ = llama.JSON(lin)
	if back, err := llama.ParseConfig(data); err != nil || back.RopeScaling == nil || back.RopeScaling.Type != decoder.RopeLinear || back.RopeScaling.Factor != 4 {
		t.Errorf("linear round trip: %+v, %v", back.RopeScaling, err)
	}
	v5 := parse(`,"rope_parameters":{"rope_type":"llama3","rope_theta":500000,"factor":8,"low_freq_factor":1,"high_freq_factor":4,"original_max_position_embeddings":8192}`)
	v4 := parse(`,"rope_theta":500000,"rope_scaling":{"rope_type":"llama3","factor":8,"low_freq_factor":1,"high_freq_factor":4,"original_max_position_embeddings":8192}`)
	if v5.RopeTheta != 500000 || !slices.Equal(v5.InvFreq(), v4.InvFreq()) {
		t.Errorf("rope_parameters: theta %g, inv_freq %v, want %v", v5.RopeTheta, v5.InvFreq(), v4.InvFreq())
	}
	if c := parse(`,"hidden_size":9,"head_dim":4`); c.HeadDim != 4 {
		t.Errorf("head_dim given: %d", c.HeadDim)
	}
}
