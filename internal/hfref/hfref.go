// Package hfref runs Hugging Face tokenizers (tools/hftokenizers: the Rust library's Node binding, npm tokenizers
// 0.23.2) as the reference side of memfit's tokenizer tests: encodings of texts and pairs with their token type
// ids and truncation. The npm package is installed on first use into memfit's npm tool cache (internal/npmtool,
// once per machine); tests skip the live comparison only where node or npm is missing, and committed reference
// files cover the same cases without it.
package hfref

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/memfit/memfit/internal/npmtool"
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

var (
	installOnce sync.Once
	installed   *npmtool.Installed
	installErr  error
)

// install installs tools/hftokenizers into the npm tool cache (once per process; npm runs once per machine).
func install() (*npmtool.Installed, error) {
	installOnce.Do(func() { installed, installErr = npmtool.Install(Dir(), nil) })
	return installed, installErr
}

// Available reports whether the reference can run (node and npm are there), and why not. An install that fails
// where they are is not a reason to skip: Encode fails the test with it.
func Available() (bool, string) {
	if _, err := npmtool.FindNode(); err != nil {
		return false, err.Error()
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
	tool, err := install()
	if err != nil {
		t.Fatalf("Hugging Face tokenizers reference: %v", err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	req, err := json.Marshal(map[string]any{"tokenizer": abs, "max_length": maxLength, "inputs": inputs})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(tool.Node, tool.Script("encode.mjs"))
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
