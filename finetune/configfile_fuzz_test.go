package finetune_test

import (
	"strings"
	"testing"

	"github.com/memfit/memfit/finetune"
)

// FuzzParseConfigFile: any bytes of a --config file give a config or a one-line error, never a panic (CI runs it
// briefly under a memory cap: .ci/run, "fuzz").
func FuzzParseConfigFile(f *testing.F) {
	for _, seed := range []string{"steps: 5\nlr: 1e-3\nlora_targets: [q, v]\nms_norm: yes\n", "steps: 5\n---\nsteps: 6\n",
		"a: &x [1, *x]\n", `{"steps": 5, "steps": 6}`, "lora_targets: q,v\nseed: -1\n", "- 1\n"} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if _, _, err := finetune.ParseConfigFile("c.yaml", raw, finetune.Defaults()); err != nil && strings.Contains(err.Error(), "\n") {
			t.Errorf("error of more than one line: %q", err)
		}
	})
}
