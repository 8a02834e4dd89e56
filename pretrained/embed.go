package pretrained

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// FS holds the shipped files: vit-fashion/ (the ViT pretrained on Fashion-MNIST classes 0-4), data/ (the demo's
// Fashion-MNIST classes 5-9 subsets) and the notices.
//
//go:embed vit-fashion/config.json vit-fashion/model.safetensors vit-fashion/preprocessor_config.json data/*.idx.gz NOTICE.md
var FS embed.FS

// Extract copies the shipped folder name (e.g. "vit-fashion") into dir, which is created; it returns dir.
func Extract(name, dir string) (string, error) {
	entries, err := fs.ReadDir(FS, name)
	if err != nil {
		return "", fmt.Errorf("memfit ships no %q: %w", name, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	for _, e := range entries {
		data, err := FS.ReadFile(name + "/" + e.Name())
		if err != nil {
			return "", err
		}
		if err := writeFile(filepath.Join(dir, e.Name()), data); err != nil {
			return "", err
		}
	}
	return dir, nil
}

// DemoData returns the demo's fine-tuning examples (Fashion-MNIST classes 5-9, labels 0-4): train and test.
func DemoData() (train, test map[string]*IDX, err error) {
	read := func(split string) (map[string]*IDX, error) {
		out := map[string]*IDX{}
		for _, kind := range []string{"images", "labels"} {
			name := fmt.Sprintf("data/fashion-5to9-%s-%s.idx.gz", split, kind)
			raw, err := FS.ReadFile(name)
			if err != nil {
				return nil, err
			}
			x, err := DecodeIDX(raw)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			out[kind] = x
		}
		return out, nil
	}
	if train, err = read("train"); err != nil {
		return nil, nil, err
	}
	test, err = read("test")
	return train, test, err
}
