package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/memfit/memfit/bench"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/gguf"
	"github.com/memfit/memfit/gguf/llamagguf"
	"github.com/memfit/memfit/llamacpp"
	"github.com/memfit/memfit/runner"
	"github.com/memfit/memfit/tokenizer"
)

func newBenchGenerateCommand(opts *Options) *cobra.Command {
	var model, out, python, script, workDir, invocation, llamaCppDir, ggufFile string
	var llamaCppThreads int
	var batches []int
	var promptLen, newTokens, runs int
	var overwrite bool
	cmd := &cobra.Command{
		Use:   "generate [--model DIR] [--out DIR]",
		Short: "Greedy decoding tokens/s with the key/value cache, memfit against a plain-PyTorch loop and llama.cpp on the same model",
		Long: `Decodes greedily with memfit's generator (finetune generate's: prefill and decode programs, the key/value
cache on the backend) and with a plain-PyTorch loop with a key/value cache (bench/pytorch/generate_compare.py:
cpu_compare.py's LLaMA, each layer's keys and values concatenated onto its cache as transformers' dynamic cache
does) on the same checkpoint and prompts, for each --batch-sizes: memfit in this process, PyTorch in its own,
one after the other. Prompts are windows of --prompt-len tokens of a fixed passage; every row gets
--new-tokens (no EOS stop). Reports decode tokens/s of both and their ratio, prefill times, memfit's compile
time, and whether both generated the same tokens. Writes DIR/generate.txt, DIR/generate.json and the reference's
JSON and log under DIR/processes.

A third column is llama.cpp's decode tokens/s on the same model exported as GGUF (f32, written to the work
folder; or --gguf FILE): node-llama-cpp's prebuilt CPU llama.cpp in its own node process (tools/llamacpp,
installed with npm: see docs/gguf.md), one sequence per row decoded together, --llama-cpp-threads threads (every
core but one by default: node's own thread drives the decoding, and llama.cpp's workers on every core starve it). Without node/npm, or with --llama-cpp "", that column is left out (with a note).`,
		Example: `  GOTOOLCHAIN=go1.27.3 GOEXPERIMENT=simd go build -o bin/finetune ./cmd/finetune && bin/finetune bench generate --out docs/benchmarks/generate-cpu`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case len(batches) == 0:
				return usagef("--batch-sizes: give at least one")
			case promptLen < 2:
				return usagef("--prompt-len %d: give at least 2 tokens", promptLen)
			case newTokens < 2:
				return usagef("--new-tokens %d: give at least 2 (the first comes from the prefill)", newTokens)
			case runs < 1:
				return usagef("--runs %d: give at least 1", runs)
			case llamaCppThreads < 0:
				return usagef("--llama-cpp-threads %d: give 0 (every core but one) or more", llamaCppThreads)
			}
			if ggufFile != "" {
				f, err := gguf.Open(ggufFile)
				if err != nil {
					return usagef("--gguf %s: %v", ggufFile, err)
				}
				f.Close()
			}
			for _, b := range batches {
				if b < 1 || b > 256 {
					return usagef("--batch-sizes %d: give 1 to 256 rows", b)
				}
			}
			var err error
			if model, _, err = hubModel(cmd, "--model", model, hubFiles); err != nil {
				return err
			}
			reads := inputs{}.add("--model", model, modelReads...).add("--script", script).add("--gguf", ggufFile)
			if err := outputFolder("--out", out, []string{"generate.txt", "generate.json", "processes/"}, reads.add("--work-dir", workDir), overwrite, true); err != nil {
				return err
			}
			if workDir != "" { // the scratch folder: rewritten by every run, never over an input
				if err := outputFolder("--work-dir", workDir, []string{"generate-b*.json"}, reads, true, false); err != nil {
					return err
				}
			}
			m, _, tok, err := loadForEval(model, "", "")
			if err != nil {
				return err
			}
			l, ok := causalLM(m)
			if !ok {
				return fmt.Errorf("%s: the generation benchmark needs a causal LM", model)
			}
			// llama.cpp's tooling is looked up before anything is written: without node/npm its column is left out
			// with a note, any other problem with it is an error.
			var tool *llamacpp.Tool
			var notes []string
			if llamaCppDir != "" {
				if tool, err = llamacpp.Install(llamaCppDir, cmd.ErrOrStderr()); errors.Is(err, llamacpp.ErrNoNode) {
					notes = append(notes, fmt.Sprintf("llama.cpp column left out: %v", err))
				} else if err != nil {
					return err
				}
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			if workDir == "" {
				d, err := os.MkdirTemp("", "memfit-bench-generate-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(d)
				workDir = d
			}
			backend, err := opts.NewBackend()
			if err != nil {
				return err
			}
			defer backend.Finalize()
			if invocation == "" {
				invocation = "finetune " + strings.Join(os.Args[1:], " ")
			}
			abs, _ := filepath.Abs(model)
			o := bench.GenerateCompareOptions{Model: abs, Gen: runner.NewGenerator(backend, l, nil, nil), Tok: tok,
				Batches: batches, PromptLen: promptLen, NewTokens: newTokens, Runs: runs, Python: []string{python, script},
				WorkDir: workDir, OutDir: out, Backend: backend, Log: cmd.ErrOrStderr(), LlamaCppThreads: llamaCppThreads}
			if tool != nil {
				o.LlamaCpp = tool
				if o.GGUF, o.GGUFType, err = benchGGUF(ggufFile, m, tok, workDir, cmd.ErrOrStderr()); err != nil {
					return err
				}
			}
			run, err := bench.RunGenerateCompare(o)
			if err != nil {
				return err
			}
			run.Problems = append(run.Problems, notes...)
			run.Command = invocation
			return writeBenchRun(cmd, filepath.Join(out, "generate"), run, run.Problems, func(w io.Writer) error { return bench.WriteGenerateRun(w, run) })
		},
	}
	f := cmd.Flags()
	f.StringVar(&model, "model", "pretrained/llama-tiny", "LLaMA causal-LM folder both sides load")
	f.IntSliceVar(&batches, "batch-sizes", []int{1, 8}, "rows decoded together, one comparison each")
	f.IntVar(&promptLen, "prompt-len", 32, "tokens per prompt (BOS included)")
	f.IntVar(&newTokens, "new-tokens", 128, "tokens generated per row")
	f.IntVar(&runs, "runs", 3, "timed runs per side (after one warm-up run); the median is reported")
	f.StringVar(&out, "out", "bench-generate-out", "folder for generate.txt, generate.json and processes/")
	f.BoolVar(&overwrite, "overwrite", false, "replace the results of an earlier run in --out")
	f.StringVar(&python, "python", "/usr/bin/python3", "Python with torch (Debian's python3-torch)")
	f.StringVar(&script, "script", "bench/pytorch/generate_compare.py", "the reference script")
	f.StringVar(&workDir, "work-dir", "", "folder for the specs and the GGUF export (default: a temporary one, removed after)")
	f.StringVar(&llamaCppDir, "llama-cpp", filepath.Join("tools", "llamacpp"), `the node-llama-cpp tooling (installed with npm into memfit's tool cache on first use, unless npm install ran in it); "" leaves llama.cpp out`)
	f.StringVar(&ggufFile, "gguf", "", "the model as GGUF for llama.cpp (default: --model exported as f32 GGUF to the work folder)")
	f.IntVar(&llamaCppThreads, "llama-cpp-threads", 0, "llama.cpp's threads (0: every core but one, leaving node's driving thread a core)")
	f.StringVar(&invocation, "invocation", "", "the command line to print")
	_ = f.MarkHidden("invocation")
	return cmd
}

// benchGGUF returns the GGUF llama.cpp runs and its type: file when given, else the model exported as f32 GGUF
// into workDir.
func benchGGUF(file string, model finetune.Model, tok *tokenizer.Tokenizer, workDir string, log io.Writer) (string, string, error) {
	if file != "" {
		return file, "as given", nil
	}
	path := filepath.Join(workDir, "model-f32.gguf")
	fmt.Fprintf(log, "exporting the model as GGUF (f32) for llama.cpp: %s\n", path)
	if err := finetune.ExportGGUF(path, model, model.Params(), tok, llamagguf.Options{Type: gguf.F32, Name: "bench"}); err != nil {
		return "", "", err
	}
	return path, "f32", nil
}
