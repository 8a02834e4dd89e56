package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/gomlx/compute"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/llamacpp"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/runner"
	"github.com/memfit/memfit/tokenizer"
)

// GeneratePassage is the text the generation benchmark's prompts are cut from (the opening of Jane Austen's
// Pride and Prejudice, 1813, public domain): every row a different window of its tokens, BOS first.
const GeneratePassage = `It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want
of a wife. However little known the feelings or views of such a man may be on his first entering a neighbourhood,
this truth is so well fixed in the minds of the surrounding families, that he is considered the rightful property of
some one or other of their daughters. "My dear Mr. Bennet," said his lady to him one day, "have you heard that
Netherfield Park is let at last?" Mr. Bennet replied that he had not. "But it is," returned she; "for Mrs. Long has
just been here, and she told me all about it." Mr. Bennet made no answer. "Do you not want to know who has taken
it?" cried his wife impatiently. "You want to tell me, and I have no objection to hearing it." This was invitation
enough.`

// GeneratePrompts cuts rows prompts of length tokens (BOS, then a window of the passage's tokens, each row's
// window starting 7 tokens after the previous one's) from GeneratePassage.
func GeneratePrompts(tok *tokenizer.Tokenizer, rows, length int) ([][]int, error) {
	ids := tok.Encode(strings.Join(strings.Fields(GeneratePassage), " "), false)
	bos, ok := tok.BOS()
	need := 7*(rows-1) + length - 1
	if !ok || length < 2 || len(ids) < need {
		return nil, fmt.Errorf("the passage has %d tokens, %d rows of %d need %d and a BOS token", len(ids), rows, length, need)
	}
	out := make([][]int, rows)
	for r := range out {
		out[r] = append([]int{bos}, ids[7*r:7*r+length-1]...)
	}
	return out, nil
}

// GenerateSpec is what the reference process reads (bench/pytorch/generate_compare.py).
type GenerateSpec struct {
	Model     string  `json:"model"`
	Prompts   [][]int `json:"prompts"`
	NewTokens int     `json:"new_tokens"`
	Runs      int     `json:"runs"`
}

// generateSide is one side's result for one batch size.
type generateSide struct {
	Tokens         [][]int           `json:"tokens"`
	PrefillSeconds []float64         `json:"prefill_seconds"`
	DecodeSeconds  []float64         `json:"decode_seconds"`
	TokensPerSec   float64           `json:"decode_tokens_per_second"`
	Threads        int               `json:"threads,omitempty"`
	Versions       map[string]string `json:"versions,omitempty"`
}

// GenerateCase is one batch size of the comparison.
type GenerateCase struct {
	Batch int `json:"batch"`
	// Memfit and PyTorch are decode tokens/s: rows x (new tokens - 1) / the median decode time of the runs.
	Memfit  float64 `json:"memfit_decode_tokens_per_second"`
	PyTorch float64 `json:"pytorch_decode_tokens_per_second"`
	// Ratio is Memfit / PyTorch.
	Ratio float64 `json:"ratio"`
	// MemfitPrefill and PyTorchPrefill are the median prefill times (seconds).
	MemfitPrefill  float64 `json:"memfit_prefill_seconds"`
	PyTorchPrefill float64 `json:"pytorch_prefill_seconds"`
	// MemfitCompile is the seconds memfit spent compiling its two programs (before the timed runs).
	MemfitCompile float64 `json:"memfit_compile_seconds"`
	// SameTokens says whether both sides generated the same greedy tokens; FirstDifference where they did not.
	SameTokens      bool   `json:"same_tokens"`
	FirstDifference string `json:"first_difference,omitempty"`
	MemfitSide      *generateSide
	PyTorchSide     *generateSide
	// LlamaCpp is llama.cpp's decode tokens/s on the model's GGUF (0 when not measured), LlamaCppRatio
	// Memfit / LlamaCpp, LlamaCppPrefill its median prefill time; LlamaCppSameTokens and
	// LlamaCppFirstDifference compare its greedy tokens with memfit's.
	LlamaCpp                float64 `json:"llamacpp_decode_tokens_per_second,omitempty"`
	LlamaCppRatio           float64 `json:"memfit_over_llamacpp,omitempty"`
	LlamaCppPrefill         float64 `json:"llamacpp_prefill_seconds,omitempty"`
	LlamaCppSameTokens      bool    `json:"llamacpp_same_tokens,omitempty"`
	LlamaCppFirstDifference string  `json:"llamacpp_first_difference,omitempty"`
	LlamaCppSide            *generateSide
}

// GenerateRun is the whole comparison.
type GenerateRun struct {
	Machine   CPUMachine        `json:"machine"`
	Backend   string            `json:"backend"`
	Kernels   string            `json:"memfit_matmul_kernels"`
	Command   string            `json:"command"`
	Model     string            `json:"model"`
	PromptLen int               `json:"prompt_tokens"`
	NewTokens int               `json:"new_tokens"`
	Runs      int               `json:"runs"`
	PyTorch   map[string]string `json:"pytorch_versions"`
	Threads   int               `json:"pytorch_threads"`
	// LlamaCpp describes the llama.cpp side (package, build, CPU features, threads, GGUF file and type) when it ran.
	LlamaCpp map[string]string `json:"llamacpp,omitempty"`
	Cases    []GenerateCase    `json:"cases"`
	Problems []string          `json:"problems,omitempty"`
	Seconds  float64           `json:"seconds"`
}

// GenerateCompareOptions configure RunGenerateCompare.
type GenerateCompareOptions struct {
	// Model is the LLaMA folder both sides load; Gen decodes it on memfit's side (the generator of that model).
	Model     string
	Gen       *runner.Generator
	Tok       *tokenizer.Tokenizer
	Batches   []int
	PromptLen int
	NewTokens int
	Runs      int
	// Python is the reference's command (interpreter and script); WorkDir receives the specs, OutDir the
	// processes' JSON and logs (OutDir/processes).
	Python          []string
	WorkDir, OutDir string
	Backend         compute.Backend
	Log             io.Writer
	// LlamaCpp, when set, decodes the same prompts with llama.cpp (node-llama-cpp, its own process) on GGUF, the
	// model exported as GGUF (GGUFType names its tensor type), with LlamaCppThreads threads (every core but one when 0).
	LlamaCpp        *llamacpp.Tool
	GGUF, GGUFType  string
	LlamaCppThreads int
}

// RunGenerateCompare decodes greedily with memfit (in this process: a warm-up run that compiles, then Runs
// timed runs) and with the plain-PyTorch reference (its own process), for each batch size, on the same prompts,
// and compares decode throughput and the generated tokens.
func RunGenerateCompare(o GenerateCompareOptions) (GenerateRun, error) {
	start := time.Now()
	run := GenerateRun{Machine: MachineInfo(), Backend: o.Backend.Name(), Kernels: orDash(engine.SIMD()), Model: o.Model,
		PromptLen: o.PromptLen, NewTokens: o.NewTokens, Runs: o.Runs}
	procDir := filepath.Join(o.OutDir, "processes")
	if err := os.MkdirAll(procDir, 0o755); err != nil {
		return run, err
	}
	for _, b := range o.Batches {
		prompts, err := GeneratePrompts(o.Tok, b, o.PromptLen)
		if err != nil {
			return run, err
		}
		fmt.Fprintf(o.Log, "batch %d: memfit\n", b)
		c := GenerateCase{Batch: b}
		mem, compile, err := memfitGenerate(o, prompts)
		if err != nil {
			return run, err
		}
		c.MemfitSide, c.MemfitCompile = mem, compile
		fmt.Fprintf(o.Log, "batch %d: PyTorch\n", b)
		spec := filepath.Join(o.WorkDir, fmt.Sprintf("generate-b%d.json", b))
		sb, _ := json.Marshal(GenerateSpec{Model: o.Model, Prompts: prompts, NewTokens: o.NewTokens, Runs: o.Runs})
		if err := writeFileAtomic(spec, sb); err != nil {
			return run, err
		}
		c.Memfit, c.MemfitPrefill = mem.TokensPerSec, median(mem.PrefillSeconds)
		py, err := pytorchGenerate(o.Python, spec, procDir, fmt.Sprintf("generate-b%d-pytorch", b))
		if err != nil {
			run.Problems = append(run.Problems, err.Error())
		} else {
			c.PyTorchSide = py
			run.PyTorch, run.Threads = py.Versions, py.Threads
			c.PyTorch = py.TokensPerSec
			if c.PyTorch > 0 {
				c.Ratio = c.Memfit / c.PyTorch
			}
			c.PyTorchPrefill = median(py.PrefillSeconds)
			c.SameTokens, c.FirstDifference = sameTokens(mem.Tokens, py.Tokens, "PyTorch")
		}
		if o.LlamaCpp != nil {
			fmt.Fprintf(o.Log, "batch %d: llama.cpp\n", b)
			lc, info, err := llamaCppGenerate(o, prompts)
			if err != nil {
				run.Problems = append(run.Problems, err.Error())
			} else {
				run.LlamaCpp, c.LlamaCppSide = info, lc
				c.LlamaCpp, c.LlamaCppPrefill = lc.TokensPerSec, median(lc.PrefillSeconds)
				if c.LlamaCpp > 0 {
					c.LlamaCppRatio = c.Memfit / c.LlamaCpp
				}
				c.LlamaCppSameTokens, c.LlamaCppFirstDifference = sameTokens(mem.Tokens, lc.Tokens, "llama.cpp")
			}
		}
		run.Cases = append(run.Cases, c)
	}
	run.Seconds = time.Since(start).Seconds()
	return run, nil
}

// memfitGenerate times memfit's generator on prompts: one warm-up run (compiling the programs), then o.Runs.
func memfitGenerate(o GenerateCompareOptions, prompts [][]int) (*generateSide, float64, error) {
	g := runner.GenerateOptions{MaxNewTokens: o.NewTokens}
	_, st, err := o.Gen.Generate(prompts, g)
	if err != nil {
		return nil, 0, err
	}
	side := &generateSide{}
	for range o.Runs {
		out, st, err := o.Gen.Generate(prompts, g)
		if err != nil {
			return nil, 0, err
		}
		side.PrefillSeconds = append(side.PrefillSeconds, st.PrefillSeconds)
		side.DecodeSeconds = append(side.DecodeSeconds, st.DecodeSeconds)
		side.Tokens = side.Tokens[:0]
		for _, r := range out {
			side.Tokens = append(side.Tokens, r.Tokens)
		}
	}
	if m := median(side.DecodeSeconds); m > 0 {
		side.TokensPerSec = float64(len(prompts)*(o.NewTokens-1)) / m
	}
	return side, st.CompileSeconds, nil
}

func pytorchGenerate(python []string, spec, dir, name string) (*generateSide, error) {
	var s generateSide
	p, err := runJSONProcess(python, []string{"--spec", spec}, nil, dir, name, &s)
	if err != nil {
		return nil, err
	}
	if len(s.DecodeSeconds) == 0 || s.TokensPerSec <= 0 {
		return nil, fmt.Errorf("%s: no decode timings", p.out)
	}
	return &s, nil
}

// llamaCppGenerate times llama.cpp's greedy decoding of prompts on o.GGUF (one warm-up run, then o.Runs), one
// llama.cpp sequence per row, all rows decoded together.
func llamaCppGenerate(o GenerateCompareOptions, prompts [][]int) (*generateSide, map[string]string, error) {
	threads := o.LlamaCppThreads
	if threads <= 0 {
		// Every core but one: node-llama-cpp drives each decode step from node's own thread, and llama.cpp's
		// spinning workers on every core starve it (the quiet 2-core VM: 89 tokens/s at one row with 2 threads,
		// 1,787 with 1; docs/benchmarks/generate-cpu-llamacpp).
		threads = max(1, runtime.NumCPU()-1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	res, err := o.LlamaCpp.Run(ctx, llamacpp.Request{Model: o.GGUF, Threads: threads,
		Bench: &llamacpp.BenchRequest{Prompts: prompts, NewTokens: o.NewTokens, Runs: o.Runs}})
	if err != nil {
		return nil, nil, err
	}
	if res.Bench == nil || len(res.Bench.Runs) == 0 {
		return nil, nil, fmt.Errorf("llama.cpp: no decode timings")
	}
	side := &generateSide{Threads: threads}
	for _, r := range res.Bench.Runs {
		side.PrefillSeconds = append(side.PrefillSeconds, r.PrefillSeconds)
		side.DecodeSeconds = append(side.DecodeSeconds, r.DecodeSeconds)
		side.Tokens = r.Tokens
	}
	if m := median(side.DecodeSeconds); m > 0 {
		side.TokensPerSec = float64(len(prompts)*(o.NewTokens-1)) / m
	}
	info := map[string]string{"package": "node-llama-cpp " + llamacpp.Version + " (" + res.LlamaCpp.Build + " llama.cpp binaries)",
		"cpu": res.LlamaCpp.SystemInfo, "threads": fmt.Sprint(threads), "gguf": filepath.Base(o.GGUF), "gguf_type": o.GGUFType}
	return side, info, nil
}

func sameOrDiff(same bool, diff string) string {
	if same {
		return "yes"
	}
	return "no: " + diff
}

func sameTokens(a, b [][]int, other string) (bool, string) {
	if len(a) != len(b) {
		return false, fmt.Sprintf("%d rows against %d", len(a), len(b))
	}
	for r := range a {
		if !slices.Equal(a[r], b[r]) {
			for i := 0; i < min(len(a[r]), len(b[r])); i++ {
				if a[r][i] != b[r][i] {
					return false, fmt.Sprintf("row %d, new token %d: memfit %d, %s %d", r, i+1, a[r][i], other, b[r][i])
				}
			}
			return false, fmt.Sprintf("row %d: %d tokens against %d", r, len(a[r]), len(b[r]))
		}
	}
	return true, ""
}

// WriteGenerateRun prints the comparison's table.
func WriteGenerateRun(w io.Writer, r GenerateRun) error {
	p := func(format string, a ...any) { fmt.Fprintf(w, format+"\n", a...) }
	against := "plain PyTorch"
	if r.LlamaCpp != nil {
		against += " and llama.cpp"
	}
	p("greedy decoding with a key/value cache, memfit against %s (%.0f s)", against, r.Seconds)
	p("machine: %s, %d cores, %s memory, %s", r.Machine.CPU, r.Machine.Cores, memory.FormatBytesPrec(r.Machine.MemBytes, 1), r.Machine.OS)
	p("command: %s", r.Command)
	p("model: %s; prompts of %d tokens (windows of a passage, BOS first), %d new tokens each, greedy, no EOS stop; %d timed runs after a warm-up, median", r.Model, r.PromptLen, r.NewTokens, r.Runs)
	p("%s", wrap(fmt.Sprintf("memfit: %s backend, matmul kernels %s; PyTorch: torch %s, Python %s, %d threads; BLAS: %s", r.Backend, r.Kernels,
		r.PyTorch["torch"], r.PyTorch["python"], r.Threads, r.PyTorch["blas"]), 118, "  "))
	if n := r.PyTorch["notes"]; n != "" {
		p("%s", wrap("PyTorch notes: "+n, 118, "  "))
	}
	lc := r.LlamaCpp != nil
	if lc {
		p("%s", wrap(fmt.Sprintf("llama.cpp: %s, %s threads, GGUF %s (%s); CPU: %s", r.LlamaCpp["package"], r.LlamaCpp["threads"],
			r.LlamaCpp["gguf"], r.LlamaCpp["gguf_type"], r.LlamaCpp["cpu"]), 118, "  "))
	}
	p("")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "batch\tmemfit decode\tPyTorch decode\t"
	if lc {
		head += "llama.cpp decode\t"
	}
	head += "memfit / PyTorch\t"
	if lc {
		head += "memfit / llama.cpp\t"
	}
	head += "memfit prefill\tPyTorch prefill\t"
	if lc {
		head += "llama.cpp prefill\t"
	}
	fmt.Fprintln(tw, head+"memfit compile\tsame tokens\t")
	for _, c := range r.Cases {
		same := sameOrDiff(c.SameTokens, c.FirstDifference)
		if lc {
			same = "PyTorch " + same + ", llama.cpp " + sameOrDiff(c.LlamaCppSameTokens, c.LlamaCppFirstDifference)
		}
		row := fmt.Sprintf("%d\t%.1f tokens/s\t%.1f tokens/s\t", c.Batch, c.Memfit, c.PyTorch)
		if lc {
			row += fmt.Sprintf("%.1f tokens/s\t", c.LlamaCpp)
		}
		row += fmt.Sprintf("%.2fx\t", c.Ratio)
		if lc {
			row += fmt.Sprintf("%.2fx\t", c.LlamaCppRatio)
		}
		row += fmt.Sprintf("%.1f ms\t%.1f ms\t", 1000*c.MemfitPrefill, 1000*c.PyTorchPrefill)
		if lc {
			row += fmt.Sprintf("%.1f ms\t", 1000*c.LlamaCppPrefill)
		}
		fmt.Fprintf(tw, "%s%.2f s\t%s\t\n", row, c.MemfitCompile, same)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	p("")
	p("decode tokens/s: rows x (new tokens - 1) / the median time of the decode steps (the prefill makes the first token)")
	if r.LlamaCpp != nil {
		p("%s", wrap("llama.cpp: node-llama-cpp in its own node process, one context sequence per row (its batching decodes "+
			"the rows together, one llama_decode per step), greedy sampler; prefill = until every row has its first token, "+
			"decode = from there to the last token, measured in the node process", 118, "  "))
	}
	for _, pr := range r.Problems {
		p("PROBLEM: %s", pr)
	}
	return nil
}
