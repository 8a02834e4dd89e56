package models

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/gomlx/compute/dtypes"

	"github.com/memfit/memfit/safetensors"
)

// LoadOptions adapt LoadParams to a checkpoint's naming.
type LoadOptions struct {
	// Rename maps a model parameter name to the checkpoint's name for it (nil: the same name).
	Rename func(name string) string
	// Ignore reports checkpoint tensors the model does not use and that are fine to skip (nil: none).
	Ignore func(name string) bool
}

// LoadParams reads the tensors named in shapes from the checkpoint at dir (a model folder, a .safetensors file
// or an index), converted to float32 (F16, BF16 and F64 are converted exactly or rounded; integers are
// rejected), and checks their shapes and values. A missing tensor, a wrong shape, a checkpoint tensor the model
// does not know or a NaN or infinite value (a *NonFiniteError, naming the tensor, position and value) is an error
// naming it.
func LoadParams(dir string, shapes map[string][]int, opts LoadOptions) (Params, error) {
	ckpt, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		return nil, err
	}
	defer ckpt.Close()
	rename := opts.Rename
	if rename == nil {
		rename = func(n string) string { return n }
	}
	names := make([]string, 0, len(shapes))
	for n := range shapes {
		names = append(names, n)
	}
	sort.Strings(names)
	used := map[string]bool{}
	p := Params{}
	for _, name := range names {
		src := rename(name)
		info, ok := ckpt.Info(src)
		if !ok {
			return nil, fmt.Errorf("%s: checkpoint has no tensor %q", dir, src)
		}
		if !slices.Equal(info.Shape, shapes[name]) {
			return nil, fmt.Errorf("%s: tensor %q has shape %v, the config implies %v", dir, src, info.Shape, shapes[name])
		}
		if !info.DType.IsFloat() {
			return nil, fmt.Errorf("%s: tensor %q is %s, want a float dtype", dir, src, info.DType)
		}
		t, err := ckpt.TensorAs(src, dtypes.Float32)
		if err != nil {
			return nil, err
		}
		if err := CheckFinite(t, src); err != nil {
			return nil, fmt.Errorf("%s: %w", dir, err)
		}
		p[name] = t
		used[src] = true
	}
	for _, n := range ckpt.Names() {
		if !used[n] && (opts.Ignore == nil || !opts.Ignore(n)) {
			return nil, fmt.Errorf("%s: checkpoint has tensor %q, which this model's config does not use", dir, n)
		}
	}
	return p, nil
}

// SaveCheckpoint writes a Hugging Face model folder: config.json and the parameters as safetensors (as a single
// model.safetensors, or shards plus an index when they exceed maxShardBytes; 0 means never shard), every file
// written atomically. The folder is created if needed.
func SaveCheckpoint(dir string, config []byte, p Params, maxShardBytes int64) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	entries := make(map[string]safetensors.Entry, len(p))
	for name, t := range p {
		e, err := safetensors.FromTensor(t, "")
		if err != nil {
			return fmt.Errorf("tensor %q: %w", name, err)
		}
		entries[name] = e
	}
	if _, err := safetensors.WriteSharded(dir, entries, nil, maxShardBytes); err != nil {
		return err
	}
	return safetensors.WriteAtomic(filepath.Join(dir, "config.json"), func(w *bufio.Writer) error {
		_, err := w.Write(config)
		return err
	})
}
