package vit

import "testing"

// FuzzParseConfig: any config.json bytes give an error or a config that validates (CI runs it briefly under a
// memory cap: .ci/run, "fuzz").
func FuzzParseConfig(f *testing.F) {
	c, _ := Preset("tiny", 3)
	j, _ := c.JSON()
	f.Add(j)
	f.Add([]byte(`{"image_size": 4294967296, "patch_size": 0}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		if c, err := ParseConfig(raw); err == nil {
			_ = Shapes(c)
		}
	})
}
