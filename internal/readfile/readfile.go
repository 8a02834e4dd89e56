// Package readfile reads a whole file the way every part of memfit must: only a regular file (links followed; a
// folder, a device such as /dev/zero, a named pipe or a socket is refused before it is opened, so nothing blocks
// or streams forever) and only up to a bound on its size (a file larger than what its kind ever holds is refused
// after at most that many bytes, so nothing grows without limit). Each caller names the bound that fits what it
// reads, from the limits below.
package readfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// Bounds of the files memfit reads whole. Each is far above what such a file holds in practice and far below
// what would exhaust a machine's memory.
const (
	// Small is a file of a few words: an output folder's "latest" and lock files.
	Small = 4 << 10
	// Config is a JSON or YAML file of settings or state: config.json, generation_config.json,
	// preprocessor_config.json, tokenizer_config.json (which may carry a long chat template), adapter_config.json,
	// model.safetensors.index.json, run.yaml, trainer_state.json, a --config file, the calibration cache. The
	// largest real ones are a few hundred KiB.
	Config = 64 << 20
	// Tokenizer is a tokenizer.json or SentencePiece model (the largest on the Hub, multilingual vocabularies of
	// 250k tokens, are about 35 MiB).
	Tokenizer = 512 << 20
	// Log is a run's metrics log (one JSON line per logged step: a million steps take about 400 MiB).
	Log = 1 << 30
	// Data is a data file read whole (an IDX file of images, an inputs JSON of logits: their own checks bound
	// what they hold; EMNIST's largest IDX file is 640 MiB).
	Data = 4 << 30
)

// ErrNotRegular is the error (wrapped) of Read on a path that is not a regular file.
var ErrNotRegular = errors.New("not a regular file")

// TooLargeError says that a file holds more than the bound it was read with.
type TooLargeError struct {
	Path  string
	Limit int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("%s is larger than %s, the most memfit reads of such a file: is it the right file?", e.Path, FormatSize(e.Limit))
}

// Check returns nil when path (links followed) is a regular file, the error of os.Stat when it cannot be
// read, and otherwise an error wrapping ErrNotRegular that says what it is.
func Check(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if st.Mode().IsRegular() {
		return nil
	}
	return fmt.Errorf("%s is %s, %w: give a file", path, kind(st.Mode()), ErrNotRegular)
}

// kind names what a file of mode m is.
func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a folder"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a device"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	}
	return "not a regular file (" + m.Type().String() + ")"
}

// Open opens the regular file at path for reading, as os.Open does, refusing before it is opened a path that is
// not a regular file (Check): for the files memfit reads through to their end in pieces (checksums, copies,
// parquet, GGUF, safetensors, image tars), which bound what they read by the size the file reports, and which a
// named pipe would block and a device would feed without end.
func Open(path string) (*os.File, error) {
	if err := Check(path); err != nil {
		return nil, err
	}
	return os.Open(path)
}

// Read returns the bytes of the regular file at path, which must hold at most limit bytes: a path that is not a
// regular file is refused before it is opened (Check), and a larger file with a *TooLargeError once limit + 1
// bytes have been read (the size a file reports is not trusted: files under /proc report 0). Errors of opening
// and reading are os.ReadFile's, so errors.Is(err, fs.ErrNotExist) still tells a missing file.
func Read(path string, limit int64) ([]byte, error) {
	if err := Check(path); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > limit {
		return nil, &TooLargeError{Path: path, Limit: limit}
	}
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, &fs.PathError{Op: "read", Path: path, Err: err}
	}
	if int64(len(b)) > limit {
		return nil, &TooLargeError{Path: path, Limit: limit}
	}
	return b, nil
}

// FormatSize writes a byte count in the largest binary unit that keeps it whole or short: 4 KiB, 64 MiB, 1 GiB.
func FormatSize(n int64) string {
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	u, v := 0, float64(n)
	for v >= 1024 && u < len(units)-1 {
		v /= 1024
		u++
	}
	if v == float64(int64(v)) {
		return fmt.Sprintf("%d %s", int64(v), units[u])
	}
	return fmt.Sprintf("%.1f %s", v, units[u])
}
