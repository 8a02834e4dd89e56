package data

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Instruction is one Alpaca-format example.
type Instruction struct {
	Instruction string `json:"instruction"`
	Input       string `json:"input"`
	Output      string `json:"output"`
}

// ReadInstructions reads Alpaca-format JSONL (one object per line with instruction, input and output; rows with
// a "status" field other than "ok" are skipped, as alpaca-libre marks rejected rows). A malformed line, two JSON
// values on one line, a conversation row (one kind per file: see JSONLKind) or a line longer than MaxLineBytes is
// an error naming the file and line.
func ReadInstructions(path string) ([]Instruction, error) {
	var out []Instruction
	rows, skipped := 0, 0
	err := EachFileLine(path, func(line int, text string) error {
		if strings.TrimSpace(text) == "" {
			return nil
		}
		var row struct {
			Instruction *string `json:"instruction"`
			Input       string  `json:"input"`
			Output      *string `json:"output"`
			Status      *string `json:"status"`
			// A conversation's keys: a row of the other kind (one kind per file).
			Messages      json.RawMessage `json:"messages"`
			Conversations json.RawMessage `json:"conversations"`
		}
		dec := json.NewDecoder(strings.NewReader(text))
		if err := dec.Decode(&row); err != nil {
			return fmt.Errorf("%s:%d: not a JSON object: %v", path, line, err)
		}
		if _, err := dec.Token(); !errors.Is(err, io.EOF) {
			return fmt.Errorf("%s:%d: trailing data after the JSON object (one JSON object per line)", path, line)
		}
		if row.Messages != nil || row.Conversations != nil {
			return mixedKind(path, line, KindMessages, KindAlpaca)
		}
		rows++
		if row.Status != nil && *row.Status != "ok" {
			skipped++
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
		return nil, NoUsableRows(path, rows, skipped)
	}
	return out, nil
}

// NoUsableRows is the error for Alpaca data (named where) that gives no row: rows rows read, skipped of them for
// a "status" other than "ok".
func NoUsableRows(where string, rows, skipped int) error {
	if rows > 0 && skipped == rows {
		return fmt.Errorf("%s: no usable rows: all %d rows have a \"status\" other than \"ok\" (memfit skips those, as alpaca-libre marks its rejected rows): drop the status column, or keep rows marked ok", where, rows)
	}
	return fmt.Errorf("%s: no usable rows", where)
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
