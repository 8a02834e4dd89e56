package hfdata

import (
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go/encoding/thrift"
	"github.com/parquet-go/parquet-go/format"
)

// rewriteFooter returns the parquet file src with its footer (file metadata) edited by edit: what a corrupt or
// hostile file can declare.
func rewriteFooter(t *testing.T, src string, edit func(md *format.FileMetaData)) []byte {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	n := int(binary.LittleEndian.Uint32(b[len(b)-8:]))
	body := b[:len(b)-8-n]
	var md format.FileMetaData
	if err := thrift.Unmarshal(new(thrift.CompactProtocol), b[len(b)-8-n:len(b)-8], &md); err != nil {
		t.Fatal(err)
	}
	edit(&md)
	footer, err := thrift.Marshal(new(thrift.CompactProtocol), &md)
	if err != nil {
		t.Fatal(err)
	}
	out := append(append([]byte(nil), body...), footer...)
	out = binary.LittleEndian.AppendUint32(out, uint32(len(footer)))
	return append(out, "PAR1"...)
}

// TestDeclaredSizesBounded: row groups, column chunks and pages that declare more than the file holds or more
// than memfit's bounds are refused from the metadata, before parquet-go reads or allocates by them.
func TestDeclaredSizesBounded(t *testing.T) {
	src := filepath.Join("testdata", "alpaca.arrow.parquet")
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		edit func(md *format.FileMetaData)
		want string
	}{
		{"rows", func(md *format.FileMetaData) { md.RowGroups[1].NumRows = 1 << 40 }, "row group 1 declares 1099511627776 rows"},
		{"chunk", func(md *format.FileMetaData) { md.RowGroups[0].Columns[2].MetaData.TotalUncompressedSize = 1 << 40 }, `row group 0, column "output" declares 1099511627776 bytes uncompressed`},
		{"extent", func(md *format.FileMetaData) { md.RowGroups[0].Columns[0].MetaData.TotalCompressedSize = 1 << 40 }, "outside the file's"},
		{"rows-held", func(md *format.FileMetaData) { md.RowGroups[2].NumRows = 1 << 20 }, "row group 2 declares 1048576 rows but holds 10: the file is corrupt"},
		{"offset", func(md *format.FileMetaData) { md.RowGroups[0].Columns[0].MetaData.DataPageOffset = -5 }, "outside the file's"},
	} {
		path := filepath.Join(dir, tc.name+".parquet")
		os.WriteFile(path, rewriteFooter(t, src, tc.edit), 0o644)
		d, err := Open(path, "", "")
		if err == nil {
			_, err = d.Instructions()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error naming %q", tc.name, err, tc.want)
		}
	}
}

// TestPageHeadersBounded: a page header declaring more bytes than its column chunk holds, more than
// MaxPageBytes, or more values than MaxPageValues is refused from the header, before the page is read.
func TestPageHeadersBounded(t *testing.T) {
	header := func(h format.PageHeader) []byte {
		b, err := thrift.Marshal(new(thrift.CompactProtocol), &h)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	data := func(values int32) thrift.Null[format.DataPageHeader] {
		return thrift.Null[format.DataPageHeader]{Valid: true, V: format.DataPageHeader{NumValues: values}}
	}
	for _, tc := range []struct {
		h    format.PageHeader
		pad  int
		want string
	}{
		{format.PageHeader{Type: format.DataPage, CompressedPageSize: 100, UncompressedPageSize: 100, DataPageHeader: data(10)}, 100, ""},
		{format.PageHeader{Type: format.DataPage, CompressedPageSize: 1 << 30, UncompressedPageSize: 1 << 30, DataPageHeader: data(10)}, 100, "page 0 declares 1073741824 bytes"},
		{format.PageHeader{Type: format.DataPage, CompressedPageSize: 100, UncompressedPageSize: 2000000000, DataPageHeader: data(10)}, 100, "(2000000000 uncompressed)"},
		{format.PageHeader{Type: format.DataPage, CompressedPageSize: 200, UncompressedPageSize: 200, DataPageHeader: data(10)}, 100, "with 100 bytes left in its column chunk"},
		{format.PageHeader{Type: format.DataPage, CompressedPageSize: 100, UncompressedPageSize: 100, DataPageHeader: data(1 << 30)}, 100, "page 0 declares 1073741824 values"},
	} {
		chunk := append(header(tc.h), make([]byte, tc.pad)...)
		err := checkPages("x.parquet: row group 0, column \"text\"", bytesReaderAt(chunk), 0, int64(len(chunk)))
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: %v; want %q", tc.h, err, tc.want)
		}
	}
}

type bytesReaderAt []byte

func (b bytesReaderAt) ReadAt(p []byte, off int64) (int, error) {
	if off >= int64(len(b)) {
		return 0, io.EOF
	}
	n := copy(p, b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}
