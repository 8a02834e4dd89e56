package finetune

import (
	"fmt"
	"path/filepath"

	"github.com/memfit/memfit/gguf"
	"github.com/memfit/memfit/memory"

	"github.com/memfit/memfit/gguf/llamagguf"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/llama"
	"github.com/memfit/memfit/tokenizer"
)

// IsGGUF reports whether path names a GGUF file (by its .gguf extension).
func IsGGUF(path string) bool { return llamagguf.IsGGUF(path) }

// GGUFConfig returns the LLaMA config of a model GGUF export takes: a LLaMA causal LM. Any other model is an
// error saying so.
func GGUFConfig(model Model) (llama.Config, error) {
	l, ok := model.(Llama)
	if !ok {
		title := "model of another family"
		if fam, ok := FamilyOf(model); ok {
			title = fam.Title
		}
		return llama.Config{}, fmt.Errorf("GGUF export is for the LLaMA family (llama.cpp and Ollama run LLaMA causal LMs); this model is a %s", title)
	}
	if l.Config.Architecture != llama.ArchCausalLM {
		return llama.Config{}, fmt.Errorf("GGUF export is for LLaMA causal LMs (LlamaForCausalLM); this model is a %s", l.Config.Architecture)
	}
	return l.Config, nil
}

// ExportGGUF writes params (a merged model's, by Hugging Face name: Trainer.Merged, MergedParams) of the LLaMA
// causal LM model with the tokenizer tok (nil: none, token ids only) to path as a GGUF file, atomically.
func ExportGGUF(path string, model Model, params models.Params, tok *tokenizer.Tokenizer, o llamagguf.Options) error {
	cfg, err := GGUFConfig(model)
	if err != nil {
		return err
	}
	if tok != nil {
		if o.Vocab, err = tok.GGUFVocab(cfg.VocabSize); err != nil {
			return err
		}
	}
	meta, ts, err := llamagguf.Plan(cfg, params, o)
	if err != nil {
		return err
	}
	var size uint64
	for _, t := range ts {
		n, err := t.Info.Bytes()
		if err != nil {
			return err
		}
		size += n
	}
	if free, ok := memory.FreeDiskBytes(filepath.Dir(path)); ok && size > uint64(free) {
		return fmt.Errorf("the GGUF file takes %s (%s) but %s has %s free: free space, choose another --out, or a smaller --gguf-type",
			memory.FormatBytes(int64(size)), o.Type, filepath.Dir(path), memory.FormatBytes(free))
	}
	if err := gguf.WriteFile(path, meta, ts); err != nil {
		return err
	}
	if o.Progress != nil {
		o.Progress(len(ts), len(ts))
	}
	return nil
}

// LoadGGUF loads a LLaMA causal LM from a GGUF file (llamagguf.Read: tensors dequantised to float32) in the
// model options opts.
func LoadGGUF(path string, opts ModelOptions) (Model, error) {
	g, err := llamagguf.Read(path)
	if err != nil {
		return nil, err
	}
	m, err := llama.New(g.Config, g.Params, llamaOptions(opts))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return Llama{Model: m}, nil
}
