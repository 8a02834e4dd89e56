package llama

import "testing"

// FuzzParseConfig: any config.json bytes give an error or a config that validates (CI runs it briefly under a
// memory cap: .ci/run, "fuzz").
func FuzzParseConfig(f *testing.F) {
	c, _ := Preset("tiny", 0)
	j, _ := c.JSON()
	f.Add(j)
	c2, _ := Preset("tiny", 2)
	j2, _ := c2.JSON()
	f.Add(j2)
	f.Add([]byte(`{"vocab_size": 1e300, "hidden_size": -1}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		if c, err := ParseConfig(raw); err == nil {
			_ = c.Validate()
			_ = Shapes(c)
		}
	})
}
