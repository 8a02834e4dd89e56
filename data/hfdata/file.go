package hfdata

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"

	"github.com/memfit/memfit/internal/readfile"
	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/encoding/thrift"
	"github.com/parquet-go/parquet-go/format"
)

// Bounds on what a parquet file may declare, checked before memfit or parquet-go allocates anything of that
// size. Files that `datasets`, pyarrow, DuckDB or arrow-rs write stay far below them: pyarrow's footer is KiBs,
// its row groups hold at most 1 Mi rows by default (64 Mi in recent versions) and its pages about 1 MiB.
const (
	// MaxFooterBytes is the largest footer (file metadata) read.
	MaxFooterBytes = 64 << 20
	// MaxChunkBytes is the largest column chunk of one row group, uncompressed.
	MaxChunkBytes = 1 << 30
	// MaxPageBytes is the largest page, compressed or not.
	MaxPageBytes = 256 << 20
	// MaxRowGroupRows is the most rows one row group may declare.
	MaxRowGroupRows = 1 << 26
	// MaxPageValues is the most values one page may declare (levels and dictionaries are sized by it; arrow-rs
	// and pyarrow write at most 20,000 rows a page).
	MaxPageValues = 1 << 24
)

// readRows is how many rows are decoded at a time: memory holds a batch of rows and the pages being read, never a
// whole row group's bytes at once.
const readRows = 64

// file is one open parquet file.
type file struct {
	path string
	f    io.Closer // nil for a file read from memory (the fuzz target)
	pf   *parquet.File
}

// openFile opens path as parquet, checking the magic bytes, the footer's length and every row group's and column
// chunk's declared sizes (and each page header's) before parquet-go reads them.
func openFile(path string) (*file, error) {
	f, err := readfile.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data %s: %v", path, err)
	}
	pf, err := openParquet(path, f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &file{path: path, f: f, pf: pf}, nil
}

// openParquet opens r (size bytes) named path as a bounded parquet file.
func openParquet(path string, f interface {
	io.ReaderAt
	Stat() (os.FileInfo, error)
}) (*parquet.File, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("data %s: %v", path, err)
	}
	return openReaderAt(path, f, st.Size())
}

// notParquet is the message for a file that is not parquet.
func notParquet(path, why string) error {
	return fmt.Errorf("%s is not a parquet file (%s): is it truncated or in another format?", path, why)
}

func openReaderAt(path string, r io.ReaderAt, size int64) (*parquet.File, error) {
	if size < 12 {
		return nil, notParquet(path, fmt.Sprintf("%d bytes, shorter than parquet's magic bytes and footer length", size))
	}
	var head, tail [8]byte
	if _, err := r.ReadAt(head[:4], 0); err != nil {
		return nil, fmt.Errorf("data %s: %v", path, err)
	}
	if _, err := r.ReadAt(tail[:], size-8); err != nil {
		return nil, fmt.Errorf("data %s: %v", path, err)
	}
	if string(head[:4]) != "PAR1" {
		return nil, notParquet(path, "it does not start with PAR1")
	}
	if string(tail[4:]) != "PAR1" {
		if string(tail[4:]) == "PARE" {
			return nil, fmt.Errorf("%s is an encrypted parquet file: memfit reads plain parquet", path)
		}
		return nil, notParquet(path, "it does not end with PAR1, the footer's magic bytes")
	}
	footer := int64(binary.LittleEndian.Uint32(tail[:4]))
	if footer == 0 || footer > size-12 || footer > MaxFooterBytes {
		return nil, notParquet(path, fmt.Sprintf("its footer declares %d bytes of metadata in a file of %d bytes (memfit reads footers of up to %d MiB)", footer, size, MaxFooterBytes>>20))
	}
	pf, err := safeOpen(r, size)
	if err != nil {
		return nil, notParquet(path, fmt.Sprintf("its footer does not decode: %v", err))
	}
	if err := checkSizes(path, r, size, pf.Metadata()); err != nil {
		return nil, err
	}
	if hasLZ4Raw(pf.Metadata()) { // parquet-go misreads LZ4_RAW pages (lz4raw.go): read them uncompressed
		lf, err := newLZ4File(path, r, pf.Metadata())
		if err != nil {
			return nil, err
		}
		if pf, err = safeOpen(lf, lf.size); err != nil {
			return nil, notParquet(path, fmt.Sprintf("its footer does not decode: %v", err))
		}
	}
	return pf, nil
}

// safeOpen is parquet.OpenFile with a panic in parquet-go (a malformed footer it does not check) turned into an
// error.
func safeOpen(r io.ReaderAt, size int64) (pf *parquet.File, err error) {
	defer func() {
		if p := recover(); p != nil {
			pf, err = nil, fmt.Errorf("%v", p)
		}
	}()
	return parquet.OpenFile(r, size, parquet.SkipPageIndex(true), parquet.SkipBloomFilters(true), parquet.ReadBufferSize(64<<10))
}

// checkSizes refuses declared sizes past the file or memfit's bounds: rows of each row group, each column chunk's
// extent and uncompressed size, and each page header within the chunk.
func checkSizes(path string, r io.ReaderAt, size int64, md *format.FileMetaData) error {
	for g, rg := range md.RowGroups {
		if rg.NumRows < 0 || rg.NumRows > MaxRowGroupRows {
			return fmt.Errorf("%s: row group %d declares %d rows (memfit reads row groups of up to %d rows): the file is corrupt or was written with far larger row groups; rewrite it with smaller ones (pyarrow row_group_size)",
				path, g, rg.NumRows, MaxRowGroupRows)
		}
		for c, cc := range rg.Columns {
			m := cc.MetaData
			start := chunkStart(m)
			name := fmt.Sprintf("%s: row group %d, column %d", path, g, c)
			if len(m.PathInSchema) > 0 {
				name = fmt.Sprintf("%s: row group %d, column %q", path, g, joinPath(m.PathInSchema))
			}
			if cc.FilePath != "" {
				return fmt.Errorf("%s is stored in another file (%s): memfit reads self-contained parquet files", name, cc.FilePath)
			}
			if start < 4 || m.TotalCompressedSize < 0 || start+m.TotalCompressedSize > size-8 || start+m.TotalCompressedSize < start {
				return fmt.Errorf("%s declares %d bytes at offset %d, outside the file's %d bytes: the file is corrupt", name, m.TotalCompressedSize, start, size)
			}
			if m.TotalUncompressedSize < 0 || m.TotalUncompressedSize > MaxChunkBytes {
				return fmt.Errorf("%s declares %d bytes uncompressed (memfit reads column chunks of up to %d MiB): the file is corrupt or its row groups are too large; rewrite it with smaller ones", name, m.TotalUncompressedSize, MaxChunkBytes>>20)
			}
			switch m.Codec {
			case format.Lz4, format.LZO:
				return fmt.Errorf("%s is compressed with %s, a codec parquet has deprecated and memfit does not read: rewrite the file with snappy or zstd (pyarrow compression='snappy', DuckDB COMPRESSION snappy)", name, m.Codec)
			}
			if err := checkPages(name, r, start, m.TotalCompressedSize); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkPages reads the page headers of the column chunk at [start, start+n) and refuses a page whose declared
// size passes the chunk's end or MaxPageBytes.
func checkPages(name string, r io.ReaderAt, start, n int64) error {
	return eachPage(name, r, start, n, func(format.PageHeader, int64, int64) error { return nil })
}

// eachPage reads the page headers of the column chunk at [start, start+n), refusing a page whose declared size
// passes the chunk's end or memfit's bounds, and calls fn with each header, where the page starts and where its
// payload starts (offsets in r).
func eachPage(name string, r io.ReaderAt, start, n int64, fn func(h format.PageHeader, at, payload int64) error) error {
	sec := io.NewSectionReader(r, start, n)
	br := bufio.NewReaderSize(sec, 4<<10)
	var compact thrift.CompactProtocol
	pos := int64(0)
	for page := 0; pos < n; page++ {
		var h format.PageHeader
		cr := &countingReader{r: br}
		dec := thrift.NewDecoder(compact.NewReader(cr))
		if err := safeDecode(dec, &h); err != nil {
			return fmt.Errorf("%s: page %d's header does not decode (%v): the file is corrupt", name, page, err)
		}
		at := pos
		pos += cr.n
		if h.CompressedPageSize < 0 || h.UncompressedPageSize < 0 || h.CompressedPageSize > MaxPageBytes || h.UncompressedPageSize > MaxPageBytes ||
			pos+int64(h.CompressedPageSize) > n {
			return fmt.Errorf("%s: page %d declares %d bytes (%d uncompressed) with %d bytes left in its column chunk (memfit reads pages of up to %d MiB): the file is corrupt",
				name, page, h.CompressedPageSize, h.UncompressedPageSize, n-pos, MaxPageBytes>>20)
		}
		values := int64(0)
		switch {
		case h.DataPageHeader.Valid:
			values = int64(h.DataPageHeader.V.NumValues)
		case h.DataPageHeaderV2.Valid:
			values = int64(h.DataPageHeaderV2.V.NumValues)
		case h.DictionaryPageHeader.Valid:
			values = int64(h.DictionaryPageHeader.V.NumValues)
		}
		if values < 0 || values > MaxPageValues {
			return fmt.Errorf("%s: page %d declares %d values (memfit reads pages of up to %d values): the file is corrupt", name, page, values, MaxPageValues)
		}
		if err := fn(h, start+at, start+pos); err != nil {
			return err
		}
		if _, err := br.Discard(int(h.CompressedPageSize)); err != nil {
			return fmt.Errorf("%s: page %d: %v: the file is corrupt", name, page, err)
		}
		pos += int64(h.CompressedPageSize)
	}
	return nil
}

// chunkStart is where a column chunk's first page starts: its dictionary page, or its first data page.
func chunkStart(m format.ColumnMetaData) int64 {
	start := m.DataPageOffset
	if m.DictionaryPageOffset > 0 && m.DictionaryPageOffset < start {
		start = m.DictionaryPageOffset
	}
	return start
}

func safeDecode(dec *thrift.Decoder, v any) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	return dec.Decode(v)
}

// countingReader counts the bytes read through it (a page header's length).
type countingReader struct {
	r *bufio.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *countingReader) ReadByte() (byte, error) {
	b, err := c.r.ReadByte()
	if err == nil {
		c.n++
	}
	return b, err
}

func joinPath(p []string) string {
	var b bytes.Buffer
	for i, s := range p {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(s)
	}
	return b.String()
}

func (f *file) Close() error {
	if f.f == nil {
		return nil
	}
	return f.f.Close()
}
