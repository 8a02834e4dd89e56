package llama

import (
	"testing"

	"github.com/memfit/memfit/models/decoder"
)

// FuzzParseConfig: any config.json bytes give an error or a config that validates (CI runs it briefly under a
// memory cap: .ci/run, "fuzz").
func FuzzParseConfig(f *testing.F) {
	c, _ := Preset("tiny", 0)
	j, _ := JSON(c)
	f.Add(j)
	c2, _ := Preset("tiny", 2)
	j2, _ := JSON(c2)
	f.Add(j2)
	f.Add([]byte(`{"vocab_size": 1e300, "hidden_size": -1}`))
	base := `"model_type":"llama","vocab_size":10,"hidden_size":8,"intermediate_size":16,"num_hidden_layers":1,"num_attention_heads":2`
	f.Add([]byte(`{` + base + `,"eos_token_id":[2,7],"pad_token_id":null,"rope_scaling":{"rope_type":"linear","factor":2}}`))
	f.Add([]byte(`{` + base + `,"rope_parameters":{"rope_type":"llama3","rope_theta":5e5,"factor":8,"low_freq_factor":1,"high_freq_factor":4,"original_max_position_embeddings":8192}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		if c, err := ParseConfig(raw); err == nil {
			_ = c.Validate()
			_ = decoder.Shapes(c)
		}
	})
}
