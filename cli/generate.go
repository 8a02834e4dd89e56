package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/memfit/memfit/generate"
	"github.com/memfit/memfit/models/hfconfig"
	"github.com/memfit/memfit/runner"
)

// generateResult is one prompt's line of `generate --json`.
type generateResult struct {
	Index        int    `json:"index"`
	Prompt       string `json:"prompt"`
	Completion   string `json:"completion"`
	PromptTokens int    `json:"prompt_tokens"`
	NewTokens    int    `json:"new_tokens"`
	Stop         string `json:"stop"`
}

func newGenerateCommand(opts *Options) *cobra.Command {
	var model, adapterDir, tok, prompt, promptsFile, system, template string
	var chat, asJSON, ignoreEOS bool
	var stops []string
	var batch int
	o := runner.GenerateOptions{MaxNewTokens: 256, TopP: 1, Seed: 1}
	cmd := &cobra.Command{
		Use:   "generate --model DIR [--adapter DIR] (--prompt TEXT | --prompts FILE.jsonl) [--chat]",
		Short: "Generate text with a LLaMA causal LM (and an adapter): key/value cache, greedy or sampled, streamed",
		Long: `Continues prompts with a LLaMA causal LM, optionally with a PEFT adapter: one prefill program for the
prompts, then one decode program per token with the key/value cache kept on the backend. Decoding is greedy
(--temperature 0, the default) or sampled (--temperature, --top-k, --top-p; deterministic for a --seed, each
prompt drawing from its own stream keyed by its index in the input, so --batch-size changes nothing), and stops
at the tokenizer's EOS (and the chat template's end-of-turn token), at a --stop string, or after
--max-new-tokens. --chat formats a --prompt as a user's turn with the chat template (--chat-template: auto is
the model's own Jinja chat template from its tokenizer_config.json or chat_template.jinja, rendered as
transformers' apply_chat_template renders it, else the Alpaca prompt memfit's instruction fine-tuning trains
on; model, llama3, chatml and alpaca choose).

--prompts reads a JSONL file, one object per line: {"prompt": TEXT}, {"instruction": TEXT, "input": TEXT} (the
Alpaca prompt, as training formats it) or {"messages": [{"role": "user", "content": TEXT}, ...]}, with an
optional "system"; lines longer than 16 MiB and anything after a line's JSON object are refused. Prompts are
decoded --batch-size at a time, left-padded to a common length. A conversation under the Alpaca template keeps
its system message (in place of the preamble) and earlier turns (as the input): see docs/generate.md.

A single prompt is streamed to stdout as it is produced; several are printed as each batch ends, or with --json
as one JSON object per prompt. Token counts, prefill time and decode tokens/s go to stderr.

--model also takes a LLaMA GGUF file (finetune export --format gguf, or llama.cpp's converter for the same
features): its tensors are dequantised to float32 and its tokenizer rebuilt from the file's metadata.`,
		Example: `  finetune generate --model pretrained/llama-tiny --prompt "It was a bright cold day" --max-new-tokens 40
  finetune generate --model pretrained/llama-tiny --adapter pretrained/llama-tiny-alpaca --chat \
      --prompt "Give three tips for staying healthy."
  finetune generate --model M --prompts prompts.jsonl --temperature 0.7 --top-p 0.9 --seed 3 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case model == "":
				return usagef("--model is required (a LLaMA causal-LM folder)")
			case (prompt == "") == (promptsFile == ""):
				return usagef("give --prompt TEXT or --prompts FILE.jsonl")
			case math.IsNaN(o.Temperature) || math.IsInf(o.Temperature, 0) || o.Temperature < 0:
				return usagef("--temperature %g: give 0 (greedy) or a finite positive number", o.Temperature)
			case o.TopK < 0:
				return usagef("--top-k %d: give 0 (no limit) or more", o.TopK)
			case math.IsNaN(o.TopP) || o.TopP <= 0 || o.TopP > 1:
				return usagef("--top-p %g: give a probability in (0, 1]", o.TopP)
			}
			for _, s := range stops {
				if s == "" {
					return usagef("--stop \"\": a stop string needs at least one character")
				}
			}
			var prompts []generate.Prompt
			if prompt != "" {
				prompts = []generate.Prompt{{Prompt: prompt}}
			} else {
				var err error
				if prompts, err = generate.ReadPrompts(promptsFile); err != nil {
					return err
				}
			}
			// --system is the system message of every prompt that has none of its own.
			for i, p := range prompts {
				if system == "" || p.System != "" || p.HasSystemMessage() {
					continue
				}
				if p.Prompt != "" && !chat {
					return usagef("--system needs --chat: a plain prompt is continued as it is, with no place for a system message")
				}
				prompts[i].System = system
			}
			if _, _, err := hubFolders(cmd, &model, &adapterDir); err != nil {
				return err
			}
			m, set, t, err := loadForEval(model, adapterDir, tok)
			if err != nil {
				return err
			}
			l, ok := causalLM(m)
			if !ok {
				return fmt.Errorf("%s: generate needs a causal LM (a ...ForCausalLM model)", model)
			}
			spec := l.TextSpec()
			f := generate.Formatter{Tok: t, Chat: chat, Template: template}
			uses := false
			for _, p := range prompts {
				uses = uses || f.UsesTemplate(p)
			}
			if cmd.Flags().Changed("chat-template") && !uses {
				return usagef("--chat-template %s renders prompts with --chat (or the conversations of --prompts): a plain prompt is continued as it is; add --chat", template)
			}
			needed := uses || template != generate.TemplateAuto
			note := ""
			if needed {
				c, err := f.Resolve()
				if err != nil {
					if template != generate.TemplateAuto {
						err = fmt.Errorf("--chat-template %s: %w", template, err)
					}
					return usageError{err}
				}
				note = c.Note
				if note == "" && c.Template != nil && t.Config.ChatTemplateUnused != "" {
					note = "the chat template is " + c.String()
				}
			}
			ids := make([][]int, len(prompts))
			texts := make([]string, len(prompts))
			for i, p := range prompts {
				if ids[i], texts[i], err = f.Encode(p); err != nil {
					if p.Line > 0 {
						return fmt.Errorf("%s:%d: %w", promptsFile, p.Line, err)
					}
					return fmt.Errorf("prompt %d: %w", i+1, err)
				}
			}
			if note != "" { // said once every prompt is known to render
				fmt.Fprintf(cmd.ErrOrStderr(), "note: %s\n", note)
			}
			backend, err := opts.NewBackend()
			if err != nil {
				return err
			}
			defer backend.Finalize()
			gen := runner.NewGenerator(backend, l, nil, set)
			o.Pad = max(spec.PadID, 0)
			o.MaxPositions = spec.MaxPositions
			o.StopStrings = stops
			o.Detokenize = func(ids []int) string { return t.Decode(ids, true) }
			// Every id of eos_token_id (a list in Llama-3.x Instruct configs), and of generation_config.json's, which
			// transformers' generate stops at too (Llama-3 Instruct lists <|eot_id|> only there).
			eos := slices.Clone(spec.EOSIDs)
			if st, err := os.Stat(model); err == nil && st.IsDir() {
				more, err := hfconfig.GenerationEOS(model, spec.VocabSize)
				if err != nil {
					return err
				}
				eos = append(eos, more...)
			}
			stopTokens := f.StopTokens(eos...)
			if !ignoreEOS {
				o.EOS = stopTokens
			}
			stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
			stream := len(prompts) == 1 && !asJSON
			var total runner.GenerateStats
			enc := json.NewEncoder(stdout)
			enc.SetEscapeHTML(false)
			for start := 0; start < len(prompts); start += batch {
				end := min(len(prompts), start+batch)
				var streamer *generate.Streamer
				o.OnToken = nil
				if stream {
					streamer = &generate.Streamer{W: stdout, Decode: o.Detokenize, Stops: stops, StopTokens: o.EOS}
					o.OnToken = func(_, token int) { streamer.Add(token) }
				}
				// Each prompt's random stream is keyed by its index in the input, not its row in the batch:
				// the completions do not depend on --batch-size.
				o.Indices = o.Indices[:0]
				for k := start; k < end; k++ {
					o.Indices = append(o.Indices, k)
				}
				out, st, err := gen.Generate(ids[start:end], o)
				if err != nil {
					return err
				}
				addStats(&total, st)
				for i, g := range out {
					k := start + i
					switch {
					case streamer != nil:
						if err := streamer.Finish(g.Text); err != nil {
							return err
						}
						fmt.Fprintln(stdout)
					case asJSON:
						if err := enc.Encode(generateResult{Index: k, Prompt: texts[k], Completion: g.Text,
							PromptTokens: len(ids[k]), NewTokens: len(g.Tokens), Stop: g.Stop}); err != nil {
							return err
						}
					default:
						fmt.Fprintf(stdout, "=== prompt %d\n%s\n=== completion %d (%d tokens, stop: %s)\n%s\n\n",
							k+1, strings.TrimRight(texts[k], "\n"), k+1, len(g.Tokens), g.Stop, g.Text)
					}
				}
			}
			return writeGenerateStats(stderr, total, min(batch, len(prompts)))
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&model, "model", "", "LLaMA causal-LM folder (config.json, safetensors, tokenizer), Hub id ORG/NAME[@REVISION], or GGUF file")
	fl.StringVar(&adapterDir, "adapter", "", "PEFT adapter folder (or Hub id) to apply")
	fl.StringVar(&tok, "tokenizer", "", "tokenizer (default: the model folder)")
	fl.StringVar(&prompt, "prompt", "", "the prompt text")
	fl.StringVar(&promptsFile, "prompts", "", "JSONL file of prompts (prompt, instruction/input or messages per line)")
	fl.BoolVar(&chat, "chat", false, "format --prompt (and prompt lines) as a user's turn with the chat template")
	fl.StringVar(&template, "chat-template", generate.TemplateAuto, "chat template: "+strings.Join(generate.Templates, ", "))
	fl.StringVar(&system, "system", "", "system message for chat formatting")
	fl.IntVar(&o.MaxNewTokens, "max-new-tokens", o.MaxNewTokens, "most tokens generated per prompt")
	fl.Float64Var(&o.Temperature, "temperature", 0, "sampling temperature (0: greedy)")
	fl.IntVar(&o.TopK, "top-k", 0, "sample among the K most likely tokens only (0: all)")
	fl.Float64Var(&o.TopP, "top-p", o.TopP, "sample among the most likely tokens whose probabilities sum to P (1: all)")
	fl.Uint64Var(&o.Seed, "seed", o.Seed, "random seed of sampling (each prompt draws from its own generator)")
	fl.StringArrayVar(&stops, "stop", nil, "stop string (repeatable): a reply ends before it")
	fl.IntVar(&batch, "batch-size", 8, "prompts decoded together")
	fl.BoolVar(&ignoreEOS, "ignore-eos", false, "do not stop at EOS (benchmarks: every prompt gets --max-new-tokens)")
	fl.BoolVar(&asJSON, "json", false, "print one JSON object per prompt")
	return cmd
}

func addStats(t *runner.GenerateStats, s runner.GenerateStats) {
	t.Prompts += s.Prompts
	t.PromptTokens += s.PromptTokens
	t.NewTokens += s.NewTokens
	t.CompileSeconds += s.CompileSeconds
	t.PrefillSeconds += s.PrefillSeconds
	t.DecodeSteps += s.DecodeSteps
	t.DecodeSeconds += s.DecodeSeconds
	t.DecodeTokens += s.DecodeTokens
}

func writeGenerateStats(w io.Writer, s runner.GenerateStats, batch int) error {
	prefill := 0.0
	if s.PrefillSeconds > 0 {
		prefill = float64(s.PromptTokens) / s.PrefillSeconds
	}
	_, err := fmt.Fprintf(w, "generate: %d prompts (%d tokens), %d new tokens; prefill %.0f ms (%.0f prompt tokens/s); decode %d steps of up to %d rows, %.1f tokens/s; compile %.1f s\n",
		s.Prompts, s.PromptTokens, s.NewTokens, 1000*s.PrefillSeconds, prefill, s.DecodeSteps, batch, s.DecodeTokensPerSecond(), s.CompileSeconds)
	return err
}
