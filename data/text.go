package data

import (
	"bytes"
	"fmt"
	"strings"
)

// Instruction is one Alpaca-format example.
type Instruction struct {
	Instruction string `json:"instruction"`
	Input       string `json:"input"`
	Output      string `json:"output"`
}

// CheckPrompt refuses an Alpaca row whose prompt is empty: instruction and input both empty (or white space), as
// CheckConversation refuses an empty user message. An empty output is an example with an empty reply
// (EmptyReply), which training leaves out and counts.
func (r Instruction) CheckPrompt() error {
	if strings.TrimSpace(r.Instruction) == "" && strings.TrimSpace(r.Input) == "" {
		return fmt.Errorf("the instruction is empty (and so is the input): an Alpaca row needs an instruction, as a conversation needs a user message")
	}
	return nil
}

// EmptyReply reports whether the row's output is empty (or only white space).
func (r Instruction) EmptyReply() bool { return strings.TrimSpace(r.Output) == "" }

// ReadInstructions reads Alpaca-format JSONL (one object per line with instruction, input and output; rows with
// a "status" field other than "ok" are skipped, as alpaca-libre marks rejected rows). A malformed line, two JSON
// values on one line, a key given twice, a field of another type, an empty prompt (CheckPrompt), a conversation
// row (one kind per file: see JSONLKind) or a line longer than MaxLineBytes is an error naming the file and line.
func ReadInstructions(path string) ([]Instruction, error) {
	var out []Instruction
	rows, skipped := 0, 0
	err := EachFileLine(path, func(line int, text string) error {
		if strings.TrimSpace(text) == "" {
			return nil
		}
		keys, err := decodeRow(text)
		if err != nil {
			return fmt.Errorf("%s:%d: %v", path, line, err)
		}
		if k := rowKind(keys); k == KindMessages || k == KindPreference {
			return mixedKind(path, line, k, KindAlpaca)
		}
		field := func(key string, optional bool) (string, bool, error) {
			raw, ok := keys[key]
			if !ok || optional && string(bytes.TrimSpace(raw)) == "null" {
				return "", false, nil
			}
			v, err := jsonString(raw)
			if err != nil {
				return "", false, fmt.Errorf("%s:%d: %q must be a string (%v)", path, line, key, err)
			}
			return v, true, nil
		}
		var row Instruction
		var hasIns, hasOut, hasStatus bool
		var status string
		if row.Instruction, hasIns, err = field("instruction", false); err != nil {
			return err
		}
		if row.Input, _, err = field("input", true); err != nil {
			return err
		}
		if row.Output, hasOut, err = field("output", false); err != nil {
			return err
		}
		if status, hasStatus, err = field("status", true); err != nil {
			return err
		}
		rows++
		if hasStatus && status != "ok" {
			skipped++
			return nil
		}
		if !hasIns || !hasOut {
			return fmt.Errorf("%s:%d: an Alpaca row needs \"instruction\" and \"output\" strings", path, line)
		}
		if err := row.CheckPrompt(); err != nil {
			return fmt.Errorf("%s:%d: %v", path, line, err)
		}
		out = append(out, row)
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
