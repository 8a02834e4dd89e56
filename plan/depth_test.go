package plan_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/plan"
)

// TestCheckpointedBlocksBounded: a step checkpoints at most MaxCheckpointedBlocks blocks, whether grad_ckpt asks
// for all of a deep model's blocks or a block_plan for some; the error is a *CheckpointLimitError naming the
// count, before any graph is built.
func TestCheckpointedBlocksBounded(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "pretrained", "llama-tiny", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(strings.Replace(string(raw), `"num_hidden_layers": 4`, `"num_hidden_layers": 300`, 1)), 0o644)
	for _, tc := range []struct {
		ckpt  bool
		plan  string
		limit int // blocks in the error, 0: accepted
	}{
		{ckpt: true, limit: 300},
		{plan: "grad-ckpt*257,plain*43", limit: 257},
		{plan: "grad-ckpt*256,approx-act*44"},
		{},
	} {
		cfg := finetune.Defaults()
		cfg.GradCkpt, cfg.BlockPlan = tc.ckpt, tc.plan
		_, _, err := plan.ShapeModel(dir, cfg, 0)
		var limit *finetune.CheckpointLimitError
		switch {
		case tc.limit == 0 && err != nil:
			t.Errorf("%+v: %v", tc, err)
		case tc.limit > 0 && (!errors.As(err, &limit) || limit.Blocks != tc.limit || !strings.Contains(err.Error(), "at most 256")):
			t.Errorf("%+v: error %v, want the limit error for %d blocks", tc, err, tc.limit)
		}
	}
}
