// Package hfref runs Hugging Face tokenizers (tools/hftokenizers: the Rust library's Node binding, npm tokenizers
// 0.23.2) as the reference side of memfit's tokenizer tests: encodings of texts and pairs with their token type
// ids and truncation. Tests skip the live comparison where node or the npm package is not installed (.ci/run
// installs it); committed reference files cover the same cases without it.
package hfref

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Encoding is one reference encoding: the ids and token type ids Hugging Face tokenizers gives.
type Encoding struct {
	IDs     []int `json:"ids"`
	TypeIDs []int `json:"type_ids"`
}

// Input is one text (B nil) or text pair to encode.
type Input struct {
	A string
	B *string
}

// MarshalJSON writes the input as [a, b] (b null for a single text), as encode.mjs reads it.
func (in Input) MarshalJSON() ([]byte, error) { return json.Marshal([]any{in.A, in.B}) }

// Dir returns tools/hftokenizers of this repository.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "tools", "hftokenizers")
}

// Available reports whether the reference can run (node and the installed npm package), and why not.
func Available() (bool, string) {
	if _, err := exec.LookPath("node"); err != nil {
		return false, "node is not installed"
	}
	if _, err := os.Stat(filepath.Join(Dir(), "node_modules", "tokenizers", "package.json")); err != nil {
		return false, "npm tokenizers is not installed (cd tools/hftokenizers && npm install)"
	}
	return true, ""
}

// Encode encodes inputs with the tokenizer.json at path, truncated to maxLength (0: not truncated), skipping the
// test when the reference is not installed.
func Encode(t testing.TB, path string, maxLength int, inputs []Input) []Encoding {
	t.Helper()
	if ok, why := Available(); !ok {
		t.Skipf("Hugging Face tokenizers reference: %s", why)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	req, err := json.Marshal(map[string]any{"tokenizer": abs, "max_length": maxLength, "inputs": inputs})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", filepath.Join(Dir(), "encode.mjs"))
	cmd.Stdin = bytes.NewReader(req)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("Hugging Face tokenizers reference: %v: %s", err, strings.TrimSpace(stderr.String()))
	}
	encs, err := Parse(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(encs) != len(inputs) {
		t.Fatalf("Hugging Face tokenizers reference: %d encodings for %d inputs", len(encs), len(inputs))
	}
	return encs
}

// Parse reads JSON lines of encodings (encode.mjs's output, and the committed reference files).
func Parse(data []byte) ([]Encoding, error) {
	var out []Encoding
	for i, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		var e Encoding
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			return nil, fmt.Errorf("line %d: %v", i+1, err)
		}
		out = append(out, e)
	}
	return out, nil
}
