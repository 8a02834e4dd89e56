package safetensors_test

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/safetensors"
)

// file builds a safetensors file from a header text and data.
func file(header string, data []byte) []byte {
	out := make([]byte, 8, 8+len(header)+len(data))
	binary.LittleEndian.PutUint64(out, uint64(len(header)))
	out = append(out, header...)
	return append(out, data...)
}

func TestCorruptFiles(t *testing.T) {
	good := file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8))
	huge := make([]byte, 8)
	binary.LittleEndian.PutUint64(huge, 1<<62)
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "shorter than the 8-byte header length"},
		{"truncated-length", []byte{1, 2, 3}, "shorter than the 8-byte header length"},
		{"header-longer-than-file", good[:20], "longer than the rest of the file"},
		{"huge-header-length", huge, "exceeds"},
		{"truncated-data", good[:len(good)-3], "outside the 5-byte data section"},
		{"bad-json", file(`{"a":`, nil), "not a JSON object"},
		{"not-object", file(`[1,2]`, nil), "not a JSON object"},
		{"trailing", file(`{} {}`, nil), "data after its JSON object"},
		{"offsets-out-of-range", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}}`, make([]byte, 8)), "outside"},
		{"offsets-reversed", file(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}`, make([]byte, 8)), "outside"},
		{"negative-offset", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}}`, make([]byte, 8)), "outside"},
		{"dtype-shape-mismatch", file(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, make([]byte, 8)), "needs 12 bytes"},
		{"overlap", file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, make([]byte, 8)), "overlap"},
		{"unknown-dtype", file(`{"a":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}}`, make([]byte, 1)), "unsupported dtype"},
		{"negative-dim", file(`{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}}`, nil), "dimension 0 is -1"},
		{"overflowing-shape", file(`{"a":{"dtype":"F64","shape":[2147483647,2147483647,2147483647],"data_offsets":[0,8]}}`, make([]byte, 8)), "overflows"},
		{"bad-offsets-count", file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}}`, make([]byte, 1)), "2 entries"},
		{"unknown-field", file(`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"extra":1}}`, make([]byte, 1)), "unknown field"},
		{"bad-metadata", file(`{"__metadata__":{"a":1}}`, nil), "__metadata__"},
	} {
		path := filepath.Join(t.TempDir(), tc.name+".safetensors")
		if err := os.WriteFile(path, tc.data, 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := safetensors.Open(path)
		if err == nil {
			t.Errorf("%s: opened without error", tc.name)
			continue
		}
		msg := err.Error()
		if !strings.Contains(msg, tc.want) || !strings.Contains(msg, path) || strings.Contains(msg, "\n") {
			t.Errorf("%s: error %q, want one line naming the file and containing %q", tc.name, msg, tc.want)
		}
	}
	if _, err := safetensors.Open(filepath.Join(t.TempDir(), "missing.safetensors")); err == nil {
		t.Error("missing file opened")
	}
	path := filepath.Join(t.TempDir(), "ok.safetensors")
	os.WriteFile(path, good, 0o644)
	f, err := safetensors.Open(path)
	if err != nil {
		t.Fatalf("good file: %v", err)
	}
	f.Close()
}

// FuzzOpen: no input makes Parse panic, and every tensor of a file it accepts lies inside the file and matches
// its dtype and shape. Run longer with: go test -run='^$' -fuzz=FuzzOpen -fuzztime=60s ./safetensors/
func FuzzOpen(f *testing.F) {
	f.Add(file(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, make([]byte, 8)))
	f.Add(file(`{"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[],"data_offsets":[8,9]}}`, make([]byte, 9)))
	f.Add(file(`{}`, nil))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		sf, err := safetensors.Parse("fuzz", data)
		if err != nil {
			return
		}
		for _, n := range sf.Names() {
			info, _ := sf.Info(n)
			raw, err := sf.Raw(n)
			if err != nil {
				t.Fatalf("accepted tensor %q unreadable: %v", n, err)
			}
			elems := 1
			for _, d := range info.Shape {
				elems *= d
			}
			if len(raw) != elems*info.DType.Size() {
				t.Fatalf("tensor %q: %d bytes for %s %v", n, len(raw), info.DType, info.Shape)
			}
			if info.DType.IsFloat() {
				if _, err := sf.Float32s(n); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}
