package finetune

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"

	"github.com/memfit/memfit/internal/readfile"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/hfconfig"
	"github.com/memfit/memfit/safetensors"
)

// InitModel writes a random-init checkpoint (config.json and model.safetensors, or shards above maxShardBytes)
// of the named family's preset to dir, its weights drawn as transformers initialises them (Family.RandomParams)
// and stored as dtype: "float32", or "bfloat16" (drawn in float32, rounded one tensor at a time: half the file,
// as most Hugging Face checkpoints are stored). numLabels > 0 makes a classifier; without, the family's default
// (a ViTModel, a causal LM).
func InitModel(family, preset string, numLabels int, seed uint64, dir string, maxShardBytes int64, dtype string) error {
	if dtype != "float32" && dtype != "bfloat16" {
		return fmt.Errorf("dtype must be float32 or bfloat16, got %q", dtype)
	}
	if numLabels < 0 {
		return fmt.Errorf("--num-labels must not be negative, got %d", numLabels)
	}
	fam, ok := FamilyByName(family)
	if !ok {
		return fmt.Errorf("unknown architecture %q: use one of %v", family, familyNames())
	}
	if fam.Preset == nil || fam.RandomParams == nil {
		return fmt.Errorf("the %s family has no presets to initialise", fam.Title)
	}
	m, err := fam.Preset(preset, numLabels, ModelOptions{})
	if err != nil {
		return err
	}
	config, err := m.ConfigJSON()
	if err != nil {
		return err
	}
	if err := initFits(family, preset, dir, m.Shapes(), dtype); err != nil {
		return err
	}
	params := fam.RandomParams(m, seed)
	if dtype == "bfloat16" {
		if params, err = params.ToBFloat16(); err != nil {
			return err
		}
	}
	return models.SaveCheckpoint(dir, config, params, maxShardBytes)
}

// InitConfig writes only the config.json of the named family's preset (numLabels as for InitModel) to dir,
// created if needed: what finetune memory reads to plan a model's step without its weights (a copy with fewer
// blocks plans a cut model).
func InitConfig(family, preset string, numLabels int, dir string) error {
	if numLabels < 0 {
		return fmt.Errorf("--num-labels must not be negative, got %d", numLabels)
	}
	fam, ok := FamilyByName(family)
	if !ok {
		return fmt.Errorf("unknown architecture %q: use one of %v", family, familyNames())
	}
	if fam.Preset == nil {
		return fmt.Errorf("the %s family has no presets", fam.Title)
	}
	m, err := fam.Preset(preset, numLabels, ModelOptions{})
	if err != nil {
		return err
	}
	config, err := m.ConfigJSON()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return safetensors.WriteAtomic(filepath.Join(dir, "config.json"), func(w *bufio.Writer) error {
		_, err := w.Write(config)
		return err
	})
}

// initFits refuses an init whose weights cannot fit: the random weights are made in float32 in memory (plus a
// bfloat16 copy when asked), then written to dir's disk.
func initFits(family, preset, dir string, shapes map[string][]int, dtype string) error {
	var n int64
	for _, s := range shapes {
		k := int64(1)
		for _, d := range s {
			k *= int64(d)
		}
		n += k
	}
	need, file := 4*n, 4*n
	if dtype == "bfloat16" {
		need, file = 6*n, 2*n
	}
	if limit, ok, err := memory.MachineBytes(); err != nil {
		return err
	} else if ok && need > limit {
		return fmt.Errorf("%s %s has %.3g parameters: making its random weights takes %s of memory (%s) but this machine has %s: choose a smaller --preset",
			family, preset, float64(n), memory.FormatBytes(need), dtype, memory.FormatBytes(limit))
	}
	where := dir
	for {
		if _, err := os.Stat(where); err == nil || filepath.Dir(where) == where {
			break
		}
		where = filepath.Dir(where)
	}
	if free, ok := memory.FreeDiskBytes(where); ok && file > free {
		return fmt.Errorf("%s %s takes %s on disk (%s) but %s has %s free: free space or choose another --out",
			family, preset, memory.FormatBytes(file), dtype, where, memory.FormatBytes(free))
	}
	return nil
}

// NewHead writes to dir a copy of the model in from with a freshly initialised classification head of numLabels
// classes (LABEL_0 ...; one: a regression head), as transformers does when a checkpoint is loaded into a
// ...ForSequenceClassification / ...ForImageClassification class with a new num_labels (Family.NewHead).
// Tokenizer and preprocessor files are copied along.
func NewHead(from string, numLabels int, seed uint64, dir string) error {
	if numLabels <= 0 {
		return fmt.Errorf("--num-labels must be positive to make a classifier, got %d", numLabels)
	}
	fam, err := FamilyOfFolder(from)
	if err != nil {
		return err
	}
	if fam.NewHead == nil {
		return fmt.Errorf("model type %q has no classification head", fam.Name)
	}
	m, err := fam.Load(from, ModelOptions{})
	if err != nil {
		return err
	}
	config, params, err := fam.NewHead(m, hfconfig.GenericLabels(numLabels), seed)
	if err != nil {
		return fmt.Errorf("%s: %w", from, err)
	}
	if err := models.SaveCheckpoint(dir, config, params, 0); err != nil {
		return err
	}
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json", "tokenizer.model", "preprocessor_config.json"} {
		b, err := readfile.Read(filepath.Join(from, name), readfile.Tokenizer)
		if err != nil {
			continue
		}
		if err := safetensors.WriteAtomic(filepath.Join(dir, name), func(w *bufio.Writer) error {
			_, err := w.Write(b)
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}
