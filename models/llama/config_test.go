package llama_test

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/models/llama"
)

func TestGoldenConfigs(t *testing.T) {
	dir := golden.SharedDir(t)
	for _, tc := range []struct {
		name, arch string
		labels     int
	}{{"llama_a", llama.ArchCausalLM, 0}, {"llama_c", llama.ArchClassification, 3}} {
		c, err := llama.LoadConfig(filepath.Join(dir, "golden", tc.name))
		if err != nil {
			t.Fatal(err)
		}
		if c.Architecture != tc.arch || len(c.Labels) != tc.labels || c.NumKeyValueHeads != 2 || c.HeadDim != 16 ||
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
		{`{"model_type":"llama",` + base + `,"rope_scaling":{"rope_type":"yarn","factor":4}}`, `rope_type "yarn"`},
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
			data, err := c.JSON()
			if err != nil {
				t.Fatal(err)
			}
			back, err := llama.ParseConfig(data)
			if err != nil {
				t.Fatalf("%s: written config does not parse: %v\n%s", name, err, data)
			}
			if len(back.Unknown) != 0 || back.HiddenSize != c.HiddenSize || back.Architecture != c.Architecture || len(back.Labels) != labels {
				t.Errorf("%s: round trip %+v -> %+v", name, c, back)
			}
		}
	}
	if _, err := llama.Preset("llama-70b", 0); err == nil {
		t.Error("unknown preset accepted")
	}
	_ = os.Remove
}
