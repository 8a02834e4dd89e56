package all_test

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/memfit/memfit/family/lm"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/models/decoder"
)

// decoderFamilies are the shipped families on the decoder graph.
var decoderFamilies = []string{"llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3_text", "phi3"}

// shaped writes config.json to a folder and decodes it as fam's (Family.Shaped).
func shaped(t *testing.T, fam finetune.Family, config string) (decoder.Config, error) {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := fam.Shaped(dir, finetune.ModelOptions{})
	if err != nil {
		return decoder.Config{}, err
	}
	return m.(lm.Model).Config, nil
}

// TestFamilyConfigRoundTrip: every preset of every decoder family, as a causal LM and as a classifier, writes a
// config.json that its family reads back to the same config, and that names the family's class.
func TestFamilyConfigRoundTrip(t *testing.T) {
	for _, name := range decoderFamilies {
		fam, ok := finetune.FamilyByName(name)
		if !ok {
			t.Fatalf("family %s is not registered", name)
		}
		for _, preset := range fam.Presets {
			for _, labels := range []int{0, 3} {
				m, err := fam.Preset(preset, labels, finetune.ModelOptions{})
				if err != nil {
					t.Fatalf("%s:%s: %v", name, preset, err)
				}
				data, err := m.ConfigJSON()
				if err != nil {
					t.Fatal(err)
				}
				back, err := shaped(t, fam, string(data))
				if err != nil {
					t.Fatalf("%s:%s: %v\n%s", name, preset, err, data)
				}
				want := m.(lm.Model).Config
				if len(back.Unknown) != 0 {
					t.Errorf("%s:%s: unknown fields %v", name, preset, back.Unknown)
				}
				back.Unknown = nil
				if !slices.Contains(want.Sliding, true) { // no sliding layers: no flags written, none read
					want.Sliding, back.Sliding = nil, nil
				}
				if !reflect.DeepEqual(back, want) {
					t.Errorf("%s:%s (%d labels): read back\n%+v\nwant\n%+v\n%s", name, preset, labels, back, want, data)
				}
				if spec := m.(lm.Model).Spec; !strings.Contains(string(data), map[bool]string{false: spec.CausalLM, true: spec.Classifier}[labels > 0]) {
					t.Errorf("%s:%s: config.json does not name its class\n%s", name, preset, data)
				}
			}
		}
	}
}

// TestFamilyConfigForms: configs as released models' folders and each transformers version write them decode to
// what transformers builds, and what memfit does not build is refused with one line naming the field.
func TestFamilyConfigForms(t *testing.T) {
	family := func(name string) finetune.Family { return familyNamed(t, name) }
	decode := func(name, config string) decoder.Config { return decodeConfig(t, name, config) }
	// Qwen2.5-0.5B (transformers 4.43): sliding_window set but use_sliding_window false: no sliding layer.
	q := decode("qwen2", `{"architectures":["Qwen2ForCausalLM"],"attention_dropout":0.0,"bos_token_id":151643,"eos_token_id":151643,
		"hidden_act":"silu","hidden_size":896,"initializer_range":0.02,"intermediate_size":4864,"max_position_embeddings":32768,
		"max_window_layers":24,"model_type":"qwen2","num_attention_heads":14,"num_hidden_layers":24,"num_key_value_heads":2,
		"rms_norm_eps":1e-06,"rope_theta":1000000.0,"sliding_window":32768,"tie_word_embeddings":true,"torch_dtype":"bfloat16",
		"transformers_version":"4.43.1","use_cache":true,"use_sliding_window":false,"vocab_size":151936}`)
	if slices.Contains(q.Sliding, true) || !q.QKVBias || q.HeadDim != 64 || !q.TieWordEmbeddings || len(q.Unknown) != 0 {
		t.Errorf("qwen2.5-0.5b: %+v", q)
	}
	// Qwen3 without head_dim takes Qwen3Config's 128.
	if c := decode("qwen3", `{"model_type":"qwen3","vocab_size":100,"hidden_size":64,"intermediate_size":96,"num_hidden_layers":1,
		"num_attention_heads":2}`); c.HeadDim != 128 || !c.QKNorm {
		t.Errorf("qwen3 default head_dim: %+v", c)
	}
	// Mistral-7B-v0.1: a 4096-token window on every layer; without sliding_window in config.json, the same default.
	m := decode("mistral", `{"architectures":["MistralForCausalLM"],"bos_token_id":1,"eos_token_id":2,"hidden_act":"silu",
		"hidden_size":4096,"initializer_range":0.02,"intermediate_size":14336,"max_position_embeddings":32768,"model_type":"mistral",
		"num_attention_heads":32,"num_hidden_layers":32,"num_key_value_heads":8,"rms_norm_eps":1e-05,"rope_theta":10000.0,
		"sliding_window":4096,"tie_word_embeddings":false,"torch_dtype":"bfloat16","transformers_version":"4.34.0.dev0",
		"use_cache":true,"vocab_size":32000}`)
	if m.SlidingWindow != 4096 || len(m.Sliding) != 32 || slices.Contains(m.Sliding, false) || m.HeadDim != 128 {
		t.Errorf("mistral-7b-v0.1: window %d, sliding %v", m.SlidingWindow, m.Sliding)
	}
	// Gemma-2-2b (transformers 4.42: no layer_types, cache_implementation): even layers sliding, both caps.
	g := decode("gemma2", `{"architectures":["Gemma2ForCausalLM"],"attention_bias":false,"attention_dropout":0.0,
		"attn_logit_softcapping":50.0,"bos_token_id":2,"cache_implementation":"hybrid","eos_token_id":1,"final_logit_softcapping":30.0,
		"head_dim":256,"hidden_act":"gelu_pytorch_tanh","hidden_activation":"gelu_pytorch_tanh","hidden_size":2304,
		"initializer_range":0.02,"intermediate_size":9216,"max_position_embeddings":8192,"model_type":"gemma2","num_attention_heads":8,
		"num_hidden_layers":26,"num_key_value_heads":4,"pad_token_id":0,"query_pre_attn_scalar":256,"rms_norm_eps":1e-06,
		"rope_theta":10000.0,"sliding_window":4096,"torch_dtype":"float32","transformers_version":"4.42.4","use_cache":true,
		"vocab_size":256000}`)
	if g.AttnSoftCap != 50 || g.FinalSoftCap != 30 || !g.Sliding[0] || g.Sliding[1] || g.Activation != decoder.ActGELUTanh || !g.NormPlusOne || len(g.Unknown) != 0 {
		t.Errorf("gemma-2-2b: %+v", g)
	}
	// Gemma 3 text: sliding_window_pattern 6 (every sixth layer full), attn_logit_softcapping ignored as transformers does.
	g3 := decode("gemma3_text", `{"model_type":"gemma3_text","vocab_size":100,"hidden_size":32,"intermediate_size":64,"num_hidden_layers":12,
		"num_attention_heads":2,"num_key_value_heads":1,"head_dim":16,"sliding_window":8,"attn_logit_softcapping":50.0,
		"rope_scaling":{"rope_type":"linear","factor":8.0}}`)
	if g3.AttnSoftCap != 0 || g3.Sliding[4] == false || g3.Sliding[5] || g3.Sliding[11] || g3.LocalRopeTheta != 10000 || g3.RopeScaling == nil ||
		g3.RopeFor(true, 0).InvFreq[1] == g3.RopeFor(false, 0).InvFreq[1] {
		t.Errorf("gemma3: %+v", g3)
	}
	// Phi-3.5-mini-like longrope: 48 factors per list for head_dim 96, factor 131072 / 4096 = 32 from the top-level
	// original_max_position_embeddings; "su" read as longrope.
	factors := strings.TrimSuffix(strings.Repeat("1.5,", 48), ",")
	p := decode("phi3", `{"architectures":["Phi3ForCausalLM"],"model_type":"phi3","vocab_size":32064,"hidden_size":3072,"intermediate_size":8192,
		"num_hidden_layers":2,"num_attention_heads":32,"num_key_value_heads":32,"max_position_embeddings":131072,
		"original_max_position_embeddings":4096,"rope_scaling":{"type":"su","short_factor":[`+factors+`],"long_factor":[`+factors+`]},
		"sliding_window":262144,"bos_token_id":1,"eos_token_id":32000,"pad_token_id":32000,"embd_pdrop":0.0,"resid_pdrop":0.0}`)
	if s := p.RopeScaling; s == nil || s.Type != decoder.RopeLongRope || s.Factor != 32 || s.OriginalMaxPositionEmbeddings != 4096 || !p.FusedQKV ||
		p.RopeFor(false, 0).Scale < 1.18 || p.RopeFor(false, 0).Scale > 1.20 {
		t.Errorf("phi-3.5 longrope: %+v scale %g", p.RopeScaling, p.RopeFor(false, 0).Scale)
	}
	for _, bad := range []struct{ family, config, want string }{
		{"qwen2", `{"model_type":"qwen2","vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"hidden_act":"gelu"}`, `field "hidden_act" is "gelu"`},
		{"qwen2", `{"model_type":"qwen2","vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"rope_scaling":{"type":"yarn","factor":4,"original_max_position_embeddings":32768}}`, `rope_scaling type "yarn" is not supported`},
		{"gemma2", `{"model_type":"gemma2","vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"head_dim":4,"hidden_activation":"gelu"}`, `field "hidden_activation" is "gelu"`},
		{"gemma3_text", `{"model_type":"gemma3_text","vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"head_dim":4,"use_bidirectional_attention":true}`, `use_bidirectional_attention`},
		{"phi3", `{"model_type":"phi3","vocab_size":40000,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"resid_pdrop":0.1}`, `field "resid_pdrop" is 0.1`},
		{"phi3", `{"model_type":"phi3","vocab_size":40000,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,"rope_scaling":{"type":"longrope","short_factor":[1],"long_factor":[1]}}`, `longrope needs 2 short and long factors`},
		{"mistral", `{"model_type":"mistral","vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":2,"num_attention_heads":2,"layer_types":["full_attention"]}`, `"layer_types" lists 1 layers, the model has 2`},
		{"qwen3", `{"model_type":"qwen2","vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2}`, `"model_type" is "qwen2", not "qwen3"`},
	} {
		_, err := shaped(t, family(bad.family), bad.config)
		if err == nil || !strings.Contains(err.Error(), bad.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v, want one line with %q", bad.family, err, bad.want)
		}
	}
}

// familyNamed returns the registered family name, failing the test when there is none.
func familyNamed(t *testing.T, name string) finetune.Family {
	t.Helper()
	f, ok := finetune.FamilyByName(name)
	if !ok {
		t.Fatalf("family %s is not registered", name)
	}
	return f
}

// decodeConfig decodes config as family name's Shaped does (shaped), failing the test on an error.
func decodeConfig(t *testing.T, name, config string) decoder.Config {
	t.Helper()
	c, err := shaped(t, familyNamed(t, name), config)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return c
}
