package hfdata

import (
	"path/filepath"
	"reflect"
	"testing"

	"github.com/parquet-go/parquet-go/format"

	"github.com/memfit/memfit/data"
)

// TestLZ4RawReadsItsJSONL (issue 36, pq29_lz4): LZ4_RAW files as DuckDB writes them (data pages v1, COMPRESSION
// lz4) and as arrow-rs writes them (data pages v2, levels stored uncompressed) read the rows of their JSONL. Before
// lz4File, parquet-go misread them: "decoding level expected 48 values but got only 0 ... the file is corrupt".
func TestLZ4RawReadsItsJSONL(t *testing.T) {
	want, err := data.ReadInstructions("testdata/alpaca.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	for _, fx := range []struct {
		name      string
		v2        bool
		rowGroups int
	}{{"alpaca-lz4.duckdb.parquet", false, 1}, {"alpaca-lz4-v2.arrow.parquet", true, 3}} {
		name, v2 := fx.name, fx.v2
		path := filepath.Join("probe", name)
		// What the fixture claims: LZ4_RAW chunks in the file as written, pages of the version named.
		var orig format.FileMetaData
		rewriteFooter(t, filepath.Join("testdata", path), func(md *format.FileMetaData) { orig = *md })
		lz4Chunks, pagesV2 := 0, false
		for _, rg := range orig.RowGroups {
			for _, c := range rg.Columns {
				if c.MetaData.Codec == format.Lz4Raw {
					lz4Chunks++
				}
				for _, s := range c.MetaData.EncodingStats {
					pagesV2 = pagesV2 || s.PageType == format.DataPageV2
				}
			}
		}
		if lz4Chunks == 0 || len(orig.RowGroups) < fx.rowGroups || pagesV2 != v2 {
			t.Errorf("%s: %d LZ4_RAW chunks in %d row groups, data pages v2 %v; want LZ4_RAW chunks in %d or more row groups, v2 %v",
				name, lz4Chunks, len(orig.RowGroups), pagesV2, fx.rowGroups, v2)
		}
		got, err := open(t, path, "", "").Instructions()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %d rows differ from the JSONL's %d", name, len(got), len(want))
		}
	}
}
