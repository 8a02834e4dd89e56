package safetensors

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/internal/readfile"
)

// Names of a checkpoint's weight files, as transformers writes them.
const (
	SingleFile = "model.safetensors"
	IndexFile  = "model.safetensors.index.json"
)

// Index is model.safetensors.index.json.
type Index struct {
	Metadata  map[string]any    `json:"metadata"`
	WeightMap map[string]string `json:"weight_map"`
}

// Checkpoint is a model's weights: one safetensors file, or the shards listed by an index.
type Checkpoint struct {
	files  map[string]*File // by path
	byName map[string]*File
	names  []string
}

// OpenCheckpoint opens path: a model folder (model.safetensors, or model.safetensors.index.json and its shards),
// a .safetensors file, or an index file. With an index, every listed tensor must be in its shard and a shard
// may not hold tensors the index does not list.
func OpenCheckpoint(path string) (*Checkpoint, error) {
	st, err := os.Stat(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%s does not exist", path)
		}
		return nil, err
	}
	if st.IsDir() {
		single := filepath.Join(path, SingleFile)
		index := filepath.Join(path, IndexFile)
		switch {
		case exists(single):
			path = single
		case exists(index):
			path = index
		default:
			return nil, fmt.Errorf("%s has no %s or %s", path, SingleFile, IndexFile)
		}
	}
	c := &Checkpoint{files: map[string]*File{}, byName: map[string]*File{}}
	if filepath.Ext(path) == ".json" {
		if err := c.openIndex(path); err != nil {
			c.Close()
			return nil, err
		}
	} else {
		f, err := Open(path)
		if err != nil {
			return nil, err
		}
		c.files[path] = f
		for _, n := range f.Names() {
			c.byName[n] = f
		}
	}
	for n := range c.byName {
		c.names = append(c.names, n)
	}
	sort.Strings(c.names)
	return c, nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func (c *Checkpoint) openIndex(path string) error {
	data, err := readfile.Read(path, readfile.Config)
	if err != nil {
		return err
	}
	var idx Index
	if err := json.Unmarshal(data, &idx); err != nil {
		return fmt.Errorf("%s: not a valid index (%v)", path, err)
	}
	if len(idx.WeightMap) == 0 {
		return fmt.Errorf("%s: the weight_map is empty", path)
	}
	dir := filepath.Dir(path)
	listed := map[string]map[string]bool{}
	for name, shard := range idx.WeightMap {
		if shard == "" || filepath.Base(shard) != shard {
			return fmt.Errorf("%s: tensor %q maps to %q, which is not a file name in the same folder", path, name, shard)
		}
		shardPath := filepath.Join(dir, shard)
		f := c.files[shardPath]
		if f == nil {
			if f, err = Open(shardPath); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			c.files[shardPath] = f
			listed[shardPath] = map[string]bool{}
		}
		if _, ok := f.Info(name); !ok {
			return fmt.Errorf("%s: tensor %q is listed in %s but not in it", path, name, shard)
		}
		listed[shardPath][name] = true
		c.byName[name] = f
	}
	for shardPath, f := range c.files {
		for _, n := range f.Names() {
			if !listed[shardPath][n] {
				return fmt.Errorf("%s: %s holds tensor %q, which the index does not list", path, filepath.Base(shardPath), n)
			}
		}
	}
	return nil
}

// Names returns all tensor names, sorted.
func (c *Checkpoint) Names() []string { return append([]string(nil), c.names...) }

// Info describes a tensor.
func (c *Checkpoint) Info(name string) (Info, bool) {
	f, ok := c.byName[name]
	if !ok {
		return Info{}, false
	}
	return f.Info(name)
}

func (c *Checkpoint) file(name string) (*File, error) {
	f, ok := c.byName[name]
	if !ok {
		return nil, fmt.Errorf("checkpoint has no tensor %q", name)
	}
	return f, nil
}

// Tensor copies a tensor in its stored dtype (see File.Tensor).
func (c *Checkpoint) Tensor(name string) (*tensors.Tensor, error) {
	f, err := c.file(name)
	if err != nil {
		return nil, err
	}
	return f.Tensor(name)
}

// TensorAs copies a tensor converted to dtype want (see File.TensorAs).
func (c *Checkpoint) TensorAs(name string, want dtypes.DType) (*tensors.Tensor, error) {
	f, err := c.file(name)
	if err != nil {
		return nil, err
	}
	return f.TensorAs(name, want)
}

// Float32s returns a float tensor's values as float32.
func (c *Checkpoint) Float32s(name string) ([]float32, error) {
	f, err := c.file(name)
	if err != nil {
		return nil, err
	}
	return f.Float32s(name)
}

// Close releases every file.
func (c *Checkpoint) Close() error {
	var first error
	for _, f := range c.files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}
