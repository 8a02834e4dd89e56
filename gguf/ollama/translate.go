package ollama

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/template"

	"github.com/memfit/memfit/tokenizer"
)

// More chat formats that Translate recognises in a model's Jinja template.
const (
	Gemma   = "gemma"   // <start_of_turn>user\n...<end_of_turn>\n, the assistant's role written "model"
	Phi3    = "phi3"    // <|user|>\n...<|end|>\n
	Mistral = "mistral" // [INST] ... [/INST] reply </s>, as Mistral-7B-Instruct-v0.3 (its system message dropped)
)

func init() {
	templates[Gemma] = struct {
		body  string
		stops []string
	}{body: `{{- range $i, $_ := .Messages }}{{ $last := eq (len (slice $.Messages $i)) 1 }}<start_of_turn>{{ if eq .Role "assistant" }}model{{ else }}{{ .Role }}{{ end }}
{{ .Content }}<end_of_turn>
{{ if and $last (ne .Role "assistant") }}<start_of_turn>model
{{ end }}{{- end }}`, stops: []string{"<end_of_turn>", "<start_of_turn>"}}
	templates[Phi3] = struct {
		body  string
		stops []string
	}{body: `{{- range $i, $_ := .Messages }}{{ $last := eq (len (slice $.Messages $i)) 1 }}<|{{ .Role }}|>
{{ .Content }}<|end|>
{{ if and $last (ne .Role "assistant") }}<|assistant|>
{{ end }}{{- end }}`, stops: []string{"<|end|>", "<|user|>", "<|assistant|>"}}
	templates[Mistral] = struct {
		body  string
		stops []string
	}{body: `{{- range $i, $_ := .Messages }}{{ if eq .Role "user" }} [INST] {{ .Content }} [/INST]{{ else if eq .Role "assistant" }} {{ .Content }} </s>{{ end }}{{- end }}`,
		stops: []string{"[INST]", "[/INST]", "</s>"}}
}

// probes are the conversations Translate renders with both templates: a user turn, with a system message,
// multi-turn, multi-turn with a system message.
var probes = [][]tokenizer.Message{
	{{Role: "user", Content: "Hello there."}},
	{{Role: "system", Content: "You are terse."}, {Role: "user", Content: "Name a colour."}},
	{{Role: "user", Content: "Hi"}, {Role: "assistant", Content: "Hello."}, {Role: "user", Content: "Name a colour."}},
	{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi"}, {Role: "assistant", Content: "Hello."}, {Role: "user", Content: "Two plus two?"}},
}

// Translation is an Ollama TEMPLATE that renders as a model's Jinja chat template does.
type Translation struct {
	// Format names it (Llama3, ChatML, Gemma, Phi3, Mistral); Body is the Go template, Stops its end markers.
	Format string
	Body   string
	Stops  []string
}

// Translate finds the Ollama TEMPLATE (Go text/template) that renders conversations as the model's Jinja chat
// template does: render renders a conversation with the model's template and the generation prompt
// (chattemplate.Template.Render), bos is the tokenizer's BOS text (Ollama adds BOS itself, so a rendering's
// leading BOS is not the template's to write). Each known format (Llama-3, ChatML, with the model's default
// system message when it writes one, Gemma, Phi-3, Mistral) is rendered on a set of probe conversations with
// Go's text/template, as Ollama renders it, and taken only when every probe the model's template accepts comes
// out byte for byte the same. An error says why none does.
func Translate(render func([]tokenizer.Message, bool) (string, error), bos string) (Translation, error) {
	want := make([]*string, len(probes))
	accepted := 0
	for i, p := range probes {
		text, err := render(p, true)
		if err != nil {
			continue // the model's template refuses it (Gemma's system message)
		}
		if bos != "" {
			text = strings.TrimPrefix(text, bos)
		}
		want[i] = &text
		accepted++
	}
	if accepted == 0 {
		return Translation{}, errors.New("the tokenizer's chat template is not one memfit translates for Ollama: it renders none of memfit's probe conversations")
	}
	var candidates []Translation
	for _, f := range []string{Llama3, ChatML, Gemma, Phi3, Mistral} {
		candidates = append(candidates, Translation{Format: f, Body: templates[f].body, Stops: templates[f].stops})
	}
	if w := want[0]; w != nil && strings.HasPrefix(*w, "<|im_start|>system\n") {
		// ChatML with a default system message (Qwen2.5's "You are Qwen, created by Alibaba Cloud...")
		if end := strings.Index(*w, "<|im_end|>\n<|im_start|>user\n"); end > 0 {
			def := (*w)[len("<|im_start|>system\n"):end]
			candidates = append(candidates, Translation{Format: ChatML,
				Body:  `{{- if ne (index .Messages 0).Role "system" }}<|im_start|>system` + "\n" + `{{ ` + strconv.Quote(def) + ` }}<|im_end|>` + "\n" + `{{ end }}` + templates[ChatML].body,
				Stops: templates[ChatML].stops})
		}
	}
	for _, c := range candidates {
		tmpl, err := template.New(c.Format).Parse(c.Body)
		if err != nil {
			return Translation{}, fmt.Errorf("ollama %s template: %w", c.Format, err)
		}
		same := true
		for i, p := range probes {
			if want[i] == nil {
				continue
			}
			var b bytes.Buffer
			if err := tmpl.Execute(&b, map[string]any{"Messages": p}); err != nil || b.String() != *want[i] {
				same = false
				break
			}
		}
		if same {
			return c, nil
		}
	}
	return Translation{}, errors.New("the tokenizer's chat template is not one memfit translates for Ollama: it renders conversations as none of the templates memfit knows (Llama-3, ChatML, Gemma, Phi-3, Mistral)")
}
