// Package llamacpp runs GGUF files through llama.cpp itself, for memfit's checks of its GGUF export and for
// `finetune bench generate`'s llama.cpp column: the npm package node-llama-cpp (its prebuilt CPU binaries of
// llama.cpp) driven by tools/llamacpp/llamacpp.mjs in its own node process, one JSON request on stdin and one
// JSON result on stdout.
//
// The tooling (tools/llamacpp: package.json, its lock and the script) is installed by Install into memfit's npm
// tool cache, once per machine (internal/npmtool), or by hand with `cd tools/llamacpp && npm install
// --ignore-scripts --no-save` (Find); node_modules is not committed.
package llamacpp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/memfit/memfit/internal/npmtool"
	"github.com/memfit/memfit/internal/readfile"
)

// Version is the node-llama-cpp release tools/llamacpp/package.json pins.
const Version = "3.22.1"

// ErrNoNode says node or npm is not on the PATH: the llama.cpp checks cannot run on this machine at all (a test
// skips on it; every other error means the tooling is there but broken).
var ErrNoNode = npmtool.ErrNoNode

// Tool is an installed tools/llamacpp: the node binary and the script.
type Tool struct {
	// Node is the node executable.
	Node string
	// Dir is the tools/llamacpp folder (package.json, node_modules, llamacpp.mjs).
	Dir string
}

// Find locates node and the tooling installed in dir itself (the repository's tools/llamacpp after `npm
// install` there). It returns an error wrapping ErrNoNode when node or npm is missing, and an error naming the
// command to run when node-llama-cpp is not installed in dir.
func Find(dir string) (*Tool, error) {
	node, abs, err := check(dir)
	if err != nil {
		return nil, err
	}
	if err := installed(abs); err != nil {
		return nil, fmt.Errorf("%s: %v: run `cd %s && npm install --no-audit --no-fund --ignore-scripts --no-save`", dir, err, dir)
	}
	return &Tool{Node: node, Dir: abs}, nil
}

// Install returns the tooling of dir (the repository's tools/llamacpp): dir itself when node-llama-cpp is
// installed there, else an install of dir's package.json and lock into memfit's npm tool cache, made once per
// machine (log is told when npm runs). Errors as Find's, plus npm's when the install fails.
func Install(dir string, log io.Writer) (*Tool, error) {
	node, abs, err := check(dir)
	if err != nil {
		return nil, err
	}
	if installed(abs) == nil {
		return &Tool{Node: node, Dir: abs}, nil
	}
	in, err := npmtool.Install(abs, log)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	if err := installed(in.Dir); err != nil {
		return nil, fmt.Errorf("%s: %v after installing it into %s", dir, err, in.Packages)
	}
	return &Tool{Node: node, Dir: in.Dir}, nil
}

// check finds node (20 or later) and npm, and the script in dir.
func check(dir string) (node, abs string, err error) {
	if node, err = npmtool.FindNode(); err != nil {
		return "", "", fmt.Errorf("%w (node-llama-cpp needs Node.js 20 or later)", err)
	}
	out, err := exec.Command(node, "--version").Output()
	if err != nil {
		return "", "", fmt.Errorf("%s --version: %v", node, err)
	}
	var major int
	if _, err := fmt.Sscanf(strings.TrimSpace(string(out)), "v%d", &major); err != nil || major < 20 {
		return "", "", fmt.Errorf("node %s: node-llama-cpp %s needs Node.js 20 or later", strings.TrimSpace(string(out)), Version)
	}
	if abs, err = filepath.Abs(dir); err != nil {
		return "", "", err
	}
	if _, err := os.Stat(filepath.Join(abs, "llamacpp.mjs")); err != nil {
		return "", "", fmt.Errorf("%s: no llamacpp.mjs here: give the repository's tools/llamacpp folder", dir)
	}
	return node, abs, nil
}

// installed says whether dir/node_modules holds the pinned node-llama-cpp.
func installed(dir string) error {
	pkg, err := readfile.Read(filepath.Join(dir, "node_modules", "node-llama-cpp", "package.json"), readfile.Config)
	if err != nil {
		return errors.New("node-llama-cpp is not installed")
	}
	var v struct{ Version string }
	if json.Unmarshal(pkg, &v) != nil || v.Version != Version {
		return fmt.Errorf("node-llama-cpp %q is installed, package.json pins %s", v.Version, Version)
	}
	return nil
}

// TokenizeRequest is one string to tokenize.
type TokenizeRequest struct {
	Text string `json:"text"`
	// Special parses special-token text (such as <|begin_of_text|>) as the special token.
	Special bool `json:"special"`
	// AddSpecial adds the BOS/EOS the GGUF's tokenizer.ggml.add_bos_token/add_eos_token ask for.
	AddSpecial bool `json:"add_special"`
}

// GenerateRequest decodes greedily after Prompt.
type GenerateRequest struct {
	Prompt []int `json:"prompt"`
	// Tokens is how many new tokens to decode (no EOS stop).
	Tokens int `json:"tokens"`
	// Probabilities asks for the next-token distribution each new token was chosen from.
	Probabilities bool `json:"probabilities"`
}

// ScoreRequest evaluates sequences teacher-forced: the greedy next token after every prefix.
type ScoreRequest struct {
	Sequences [][]int `json:"sequences"`
	// Probabilities asks for the full next-token distributions as well.
	Probabilities bool `json:"probabilities"`
}

// BenchRequest times greedy decoding of all Prompts at once (one llama.cpp sequence each).
type BenchRequest struct {
	Prompts   [][]int `json:"prompts"`
	NewTokens int     `json:"new_tokens"`
	Runs      int     `json:"runs"`
}

// Request is one run of the script: the model, then whichever of the parts are set.
type Request struct {
	// Model is the GGUF file.
	Model string `json:"model"`
	// Threads is llama.cpp's thread count (1 when 0: with more on a small or busy machine, llama.cpp's spinning
	// threads and node's driving thread stall each other; measured 18 s against 4 s for 32 tokens of a tiny model).
	Threads int `json:"threads,omitempty"`
	// ContextSize is the context length for Generate and Score (the model's, at most 2048, when 0).
	ContextSize int `json:"context_size,omitempty"`
	// KVCacheType is the type of llama.cpp's key/value cache for Generate and Score: "F32", or "F16" (llama.cpp's
	// default, also when empty), whose rounding moves probabilities by up to about 1e-3.
	KVCacheType string `json:"kv_cache_type,omitempty"`
	// VocabOnly loads the tokenizer without the weights (enough for Tokenize).
	VocabOnly bool              `json:"vocab_only,omitempty"`
	Tokenize  []TokenizeRequest `json:"tokenize,omitempty"`
	Generate  *GenerateRequest  `json:"generate,omitempty"`
	Score     *ScoreRequest     `json:"score,omitempty"`
	Bench     *BenchRequest     `json:"bench,omitempty"`
}

// ModelInfo is what llama.cpp read from the GGUF.
type ModelInfo struct {
	Vocab int `json:"vocab"`
	// VocabType is llama.cpp's kind of vocabulary: "bpe" (GGUF's gpt2), "spm" (GGUF's llama), ...
	VocabType        string `json:"vocab_type"`
	BOS              *int   `json:"bos"`
	EOS              *int   `json:"eos"`
	EOT              *int   `json:"eot"`
	AddBOS           bool   `json:"add_bos"`
	AddEOS           bool   `json:"add_eos"`
	TrainContextSize int    `json:"train_context_size"`
}

// Generated is a GenerateRequest's result.
type Generated struct {
	Tokens []int `json:"tokens"`
	// Probabilities[i][id] is the probability of id as token i (when asked for).
	Probabilities [][]float64 `json:"probabilities"`
}

// Scored is one ScoreRequest sequence's result: at each position, the greedy next token and its probability.
type Scored struct {
	Top           []int       `json:"top"`
	TopProb       []float64   `json:"top_prob"`
	Probabilities [][]float64 `json:"probabilities"`
}

// BenchRun is one timed run of a BenchRequest.
type BenchRun struct {
	// PrefillSeconds runs until every row has its first token; DecodeSeconds from there to the last token.
	PrefillSeconds float64 `json:"prefill_seconds"`
	DecodeSeconds  float64 `json:"decode_seconds"`
	Tokens         [][]int `json:"tokens"`
}

// BenchResult is a BenchRequest's result.
type BenchResult struct {
	Threads   int        `json:"threads"`
	Sequences int        `json:"sequences"`
	Runs      []BenchRun `json:"runs"`
}

// Info names the llama.cpp build that ran.
type Info struct {
	Package    string `json:"package"`
	Build      string `json:"build"`
	SystemInfo string `json:"system_info"`
}

// Result is the script's answer to a Request.
type Result struct {
	LlamaCpp Info         `json:"llama_cpp"`
	Model    ModelInfo    `json:"model"`
	Tokenize [][]int      `json:"tokenize"`
	Generate *Generated   `json:"generate"`
	Score    []Scored     `json:"score"`
	Bench    *BenchResult `json:"bench"`
}

// Run sends req to the script in a new node process and returns its result; an error carries the script's
// message (llama.cpp's, when it refuses the file).
func (t *Tool) Run(ctx context.Context, req Request) (*Result, error) {
	var res Result
	if err := t.run(ctx, []*Request{&req}, false, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// RunAll sends the requests to one node process, which answers them in turn with one llama.cpp (each model
// loaded, run and disposed of before the next): what a check of several GGUF files pays once for node and
// llama.cpp. An error is the first request's that failed, as Run's.
func (t *Tool) RunAll(ctx context.Context, reqs []Request) ([]*Result, error) {
	ptrs := make([]*Request, len(reqs))
	for i := range reqs {
		ptrs[i] = &reqs[i]
	}
	var out struct{ Results []*Result }
	if err := t.run(ctx, ptrs, true, &out); err != nil {
		return nil, err
	}
	if len(out.Results) != len(reqs) {
		return nil, fmt.Errorf("llama.cpp (node-llama-cpp %s): %d results for %d requests", Version, len(out.Results), len(reqs))
	}
	return out.Results, nil
}

// run sends the requests (one, or several as {"requests": [...]} when many) and decodes the answer into out.
func (t *Tool) run(ctx context.Context, reqs []*Request, many bool, out any) error {
	for _, req := range reqs {
		abs, err := filepath.Abs(req.Model) // the script runs in t.Dir
		if err != nil {
			return err
		}
		req.Model = abs
	}
	var body any = reqs[0]
	if many {
		body = map[string]any{"requests": reqs}
	}
	in, err := json.Marshal(body)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, t.Node, filepath.Join(t.Dir, "llamacpp.mjs"))
	cmd.Dir = t.Dir
	cmd.Stdin = bytes.NewReader(in)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		msg := strings.TrimSpace(stderr.String())
		if i := strings.LastIndex(msg, "llamacpp: "); i >= 0 {
			msg = msg[i+len("llamacpp: "):]
		}
		if msg == "" {
			msg = err.Error()
		}
		return fmt.Errorf("llama.cpp (node-llama-cpp %s): %s", Version, firstLine(msg))
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		return fmt.Errorf("llama.cpp (node-llama-cpp %s): its output is not the expected JSON: %v", Version, err)
	}
	return nil
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
