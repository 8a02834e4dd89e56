package bench

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/vit"
)

// TestTimeGridTiny runs the timed grid on tiny models: every cell has memory, times, FLOPs, and the ratios are
// relative to the plain variant of the same method.
func TestTimeGridTiny(t *testing.T) {
	backend, err := engine.NewBackend(engine.ChooseSpec("go"))
	if err != nil {
		t.Fatal(err)
	}
	defer backend.Finalize()
	dir := t.TempDir()
	vc, _ := vit.Preset("tiny", 3)
	lc, _ := llama.Preset("tiny", 0)
	vj, _ := vc.JSON()
	lj, _ := llama.JSON(lc)
	if err := models.SaveCheckpoint(filepath.Join(dir, "vit"), vj, vit.RandomParams(vc, 1), 0); err != nil {
		t.Fatal(err)
	}
	if err := models.SaveCheckpoint(filepath.Join(dir, "llama"), lj, decoder.RandomParams(lc, 1), 0); err != nil {
		t.Fatal(err)
	}
	base := finetune.Defaults()
	tms := []TimedModel{{Name: "vit", Dir: filepath.Join(dir, "vit"), Shape: finetune.Shape{Batch: 4}, Base: base, Describe: "tiny"},
		{Name: "llama", Dir: filepath.Join(dir, "llama"), Shape: finetune.Shape{Batch: 2, Seq: 16}, Base: base, Describe: "tiny", SeqBudget: 4 << 20}}
	variants := []finetune.Variant{finetune.Variants[0], finetune.Variants[3], finetune.Variants[5]}
	cells, err := TimeGrid(backend, tms, []GridMethod{GridMethods[1], GridMethods[4]}, variants, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(cells) != 2*2*3 {
		t.Fatalf("%d cells", len(cells))
	}
	for _, c := range cells {
		if c.StepSeconds <= 0 || c.CompileSeconds <= 0 || c.PerSecond <= 0 || c.MatmulGFLOP <= 0 || c.SavedActivationBytes <= 0 || c.PeakBytes <= 0 ||
			c.MatmulOnlySeconds <= 0 || c.OwnGFLOPS <= 0 {
			t.Errorf("empty figures in %+v", c)
		}
		// The products alone cannot take much longer than the whole step that runs them (a loose bound: the
		// products are timed separately, and tiny ones have fixed per-run costs).
		if c.MatmulShare > 3 {
			t.Errorf("products alone take %.3fs, the step %.3fs", c.MatmulOnlySeconds, c.StepSeconds)
		}
		if c.Variant == "plain" && (c.SavedRatio != 1 || c.TimeRatio != 1) {
			t.Errorf("plain's ratios are not 1: %+v", c)
		}
		if c.Model == "llama" && c.MaxSeq < 2 {
			t.Errorf("no longest sequence: %+v", c)
		}
		if c.Model == "llama" && c.Variant == "approx-act+ms-norm" {
			for _, p := range cells {
				if p.Model == c.Model && p.Method == c.Method && p.Variant == "plain" && c.MaxSeq < p.MaxSeq {
					t.Errorf("%s: approx-act+ms-norm fits %d tokens, plain %d", c.Method, c.MaxSeq, p.MaxSeq)
				}
			}
		}
		if c.Variant == "approx-act+ms-norm" && !(c.SavedRatio < 1) {
			t.Errorf("approx-act+ms-norm keeps no less than plain: %+v", c)
		}
	}
	var buf bytes.Buffer
	if err := WriteTimedGrid(&buf, tms, cells, 10); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "qlora") || !strings.Contains(buf.String(), "tokens/s") {
		t.Errorf("table:\n%s", buf.String())
	}
	// The JSON round trip (as --json writes it, --render reads it) prints the very same table.
	js, err := json.Marshal(GridRun{Models: map[string]string{"vit": "tiny", "llama": "tiny"}, Steps: 2, MatmulGFLOPS: 10, Cells: cells})
	if err != nil {
		t.Fatal(err)
	}
	var run GridRun
	if err := json.Unmarshal(js, &run); err != nil {
		t.Fatal(err)
	}
	var again bytes.Buffer
	if err := WriteGridRun(&again, run); err != nil {
		t.Fatal(err)
	}
	if again.String() != buf.String() {
		t.Errorf("rendered from JSON:\n%s\nprinted by the run:\n%s", again.String(), buf.String())
	}
}
