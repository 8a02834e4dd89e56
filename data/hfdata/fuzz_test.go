package hfdata

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// FuzzParquet feeds any bytes to the parquet reader as every kind of dataset memfit reads (texts, Alpaca rows,
// conversations, GLUE rows, images): an error is fine, a panic or an allocation sized by a declared length is
// not (CI runs it under a 4 GiB address-space cap). The seeds are the fixtures DuckDB and arrow-rs wrote.
func FuzzParquet(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*.parquet")
	more, _ := filepath.Glob("testdata/*/*/*.parquet")
	probe, _ := filepath.Glob("testdata/probe/*.parquet") // issue 36's cases: MAP columns, LZ4_RAW pages, ...
	for _, p := range append(append(seeds, more...), probe...) {
		if b, err := os.ReadFile(p); err == nil && len(b) < 64<<10 {
			f.Add(b)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		pf, err := openReaderAt("fuzz.parquet", bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		file := &file{path: "fuzz.parquet", pf: pf}
		d := &Dataset{Path: "fuzz.parquet", Files: []string{"fuzz.parquet"}}
		for _, specs := range [][]spec{
			{{name: "text", kind: kString}},
			{{name: "instruction", kind: kString}, {name: "input", kind: kString, optional: true}, {name: "output", kind: kString}},
			{{name: "messages", kind: kMessages}},
			{{name: "sentence1", kind: kString}, {name: "sentence2", kind: kString}, {name: "label", kind: kNumber}},
			{{name: "image", kind: kImage}, {name: "label", kind: kInt}},
		} {
			_, _ = d.eachOfFile(file, specs, func(string, row) error { return nil })
		}
		_, _ = classNames(file, "label")
	})
}
