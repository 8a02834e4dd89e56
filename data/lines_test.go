package data

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestLinesBounded: lines are read whole up to MaxLineBytes, a longer one is a LineTooLongError naming the file
// and line as soon as that much is read, and /dev/zero (one endless line) ends with that error quickly.
func TestLinesBounded(t *testing.T) {
	dir := t.TempDir()
	long := strings.Repeat("x", MaxLineBytes)
	p := filepath.Join(dir, "ok.txt")
	content := "first\r\n" + long + "\n\nlast without newline"
	os.WriteFile(p, []byte(content), 0o644)
	var got []string
	if err := EachFileLine(p, func(line int, text string) error {
		got = append(got, text)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 || got[0] != "first" || got[1] != long || got[2] != "" || got[3] != "last without newline" {
		t.Errorf("%d lines, first %q, last %q", len(got), got[0], got[len(got)-1])
	}
	if text, err := ReadTextFile(p); err != nil || text != content {
		t.Errorf("ReadTextFile: %v; equal to the file: %v", err, text == content)
	}
	bad := filepath.Join(dir, "bad.jsonl")
	row := `{"instruction": "a", "output": "b"}` + "\n"
	os.WriteFile(bad, []byte(row+long+"y\n"+row), 0o644)
	for name, read := range map[string]func() error{
		"EachFileLine": func() error { return EachFileLine(bad, func(int, string) error { return nil }) },
		"ReadTextFile": func() error { _, err := ReadTextFile(bad); return err },
		"ReadInstructions": func() error {
			_, err := ReadInstructions(bad)
			return err
		},
	} {
		err := read()
		var tl *LineTooLongError
		if !errors.As(err, &tl) || tl.Line != 2 || !strings.Contains(err.Error(), "bad.jsonl:2: the line is longer than 16 MiB") {
			t.Errorf("%s: %v; want a LineTooLongError for bad.jsonl:2", name, err)
		}
	}
	if err := EachLine(strings.NewReader(long+"zz"), func(int, string) error { return nil }); err == nil || err.Error() != (&LineTooLongError{Line: 1}).Error() {
		t.Errorf("an unnamed reader: %v", err)
	}
	// A reader that never ends and never has a newline: the error after 16 MiB, not an endless read.
	var n countingZeros
	if err := EachLine(&n, func(int, string) error { return nil }); err == nil || n.read > MaxLineBytes+1<<20 {
		t.Errorf("endless line: %v after %d bytes", err, n.read)
	}
	if _, err := os.Stat("/dev/zero"); err == nil {
		start := time.Now()
		_, err := ReadTextFile("/dev/zero")
		if err == nil || !strings.Contains(err.Error(), "/dev/zero is a character device, not a regular file") { // refused before it is read
			t.Errorf("/dev/zero: %v", err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("/dev/zero took %v", d)
		}
	}
}

type countingZeros struct{ read int }

func (c *countingZeros) Read(p []byte) (int, error) {
	clear(p)
	c.read += len(p)
	return len(p), nil
}

var _ io.Reader = (*countingZeros)(nil)

// TestInstructionsTrailingData: two JSON objects on one line of Alpaca JSONL are refused naming the line (the
// first was used).
func TestInstructionsTrailingData(t *testing.T) {
	p := filepath.Join(t.TempDir(), "two.jsonl")
	var b bytes.Buffer
	b.WriteString(`{"instruction": "a", "output": "b"}` + "\n")
	b.WriteString(`{"instruction": "c", "output": "d"} {"instruction": "e", "output": "f"}` + "\n")
	os.WriteFile(p, b.Bytes(), 0o644)
	if _, err := ReadInstructions(p); err == nil || !strings.Contains(err.Error(), "two.jsonl:2: trailing data after the JSON object") {
		t.Errorf("two objects on a line: %v", err)
	}
}
