package finetune

import (
	"fmt"
	"path/filepath"
	"slices"

	"github.com/memfit/memfit/gguf"
	"github.com/memfit/memfit/gguf/llamagguf"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/tokenizer"
)

// IsGGUF reports whether path names a GGUF file (by its .gguf extension).
func IsGGUF(path string) bool { return llamagguf.IsGGUF(path) }

// ggufFamily returns model's family when it exports GGUF files; any other model is an error saying so.
func ggufFamily(model Model) (Family, error) {
	fam, ok := FamilyOf(model)
	if !ok || fam.GGUF == nil {
		var archs []Family
		for _, f := range Families() {
			if f.GGUF != nil {
				archs = append(archs, f)
			}
		}
		return Family{}, fmt.Errorf("GGUF export is for the families llama.cpp and Ollama run (%s); %s", familyTitles(archs), familyTitle(model))
	}
	return fam, nil
}

// CheckGGUF returns nil when model can be exported as a GGUF file (its family writes GGUF, and the model is one
// llama.cpp runs: a causal LM), or the error saying why not, before any work is done.
func CheckGGUF(model Model) error {
	fam, err := ggufFamily(model)
	if err != nil {
		return err
	}
	_, _, err = fam.GGUF(model, nil, llamagguf.Options{})
	return err
}

// ExportGGUF writes params (a merged model's, by Hugging Face name: Trainer.Merged, MergedParams) of the causal
// LM model with the tokenizer tok (nil: none, token ids only) to path as a GGUF file, atomically, in the names
// and layouts its family gives (Family.GGUF).
func ExportGGUF(path string, model Model, params models.Params, tok *tokenizer.Tokenizer, o llamagguf.Options) error {
	fam, err := ggufFamily(model)
	if err != nil {
		return err
	}
	if tok != nil {
		tm, ok := model.(models.TextModel)
		if !ok {
			return fmt.Errorf("GGUF export: model %T takes no text", model)
		}
		if o.Vocab, err = tok.GGUFVocab(tm.TextSpec().VocabSize); err != nil {
			return err
		}
	}
	meta, ts, err := fam.GGUF(model, params, o)
	if err != nil {
		return err
	}
	infos := make([]gguf.TensorInfo, len(ts))
	for i, t := range ts {
		infos[i] = t.Info
	}
	size, err := gguf.FileSize(meta, infos) // the whole file: metadata and vocabulary too, not only the tensors
	if err != nil {
		return err
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

// LoadGGUF loads a model from a GGUF file in the model options opts, by the family that reads its
// general.architecture (Family.LoadGGUF: tensors dequantised to float32).
func LoadGGUF(path string, opts ModelOptions) (Model, Family, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, Family{}, err
	}
	arch, _, err := f.String("general.architecture")
	modelType := llamagguf.ModelType(f)
	f.Close()
	if err != nil {
		return nil, Family{}, fmt.Errorf("%s: %w", path, err)
	}
	// A file memfit wrote names its family (a Mistral is written as llama.cpp's llama); others go by architecture.
	fam, ok := FamilyByName(modelType)
	if !ok || fam.LoadGGUF == nil || !slices.Contains(fam.GGUFArchs, arch) {
		fam, ok = FamilyOfGGUFArch(arch)
	}
	if !ok {
		var archs []string
		for _, f := range Families() {
			for _, a := range f.GGUFArchs {
				if !slices.Contains(archs, a) {
					archs = append(archs, a)
				}
			}
		}
		return nil, Family{}, fmt.Errorf("%s: general.architecture is %q: memfit reads GGUF files of the architectures %v", path, arch, archs)
	}
	m, err := fam.LoadGGUF(path, opts)
	if err != nil {
		return nil, fam, err
	}
	// Refused at load as a model folder's weights are (models.LoadCheckpoint): a NaN weight otherwise gave NaN
	// logits with exit 0 (logits), or stopped generate and eval only at their first non-finite logit.
	if err := models.CheckAllFinite(m.Params()); err != nil {
		return nil, fam, fmt.Errorf("%s: %w", path, err)
	}
	return m, fam, nil
}
