package data

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// Instruction is one Alpaca-format example.
type Instruction struct {
	Instruction string `json:"instruction"`
	Input       string `json:"input"`
	Output      string `json:"output"`
}

// ReadInstructions reads Alpaca-format JSONL (one object per line with instruction, input and output; rows with
// a "status" field other than "ok" are skipped, as alpaca-libre marks rejected rows). A malformed line is an
// error naming the file and line.
func ReadInstructions(path string) ([]Instruction, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Instruction
	err = EachLine(f, func(line int, text string) error {
		if strings.TrimSpace(text) == "" {
			return nil
		}
		var row struct {
			Instruction *string `json:"instruction"`
			Input       string  `json:"input"`
			Output      *string `json:"output"`
			Status      *string `json:"status"`
		}
		if err := json.Unmarshal([]byte(text), &row); err != nil {
			return fmt.Errorf("%s:%d: not a JSON object: %v", path, line, err)
		}
		if row.Status != nil && *row.Status != "ok" {
			return nil
		}
		if row.Instruction == nil || row.Output == nil {
			return fmt.Errorf("%s:%d: an Alpaca row needs \"instruction\" and \"output\" strings", path, line)
		}
		out = append(out, Instruction{Instruction: *row.Instruction, Input: row.Input, Output: *row.Output})
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no usable rows", path)
	}
	return out, nil
}

// EachLine calls fn with every line of r (1-based numbers, without the newline), lines of any length; it stops
// at fn's first error and returns it.
func EachLine(r io.Reader, fn func(line int, text string) error) error {
	br := bufio.NewReaderSize(r, 1<<20)
	for line := 1; ; line++ {
		text, err := br.ReadString('\n')
		if len(text) > 0 {
			if ferr := fn(line, strings.TrimRight(text, "\r\n")); ferr != nil {
				return ferr
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// Documents splits plain text into documents at blank lines (paragraphs); whitespace inside is kept.
func Documents(text string) []string {
	var out []string
	for _, p := range strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n\n") {
		if strings.TrimSpace(p) != "" {
			out = append(out, strings.TrimSpace(p))
		}
	}
	return out
}

// Pack concatenates token sequences, each followed by eos (when eos >= 0), and cuts the stream into blocks of
// length tokens; the last incomplete block is dropped. This is the usual packing for causal-LM training: every
// token is a real token (no padding), documents meet at an EOS.
func Pack(seqs [][]int, eos, length int) [][]int {
	var stream []int
	for _, s := range seqs {
		stream = append(stream, s...)
		if eos >= 0 {
			stream = append(stream, eos)
		}
	}
	var out [][]int
	for start := 0; start+length <= len(stream); start += length {
		out = append(out, stream[start:start+length])
	}
	return out
}
