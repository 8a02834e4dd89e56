package hfdata

// LZ4_RAW pages. parquet-go v0.32.0 decodes them wrong: its LZ4 codec allocates a new output buffer whenever the
// page's buffer holds less than three times the compressed size, and the page reader then keeps its own, unwritten
// buffer (github.com/parquet-go/parquet-go issue #608, fix proposed in pull request #609). A file whose pages
// compress less than 3:1 therefore fails with "decoding level expected N values but got only 0", or reads other
// bytes. Until a release carries the fix, memfit reads such a file through lz4File: the same file with its LZ4_RAW
// column chunks stored uncompressed, which parquet-go reads as it reads any uncompressed file, each page
// decompressed (with github.com/pierrec/lz4, the library parquet-go itself uses) only when parquet-go reads it.

import (
	"fmt"
	"io"
	"sort"
	"sync"

	"github.com/parquet-go/parquet-go/encoding/thrift"
	"github.com/parquet-go/parquet-go/format"
	"github.com/pierrec/lz4/v4"
)

// hasLZ4Raw reports whether a column chunk of md is LZ4_RAW-compressed.
func hasLZ4Raw(md *format.FileMetaData) bool {
	for _, rg := range md.RowGroups {
		for _, cc := range rg.Columns {
			if cc.MetaData.Codec == format.Lz4Raw {
				return true
			}
		}
	}
	return false
}

// segment is a range of lz4File: bytes it holds (magic, page headers, footer), a range of the original file, or
// an LZ4_RAW page of the original file, decompressed.
type segment struct {
	off, n int64  // in lz4File
	bytes  []byte // held bytes, or nil
	src    int64  // offset in the original file (of the range, or of the page's stored bytes)
	lz4    bool   // an LZ4_RAW page: srcN stored bytes at src, of which the first prefix are copied as they are
	srcN   int64  // (the levels of a v2 data page) and the rest decompressed to n - prefix bytes
	prefix int64
}

// lz4File is a parquet file whose LZ4_RAW column chunks read as uncompressed ones (io.ReaderAt).
type lz4File struct {
	r    io.ReaderAt
	segs []segment
	size int64

	mu    sync.Mutex
	cache []cachedPage // the pages decompressed last, the newest last
}

type cachedPage struct {
	seg  int
	data []byte
}

// pageCacheBytes bounds the decompressed pages lz4File keeps besides the one being read: enough for the pages of
// the columns a row reads together.
const pageCacheBytes = 32 << 20

// newLZ4File lays out the parquet file r (its footer md, already checked by checkSizes) with its LZ4_RAW chunks
// uncompressed: the same row groups, pages and values, each LZ4_RAW page's header rewritten to its uncompressed
// size (and without its CRC, which covered the compressed bytes), the footer rewritten to the new offsets and
// sizes with codec UNCOMPRESSED for those chunks and no page indexes or bloom filters (memfit reads neither).
func newLZ4File(path string, r io.ReaderAt, md *format.FileMetaData) (*lz4File, error) {
	f := &lz4File{r: r}
	add := func(s segment) {
		s.off = f.size
		f.segs = append(f.segs, s)
		f.size += s.n
	}
	add(segment{bytes: []byte("PAR1"), n: 4})
	out := *md
	out.RowGroups = make([]format.RowGroup, len(md.RowGroups))
	for g, rg := range md.RowGroups {
		nrg := rg
		nrg.Columns = make([]format.ColumnChunk, len(rg.Columns))
		nrg.TotalCompressedSize = 0
		for c, cc := range rg.Columns {
			m := cc.MetaData
			start := chunkStart(m)
			newStart := f.size
			moved := map[int64]int64{} // original page offsets to new ones
			if m.Codec != format.Lz4Raw {
				add(segment{src: start, n: m.TotalCompressedSize})
				moved[m.DataPageOffset] = newStart + m.DataPageOffset - start
				moved[m.DictionaryPageOffset] = newStart + m.DictionaryPageOffset - start
			} else {
				name := fmt.Sprintf("%s: row group %d, column %q", path, g, joinPath(m.PathInSchema))
				err := eachPage(name, r, start, m.TotalCompressedSize, func(h format.PageHeader, at, payload int64) error {
					moved[at] = f.size
					stored, prefix := int64(h.CompressedPageSize), int64(0)
					if h.DataPageHeaderV2.Valid { // levels are stored uncompressed before the values
						v2 := h.DataPageHeaderV2.V
						prefix = int64(v2.RepetitionLevelsByteLength) + int64(v2.DefinitionLevelsByteLength)
						if v2.IsCompressed.Valid && !v2.IsCompressed.V {
							prefix = stored // the values too
						}
						v2.IsCompressed = thrift.New(false)
						h.DataPageHeaderV2 = thrift.New(v2)
					}
					n := int64(h.UncompressedPageSize)
					if prefix < 0 || prefix > stored || prefix > n {
						return fmt.Errorf("%s: a page declares %d bytes of levels in %d bytes: the file is corrupt", name, prefix, stored)
					}
					if prefix == stored {
						n = stored
					}
					h.CompressedPageSize, h.UncompressedPageSize, h.CRC = int32(n), int32(n), 0
					hb, err := thrift.Marshal(new(thrift.CompactProtocol), &h)
					if err != nil {
						return fmt.Errorf("%s: %v", name, err)
					}
					add(segment{bytes: hb, n: int64(len(hb))})
					add(segment{lz4: prefix < n, src: payload, srcN: stored, n: n, prefix: prefix})
					return nil
				})
				if err != nil {
					return nil, err
				}
				m.Codec = format.Uncompressed
			}
			m.TotalCompressedSize = f.size - newStart
			m.DataPageOffset = moved[m.DataPageOffset]
			if m.DictionaryPageOffset > 0 {
				m.DictionaryPageOffset = moved[m.DictionaryPageOffset]
			}
			m.IndexPageOffset, m.BloomFilterOffset, m.BloomFilterLength = 0, 0, 0
			ncc := cc
			ncc.MetaData = m
			ncc.FileOffset = newStart
			ncc.OffsetIndexOffset, ncc.OffsetIndexLength, ncc.ColumnIndexOffset, ncc.ColumnIndexLength = 0, 0, 0, 0
			nrg.Columns[c] = ncc
			nrg.TotalCompressedSize += m.TotalCompressedSize
			if c == 0 {
				nrg.FileOffset = newStart
			}
		}
		out.RowGroups[g] = nrg
	}
	footer, err := thrift.Marshal(new(thrift.CompactProtocol), &out)
	if err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	n := uint32(len(footer))
	add(segment{bytes: footer, n: int64(n)})
	add(segment{bytes: append([]byte{byte(n), byte(n >> 8), byte(n >> 16), byte(n >> 24)}, "PAR1"...), n: 8})
	return f, nil
}

// ReadAt reads the laid-out file.
func (f *lz4File) ReadAt(p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, fmt.Errorf("read at offset %d", off)
	}
	done := 0
	for done < len(p) {
		at := off + int64(done)
		if at >= f.size {
			return done, io.EOF
		}
		i := sort.Search(len(f.segs), func(i int) bool { return f.segs[i].off+f.segs[i].n > at })
		s := f.segs[i]
		within := at - s.off
		want := min(int64(len(p)-done), s.n-within)
		dst := p[done : done+int(want)]
		switch {
		case s.bytes != nil:
			copy(dst, s.bytes[within:])
		case !s.lz4:
			if _, err := f.r.ReadAt(dst, s.src+within); err != nil {
				return done, err
			}
		default:
			page, err := f.page(i)
			if err != nil {
				return done, err
			}
			copy(dst, page[within:])
		}
		done += int(want)
	}
	return done, nil
}

// page returns segment i's page decompressed, from the cache or decompressed now.
func (f *lz4File) page(i int) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, c := range f.cache {
		if c.seg == i {
			f.cache = append(append(f.cache[:k:k], f.cache[k+1:]...), c) // the newest last
			return c.data, nil
		}
	}
	s := f.segs[i]
	stored := make([]byte, s.srcN)
	if _, err := f.r.ReadAt(stored, s.src); err != nil {
		return nil, err
	}
	data := make([]byte, s.n)
	copy(data, stored[:s.prefix])
	got, err := lz4.UncompressBlock(stored[s.prefix:], data[s.prefix:])
	if err != nil || int64(got) != s.n-s.prefix {
		return nil, fmt.Errorf("an LZ4_RAW page does not decompress to the %d bytes its header declares (%d, %v)", s.n-s.prefix, got, err)
	}
	kept := int64(0)
	for _, c := range f.cache {
		kept += int64(len(c.data))
	}
	for len(f.cache) > 0 && kept+s.n > pageCacheBytes {
		kept -= int64(len(f.cache[0].data))
		f.cache = f.cache[1:]
	}
	f.cache = append(f.cache, cachedPage{seg: i, data: data})
	return data, nil
}
