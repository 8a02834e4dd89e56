// Package ollama writes the Ollama Modelfile of a GGUF export: FROM the file, the TEMPLATE that renders
// conversations as the model's Jinja chat template does, in Ollama's Go-template syntax (Translate: Llama-3,
// ChatML, Gemma, Phi-3, Mistral, each checked against the model's template on probe conversations; or
// memfit's Alpaca prompt), and PARAMETER stop for the format's end-of-turn markers. It also gives the Jinja chat template of the Alpaca prompt, for a GGUF whose
// tokenizer has none (llama.cpp renders tokenizer.chat_template).
package ollama

import (
	"fmt"
	"strconv"
	"strings"
)

// Chat formats (tokenizer.ChatLlama3, tokenizer.ChatML, and memfit's Alpaca prompt).
const (
	Llama3 = "llama3"
	ChatML = "chatml"
	Alpaca = "alpaca"
)

// Templates are the Ollama TEMPLATE bodies and stop strings of the chat formats memfit renders. Each renders a
// conversation as memfit's generate does (tokenizer.FormatChat, tokenizer.AlpacaConversation); Ollama adds BOS
// itself when the GGUF says add_bos_token.
var templates = map[string]struct {
	body  string
	stops []string
}{
	Llama3: {body: `{{- range $i, $_ := .Messages }}{{ $last := eq (len (slice $.Messages $i)) 1 }}<|start_header_id|>{{ .Role }}<|end_header_id|>

{{ .Content }}<|eot_id|>{{ if and $last (ne .Role "assistant") }}<|start_header_id|>assistant<|end_header_id|>

{{ end }}{{- end }}`, stops: []string{"<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"}},
	ChatML: {body: `{{- range $i, $_ := .Messages }}{{ $last := eq (len (slice $.Messages $i)) 1 }}<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ if and $last (ne .Role "assistant") }}<|im_start|>assistant
{{ end }}{{- end }}`, stops: []string{"<|im_end|>", "<|im_start|>"}},
	Alpaca: {body: `{{ if .System }}{{ .System }}{{ else }}` + alpacaPreamble + `{{ end }}

### Instruction:
{{ .Prompt }}

### Response:
{{ .Response }}`, stops: []string{"### Instruction:"}},
}

const (
	alpacaPreamble      = "Below is an instruction that describes a task. Write a response that appropriately completes the request."
	alpacaInputPreamble = "Below is an instruction that describes a task, paired with an input that provides further context. " +
		"Write a response that appropriately completes the request."
)

// AlpacaJinja is the Alpaca prompt as a Hugging Face (Jinja) chat template, rendering a conversation as
// tokenizer.AlpacaConversation does: a first system message replaces the preamble, the last message is the
// instruction and the turns between are the input ("User: ..." / "Assistant: ..." lines).
const AlpacaJinja = `{%- set ns = namespace(system='', context='') -%}
{%- for m in messages -%}
{%- if loop.first and m['role'] == 'system' -%}{%- set ns.system = m['content'] | trim -%}
{%- elif not loop.last -%}{%- set ns.context = ns.context + ('\n' if ns.context else '') + ('User: ' if m['role'] == 'user' else 'Assistant: ') + m['content'] -%}
{%- endif -%}
{%- endfor -%}
{%- if ns.context | trim -%}
{{- (ns.system if ns.system else '` + alpacaInputPreamble + `') + '\n\n### Instruction:\n' + messages[-1]['content'] + '\n\n### Input:\n' + ns.context + '\n\n### Response:\n' -}}
{%- else -%}
{{- (ns.system if ns.system else '` + alpacaPreamble + `') + '\n\n### Instruction:\n' + messages[-1]['content'] + '\n\n### Response:\n' -}}
{%- endif -%}`

// AlpacaTranslation is the Ollama TEMPLATE of memfit's Alpaca prompt (AlpacaJinja's), for a GGUF whose
// tokenizer had no chat template.
func AlpacaTranslation() Translation {
	t := templates[Alpaca]
	return Translation{Format: Alpaca, Body: t.body, Stops: t.stops}
}

// ModelfileOf returns the Modelfile of the GGUF file ggufName for a translated template (Translate); t.Body ""
// writes none, saying why. stops are more end-of-turn strings (the tokenizer's EOS token).
func ModelfileOf(ggufName, name string, t Translation, stops []string, why string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Ollama Modelfile written by memfit's finetune export: ollama create NAME -f %s\n", name)
	fmt.Fprintf(&b, "FROM ./%s\n", ggufName)
	if t.Body != "" {
		fmt.Fprintf(&b, "TEMPLATE \"\"\"%s\"\"\"\n", t.Body)
	} else {
		fmt.Fprintf(&b, "# No TEMPLATE: %s, so Ollama sends prompts as they are.\n# Write a TEMPLATE by hand for chat use.\n", why)
	}
	seen := map[string]bool{}
	for _, s := range append(append([]string(nil), t.Stops...), stops...) {
		if s == "" || seen[s] {
			continue
		}
		seen[s] = true
		fmt.Fprintf(&b, "PARAMETER stop %s\n", strconv.Quote(s))
	}
	return b.String()
}

// Modelfile returns the Modelfile name of the GGUF file ggufName (a name in the Modelfile's folder) for the chat
// format (Llama3, ChatML, Alpaca; "" or another when the tokenizer's template is none memfit can translate:
// the Modelfile then says so in a comment and has no TEMPLATE, and ok is false). stops are more end-of-turn
// strings (the tokenizer's EOS token); why, when there is no TEMPLATE, says why in the comment.
func Modelfile(ggufName, name, format string, stops []string, why string) (text string, ok bool) {
	t, ok := templates[format]
	if !ok && why == "" {
		why = "the tokenizer's chat template is not one memfit translates (Llama-3, ChatML, Gemma, Phi-3, Mistral, Alpaca)"
	}
	return ModelfileOf(ggufName, name, Translation{Format: format, Body: t.body, Stops: t.stops}, stops, why), ok
}
