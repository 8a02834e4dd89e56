package hfconfig

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type toy struct{ Size int }

func decodeToy(f Fields) (toy, error) {
	d := NewDecoder(f)
	if err := ModelType(d, "toy"); err != nil {
		return toy{}, err
	}
	var c toy
	d.Require("size", &c.Size)
	if err := d.Err(); err != nil {
		return toy{}, err
	}
	return c, CheckSizes(Size{Name: "size", Value: c.Size, Max: 10})
}

// TestSharedParsing: the one implementation behind llama's and vit's ParseConfig/LoadConfig/Validate/Preset.
func TestSharedParsing(t *testing.T) {
	if c, err := ParseWith([]byte(`{"model_type":"toy","size":3}`), decodeToy); err != nil || c.Size != 3 {
		t.Fatalf("ParseWith: %+v, %v", c, err)
	}
	for in, want := range map[string]string{
		`{"model_type":"gpt","size":3}`:  `"model_type" is "gpt", not "toy"`,
		`{"size":3}`:                     `"model_type" is missing`,
		`{"model_type":"toy","size":0}`:  `"size" must be positive, got 0`,
		`{"model_type":"toy","size":11}`: `"size" is 11, more than memfit takes (10)`,
		`[1]`:                            "not a JSON object",
	} {
		if _, err := ParseWith([]byte(in), decodeToy); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", in, err, want)
		}
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"model_type":"toy","size":99}`), 0o644)
	if _, err := LoadWith(dir, decodeToy); err == nil || !strings.HasPrefix(err.Error(), filepath.Join(dir, "config.json")+": ") {
		t.Errorf("LoadWith: error %v does not name the file", err)
	}
	if _, err := Preset(map[string]toy{"b": {}, "a": {}}, "Toy", "c"); err == nil || err.Error() != `unknown Toy preset "c" (have: a, b)` {
		t.Errorf("Preset: %v", err)
	}
	if got := GenericLabels(2); len(got) != 2 || got[1] != "LABEL_1" {
		t.Errorf("GenericLabels(2) = %v", got)
	}
	d := NewDecoder(Fields{"num_labels": []byte("-2")})
	if Labels(d) != nil || d.Err() == nil || !strings.Contains(d.Err().Error(), "num_labels") {
		t.Errorf("num_labels -2: labels accepted (err %v)", d.Err())
	}
}
