package all_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/models/decoder"
)

// TestProbeFamilyConfigs: the config.json cases of the decoder-family probe (docs/probes/probe-2026-11-27-families.md)
// decode as transformers reads them, or are refused in one line naming the cause.
func TestProbeFamilyConfigs(t *testing.T) {
	family := func(name string) finetune.Family { return familyNamed(t, name) }
	decode := func(name, config string) decoder.Config {
		t.Helper()
		c := decodeConfig(t, name, config)
		c.Unknown = nil
		return c
	}
	const phi3 = `"model_type":"phi3","vocab_size":40000,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,`
	const longrope = `{"type":"longrope","short_factor":[1,1.5],"long_factor":[2,3]}`

	// cf63: Phi3Config defaults original_max_position_embeddings to 4096, and transformers' longrope takes it
	// (factor max_position_embeddings / 4096, the long factors past 4096 tokens), not max_position_embeddings.
	p := decode("phi3", `{`+phi3+`"max_position_embeddings":16384,"rope_scaling":`+longrope+`}`)
	if s := p.RopeScaling; s == nil || s.OriginalMaxPositionEmbeddings != 4096 || s.Factor != 4 {
		t.Errorf("cf63: phi3 longrope without original_max_position_embeddings: %+v, want original 4096, factor 4", s)
	}
	// cf65: Phi3Config reads a legacy rope_scaling type "yarn" (like "su") as longrope.
	if y := decode("phi3", `{`+phi3+`"max_position_embeddings":16384,"original_max_position_embeddings":4096,"rope_scaling":{"type":"yarn","short_factor":[1,1.5],"long_factor":[2,3]}}`); y.RopeScaling == nil ||
		y.RopeScaling.Type != decoder.RopeLongRope || y.RopeScaling.Factor != 4 {
		t.Errorf("cf65: phi3 rope_scaling type yarn: %+v, want longrope", y.RopeScaling)
	}
	// cf55: transformers 5 writes Phi-3's partial_rotary_factor into rope_parameters (and keeps the top-level one).
	v4 := decode("phi3", `{`+phi3+`"partial_rotary_factor":0.5,"rope_theta":10000.0,"rope_scaling":null}`)
	for _, v5 := range []string{
		`{` + phi3 + `"partial_rotary_factor":0.5,"rope_parameters":{"rope_type":"default","rope_theta":10000.0,"partial_rotary_factor":0.5}}`,
		`{` + phi3 + `"rope_parameters":{"rope_type":"default","rope_theta":10000.0,"partial_rotary_factor":0.5}}`,
	} {
		if got := decode("phi3", v5); !reflect.DeepEqual(got, v4) || got.RotaryDim() != 2 {
			t.Errorf("cf55: phi3 in transformers 5's layout\n%+v\nwant\n%+v", got, v4)
		}
	}
	// cf48: transformers 5 writes Gemma 3's rope as rope_parameters by layer type (full layers: rope_theta and the
	// scaling; sliding layers: the local base), without rope_theta or rope_local_base_freq.
	const g3 = `"model_type":"gemma3_text","vocab_size":100,"hidden_size":32,"intermediate_size":64,"num_hidden_layers":6,"num_attention_heads":2,"num_key_value_heads":1,"head_dim":16,"sliding_window":8,`
	g3v4 := decode("gemma3_text", `{`+g3+`"rope_theta":1000000.0,"rope_local_base_freq":10000.0,"rope_scaling":{"rope_type":"linear","factor":8.0}}`)
	g3v5 := decode("gemma3_text", `{`+g3+`"rope_parameters":{"full_attention":{"rope_type":"linear","factor":8.0,"rope_theta":1000000.0},"sliding_attention":{"rope_type":"default","rope_theta":10000.0}}}`)
	if !reflect.DeepEqual(g3v5, g3v4) {
		t.Errorf("cf48: gemma3_text in transformers 5's layout\n%+v\nwant\n%+v", g3v5, g3v4)
	}
	if g3v5.RopeTheta != 1e6 || g3v5.LocalRopeTheta != 1e4 || g3v5.RopeScaling == nil || g3v5.RopeScaling.Factor != 8 {
		t.Errorf("cf48: gemma3_text rope: theta %g, local %g, scaling %+v", g3v5.RopeTheta, g3v5.LocalRopeTheta, g3v5.RopeScaling)
	}
	// cf39: Gemma 2 and 3 read hidden_activation only; a leftover hidden_act is ignored, as transformers does.
	const g2 = `"model_type":"gemma2","vocab_size":100,"hidden_size":32,"intermediate_size":64,"num_hidden_layers":2,"num_attention_heads":2,"head_dim":16,`
	if c := decode("gemma2", `{`+g2+`"hidden_act":"gelu","hidden_activation":"gelu_pytorch_tanh"}`); c.Activation != decoder.ActGELUTanh {
		t.Errorf("cf39: gemma2 activation %q", c.Activation)
	}

	for _, bad := range []struct{ id, family, config, want string }{
		// cf79: a pre-quantized checkpoint (bitsandbytes, GPTQ, AWQ, FP8...) holds weights memfit does not read.
		{"cf79", "qwen2", `{"model_type":"qwen2","vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,
			"quantization_config":{"quant_method":"bitsandbytes","load_in_4bit":true}}`, `pre-quantized (quantization_config: quant_method "bitsandbytes")`},
		{"cf79", "llama", `{"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2,
			"quantization_config":{"quant_method":"gptq","bits":4}}`, `quant_method "gptq"`},
		// cf72: sliding layers with a null window name what the config says.
		{"cf72", "gemma2", `{` + g2 + `"sliding_window":null}`, `field "sliding_window" is null but the model has sliding_attention layers`},
		// A per-layer-type rope whose sliding layers are scaled: memfit's sliding layers take plain RoPE.
		{"cf48", "gemma3_text", `{` + g3 + `"rope_parameters":{"full_attention":{"rope_type":"default","rope_theta":1000000.0},"sliding_attention":{"rope_type":"linear","factor":2.0,"rope_theta":10000.0}}}`,
			`"rope_parameters" for sliding_attention: rope_type "linear"`},
		// The same factor given twice with two values.
		{"cf55", "phi3", `{` + phi3 + `"partial_rotary_factor":0.5,"rope_parameters":{"rope_type":"default","rope_theta":10000.0,"partial_rotary_factor":1.0}}`,
			`"partial_rotary_factor" is 0.5 but rope_parameters' partial_rotary_factor is 1`},
	} {
		_, err := shaped(t, family(bad.family), bad.config)
		if err == nil || !strings.Contains(err.Error(), bad.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %s: %v, want one line with %q", bad.id, bad.family, err, bad.want)
		}
	}
}
