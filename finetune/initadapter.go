package finetune

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/internal/readfile"
	"github.com/memfit/memfit/lora"
	"github.com/memfit/memfit/safetensors"
)

// A run started from an init_adapter keeps a copy of that adapter in each checkpoint (InitAdapterDir): resume and
// export read the copy, so the run never depends on the folder it started from, which the user may change or
// delete.

// InitAdapterDir is the folder, inside each checkpoint of a run started from an init_adapter, holding a copy of
// that adapter's adapter_config.json and adapter_model.safetensors as the run read them.
const InitAdapterDir = "init-adapter"

// initAdapterFiles are the files of an init adapter a checkpoint keeps.
var initAdapterFiles = []string{AdapterConfig, AdapterWeights}

// initAdapterSource is where a trainer started from an init_adapter takes the copy its next checkpoint keeps.
type initAdapterSource struct {
	// dir holds the files: the user's folder, or the copy in the last checkpoint saved or resumed.
	dir string
	// ours says dir is a checkpoint's copy (never written to again): the next checkpoint may hard-link it.
	ours bool
	// sums are the SHA-256 of the files as the run read them; a copy that differs is refused.
	sums map[string]string
}

// readInitAdapterSums returns the SHA-256 of an init adapter's files.
func readInitAdapterSums(dir string) (map[string]string, error) {
	sums := map[string]string{}
	for _, f := range initAdapterFiles {
		s, err := fileSHA256(filepath.Join(dir, f))
		if err != nil {
			return nil, fmt.Errorf("init_adapter: %w", err)
		}
		sums[f] = s
	}
	return sums, nil
}

// copyInto writes the init adapter's files into dst (a checkpoint being written) and checks them against
// the sums the run read; it returns their checksums, keyed by their path inside the checkpoint.
func (s *initAdapterSource) copyInto(dst string) (map[string]string, error) {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, f := range initAdapterFiles {
		from, to := filepath.Join(s.dir, f), filepath.Join(dst, f)
		if !s.ours || os.Link(from, to) != nil {
			if err := copyFile(from, to); err != nil {
				return nil, fmt.Errorf("keeping a copy of the init adapter in the checkpoint: %w", err)
			}
		}
		sum, err := fileSHA256(to)
		if err != nil {
			return nil, err
		}
		if sum != s.sums[f] {
			return nil, fmt.Errorf("init_adapter %s changed since the run read it (%s differs): the checkpoint would keep another adapter than the one trained; restore it, or resume from the last checkpoint", s.dir, f)
		}
		out[filepath.Join(InitAdapterDir, f)] = sum
	}
	return out, nil
}

// copyFile copies a file's bytes to a new file.
func copyFile(from, to string) error {
	in, err := readfile.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// InitAdapterSettings reads the PEFT LoRA adapter folder dir as an init_adapter: its settings (lora.FromPEFT,
// which refuses what memfit's LoRA does not implement) and the module paths of the layers it adapts (from the
// keys of its weights, sorted).
func InitAdapterSettings(dir string) (lora.Config, []string, error) {
	raw, err := readfile.Read(filepath.Join(dir, AdapterConfig), readfile.Config)
	if err != nil {
		return lora.Config{}, nil, fmt.Errorf("init_adapter: %w", err)
	}
	c, err := adapter.ParsePEFTConfig(raw)
	if err != nil {
		return lora.Config{}, nil, fmt.Errorf("init_adapter %s: %w", filepath.Join(dir, AdapterConfig), err)
	}
	settings, err := lora.FromPEFT(c)
	if err != nil {
		return lora.Config{}, nil, fmt.Errorf("init_adapter %s: %w", filepath.Join(dir, AdapterConfig), err)
	}
	f, err := safetensors.Open(filepath.Join(dir, AdapterWeights))
	if err != nil {
		return lora.Config{}, nil, fmt.Errorf("init_adapter: %w", err)
	}
	defer f.Close()
	var paths []string
	for _, key := range f.Names() {
		if p, ok := strings.CutSuffix(strings.TrimPrefix(key, peftPrefix), "."+lora.SuffixA); ok {
			paths = append(paths, p)
		}
	}
	slices.Sort(paths)
	if len(paths) == 0 {
		return lora.Config{}, nil, fmt.Errorf("init_adapter %s holds no %s tensors: not a LoRA adapter", filepath.Join(dir, AdapterWeights), lora.SuffixA)
	}
	return settings, paths, nil
}

// withInitAdapter sets, in a config with an init_adapter, the LoRA settings that the adapter fixes: lora_r,
// lora_alpha, rslora and lora_targets (the adapted layers' module paths). A setting the user gave (given) must
// agree with the adapter; one that does not is an error naming both. lora_targets given are checked against
// the adapter's layers by New, which knows the model.
func withInitAdapter(cfg Config, given func(key string) bool) (Config, error) {
	settings, paths, err := InitAdapterSettings(cfg.InitAdapter)
	if err != nil {
		return cfg, err
	}
	conflict := func(key string, here, there any) error {
		return fmt.Errorf("%s %v conflicts with init_adapter %s, whose adapter has %v: leave %s out, the adapter sets it", key, here, cfg.InitAdapter, there, key)
	}
	switch {
	case given("lora_r") && cfg.LoRARank != settings.Rank:
		return cfg, conflict("lora_r", cfg.LoRARank, settings.Rank)
	case given("lora_alpha") && cfg.LoRAAlpha != settings.Alpha:
		return cfg, conflict("lora_alpha", cfg.LoRAAlpha, settings.Alpha)
	case given("rslora") && cfg.RSLoRA != settings.RSLoRA:
		return cfg, conflict("rslora", cfg.RSLoRA, settings.RSLoRA)
	}
	cfg.LoRARank, cfg.LoRAAlpha, cfg.RSLoRA = settings.Rank, settings.Alpha, settings.RSLoRA
	if !given("lora_targets") {
		cfg.LoRATarget = paths
	}
	return cfg, nil
}
