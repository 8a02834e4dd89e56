// Package golden reads the reference outputs of Hugging Face transformers in ../shared/data/golden (see its
// README): nested JSON lists become flat values with their dimensions.
package golden

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"github.com/memfit/memfit/internal/readfile"
)

// Array is a nested JSON list flattened in row-major order.
type Array struct {
	Dims   []int
	Values []float64 // numbers parsed as float32 (the files hold float32 values), stored widened
}

// Float32s returns the values as float32.
func (a Array) Float32s() []float32 {
	out := make([]float32, len(a.Values))
	for i, v := range a.Values {
		out[i] = float32(v)
	}
	return out
}

// Int32s returns the values as int32.
func (a Array) Int32s() []int32 {
	out := make([]int32, len(a.Values))
	for i, v := range a.Values {
		out[i] = int32(v)
	}
	return out
}

// File is a decoded golden.json: every value is kept raw for the caller to pick.
type File struct {
	Dir    string
	Fields map[string]json.RawMessage
}

// SharedDir returns the absolute path of ../shared/data relative to the repository root, or skips the test when
// it is absent.
func SharedDir(t testing.TB) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	dir := filepath.Join(root, "..", "shared", "data")
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		t.Skipf("shared data not found at %s: the golden tests need ../shared/data beside the repository", dir)
	}
	abs, _ := filepath.Abs(dir)
	return abs
}

// Load reads golden/<name>/golden.json from the shared data, skipping the test when it is absent.
func Load(t testing.TB, name string) *File {
	t.Helper()
	dir := filepath.Join(SharedDir(t), "golden", name)
	data, err := readfile.Read(filepath.Join(dir, "golden.json"), readfile.Data)
	if err != nil {
		t.Skipf("golden data %s not readable: %v", dir, err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		t.Fatalf("%s/golden.json: %v", dir, err)
	}
	return &File{Dir: dir, Fields: fields}
}

// LoadDir reads dir/golden.json (a reference made by a test, in the layout of the shared goldens).
func LoadDir(t testing.TB, dir string) *File {
	t.Helper()
	data, err := readfile.Read(filepath.Join(dir, "golden.json"), readfile.Data)
	if err != nil {
		t.Fatal(err)
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(data, &fields); err != nil {
		t.Fatalf("%s/golden.json: %v", dir, err)
	}
	return &File{Dir: dir, Fields: fields}
}

// Raw returns the raw JSON at a path of object keys and list indices ("outputs", "hidden_states", "0").
func (f *File) Raw(t testing.TB, path ...string) json.RawMessage {
	t.Helper()
	cur := json.RawMessage(nil)
	for i, key := range path {
		var next json.RawMessage
		if i == 0 {
			raw, ok := f.Fields[key]
			if !ok {
				t.Fatalf("golden %s: no key %v", f.Dir, path[:i+1])
			}
			next = raw
		} else if idx, err := strconv.Atoi(key); err == nil {
			var list []json.RawMessage
			if err := json.Unmarshal(cur, &list); err != nil || idx < 0 || idx >= len(list) {
				t.Fatalf("golden %s: %v is not a list with index %d", f.Dir, path[:i], idx)
			}
			next = list[idx]
		} else {
			var obj map[string]json.RawMessage
			if err := json.Unmarshal(cur, &obj); err != nil {
				t.Fatalf("golden %s: %v is not an object: %v", f.Dir, path[:i], err)
			}
			raw, ok := obj[key]
			if !ok {
				t.Fatalf("golden %s: no key %v", f.Dir, path[:i+1])
			}
			next = raw
		}
		cur = next
	}
	return cur
}

// Array decodes the nested list at path.
func (f *File) Array(t testing.TB, path ...string) Array {
	t.Helper()
	a, err := ParseArray(f.Raw(t, path...))
	if err != nil {
		t.Fatalf("golden %s %v: %v", f.Dir, path, err)
	}
	return a
}

// Keys returns the keys of the object at path.
func (f *File) Keys(t testing.TB, path ...string) []string {
	t.Helper()
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(f.Raw(t, path...), &obj); err != nil {
		t.Fatalf("golden %s %v: %v", f.Dir, path, err)
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	return keys
}

// ParseArray flattens a nested JSON list (or a single number) of numbers.
func ParseArray(raw json.RawMessage) (Array, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return Array{}, err
	}
	var a Array
	if err := flatten(v, 0, &a); err != nil {
		return Array{}, err
	}
	return a, nil
}

func flatten(v any, depth int, a *Array) error {
	switch x := v.(type) {
	case json.Number:
		f, err := strconv.ParseFloat(x.String(), 32)
		if err != nil {
			return err
		}
		a.Values = append(a.Values, f)
		return nil
	case []any:
		if depth == len(a.Dims) {
			a.Dims = append(a.Dims, len(x))
		} else if depth > len(a.Dims) || a.Dims[depth] != len(x) {
			return fmt.Errorf("ragged list at depth %d", depth)
		}
		for _, e := range x {
			if err := flatten(e, depth+1, a); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unexpected %T in array", v)
}
