package data

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/memfit/memfit/internal/readfile"
)

// IDX is a decoded IDX file of unsigned bytes (the MNIST / Fashion-MNIST format): its dimensions and data.
type IDX struct {
	Dims []int
	Data []byte
}

// ReadIDX reads an IDX file of unsigned bytes, gzip-compressed or not.
func ReadIDX(path string) (*IDX, error) {
	raw, err := readfile.Read(path, readfile.Data)
	if err != nil {
		return nil, err
	}
	x, err := DecodeIDX(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return x, nil
}

// DecodeIDX decodes the bytes of an IDX file of unsigned bytes (gzip-compressed or not).
func DecodeIDX(raw []byte) (*IDX, error) {
	if len(raw) > 2 && raw[0] == 0x1f && raw[1] == 0x8b {
		z, err := gzip.NewReader(bytes.NewReader(raw))
		if err != nil {
			return nil, err
		}
		if raw, err = io.ReadAll(io.LimitReader(z, readfile.Data+1)); err != nil {
			return nil, fmt.Errorf("truncated or corrupt gzip: %w", err)
		}
		if len(raw) > readfile.Data {
			return nil, fmt.Errorf("the gzip stream holds more than %s, the most memfit reads of an IDX file", readfile.FormatSize(readfile.Data))
		}
	}
	if len(raw) < 4 || raw[0] != 0 || raw[1] != 0 || raw[2] != 0x08 || raw[3] == 0 {
		return nil, fmt.Errorf("not an IDX file of unsigned bytes (magic % x)", raw[:min(4, len(raw))])
	}
	nd := int(raw[3])
	if len(raw) < 4+4*nd {
		return nil, fmt.Errorf("truncated IDX header")
	}
	x := &IDX{}
	size := 1
	have := len(raw) - 4 - 4*nd
	for i := 0; i < nd; i++ {
		d := int(binary.BigEndian.Uint32(raw[4+4*i:]))
		x.Dims = append(x.Dims, d)
		if d == 0 {
			return nil, fmt.Errorf("IDX header declares a zero dimension (%v so far): no data", x.Dims)
		}
		if size > have/d { // checked before multiplying: a header of huge dimensions cannot overflow the count
			return nil, fmt.Errorf("IDX header declares dimensions %v..., more than the file's %d data bytes: truncated or corrupt", x.Dims, have)
		}
		size *= d
	}
	if have != size {
		return nil, fmt.Errorf("IDX data has %d bytes, its header says %v (%d): truncated or corrupt", len(raw)-4-4*nd, x.Dims, size)
	}
	x.Data = raw[4+4*nd:]
	return x, nil
}

// Encode returns x as a gzip-compressed IDX file.
func (x *IDX) Encode() []byte {
	var buf bytes.Buffer
	z, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	hdr := []byte{0, 0, 0x08, byte(len(x.Dims))}
	for _, d := range x.Dims {
		hdr = binary.BigEndian.AppendUint32(hdr, uint32(d))
	}
	z.Write(hdr)
	z.Write(x.Data)
	z.Close()
	return buf.Bytes()
}
