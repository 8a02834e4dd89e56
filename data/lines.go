package data

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/memfit/memfit/internal/readfile"
)

// MaxLineBytes is the longest line memfit reads from a file of lines that a user gives it (prompt files, Alpaca
// and text JSONL, text training data, GLUE TSV, MMLU CSV, GLUE predictions, tokenize's standard input): 16 MiB,
// its newline not counted. The longest line of the data memfit ships or tests with is a few KiB, and a line
// holds one prompt or example, which a model's context of at most 1,048,576 tokens bounds long before 16 MiB of
// text. A longer line is refused as soon as its 16 MiB have been read (*LineTooLongError), so a file that is
// not made of lines (/dev/zero, a binary file) ends with that error quickly instead of exhausting memory.
const MaxLineBytes = 16 << 20

// LineTooLongError says that a line of a file holds more than MaxLineBytes bytes.
type LineTooLongError struct {
	// Name is the file ("" when the reader has no name), Line the line's 1-based number.
	Name string
	Line int
}

func (e *LineTooLongError) Error() string {
	name := e.Name
	if name == "" {
		name = "input"
	}
	return fmt.Sprintf("%s:%d: the line is longer than %d MiB, the most memfit reads in one line: is it a file of text lines?",
		name, e.Line, MaxLineBytes>>20)
}

// EachLine calls fn with every line of r (1-based numbers, without the newline and a carriage return before
// it); it stops at fn's first error and returns it. A line longer than MaxLineBytes is a *LineTooLongError.
func EachLine(r io.Reader, fn func(line int, text string) error) error {
	return EachLineOf(r, "", fn)
}

// EachLineOf is EachLine for a reader named name (a file's path): a line too long is reported as name:line.
func EachLineOf(r io.Reader, name string, fn func(line int, text string) error) error {
	return eachRawLine(r, name, func(line int, raw []byte) error {
		return fn(line, strings.TrimRight(string(raw), "\r\n"))
	})
}

// EachFileLine opens path and calls fn with each of its lines, as EachLineOf.
func EachFileLine(path string, fn func(line int, text string) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return EachLineOf(f, path, fn)
}

// ReadTextFile reads the whole of a file of text lines, as os.ReadFile does, but refuses a line longer than
// MaxLineBytes (a *LineTooLongError naming path and the line) as soon as it has read that much of it, a path that
// is not a regular file (readfile.Check: a device or a named pipe would stream or block) and a file of more than
// readfile.Data bytes (a *readfile.TooLargeError).
func ReadTextFile(path string) (string, error) {
	if err := readfile.Check(path); err != nil {
		return "", err
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	var sb strings.Builder
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
		sb.Grow(int(min(st.Size(), 1<<30)))
	}
	err = eachRawLine(f, path, func(_ int, raw []byte) error {
		if int64(sb.Len()+len(raw)) > readfile.Data {
			return &readfile.TooLargeError{Path: path, Limit: readfile.Data}
		}
		sb.Write(raw)
		return nil
	})
	if err != nil {
		return "", err
	}
	return sb.String(), nil
}

// eachRawLine calls fn with each line of r as read, its newline included (the last line may lack one); the
// bytes are valid until fn returns.
func eachRawLine(r io.Reader, name string, fn func(line int, raw []byte) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var buf []byte
	for line := 1; ; line++ {
		buf = buf[:0]
		var err error
		for {
			var chunk []byte
			chunk, err = br.ReadSlice('\n')
			buf = append(buf, chunk...)
			if len(bytes.TrimSuffix(buf, []byte{'\n'})) > MaxLineBytes {
				return &LineTooLongError{Name: name, Line: line}
			}
			if !errors.Is(err, bufio.ErrBufferFull) {
				break
			}
		}
		if line == 1 {
			buf = bytes.TrimPrefix(buf, []byte("\ufeff")) // a UTF-8 byte-order mark (Windows editors write one) is not text
		}
		if len(buf) > 0 {
			if ferr := fn(line, buf); ferr != nil {
				return ferr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if cap(buf) > 1<<20 {
			buf = nil // do not keep a long line's buffer for the short ones after it
		}
	}
}
