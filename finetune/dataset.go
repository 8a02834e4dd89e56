package finetune

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/loss"
	"github.com/memfit/memfit/models/llama"
	"github.com/memfit/memfit/tokenizer"
)

// Data formats of RunSpec.Data.
const (
	FormatSafetensors = "safetensors" // one tensor per model input (LoadExamples)
	FormatImages      = "images"      // folder tree <class>/<image>
	FormatImageTar    = "image-tar"   // tar (or .tar.gz) of such a tree; DataOptions.Split picks a subfolder
	FormatIDX         = "idx"         // "images.idx[.gz],labels.idx[.gz]" (MNIST, Fashion-MNIST)
	FormatAlpaca      = "alpaca"      // JSONL instructions, prompt tokens masked in the loss
	FormatText        = "text"        // plain text for causal LM, packed into SeqLen blocks
	FormatGLUE        = "glue"        // GLUE task folder root (../shared/data/glue layout); DataOptions.Task
)

// DataOptions say how to read a run's data (RunSpec.Data).
type DataOptions struct {
	// Format is one of the Format constants; empty picks it from the path: .safetensors, .jsonl (alpaca), .txt
	// (text), .tar/.tar.gz/.tgz (image-tar), a comma-separated pair (idx), a folder (images).
	Format string `json:"format,omitempty"`
	// Split is the subfolder of an image folder or tar (e.g. "train") or the GLUE split (train, dev; default train).
	Split string `json:"split,omitempty"`
	// Task is the GLUE task (cola, sst2, mrpc, stsb, rte).
	Task string `json:"task,omitempty"`
	// Tokenizer is the tokenizer of text data (default: the model folder).
	Tokenizer string `json:"tokenizer,omitempty"`
	// SeqLen is the tokens per text example (default 256).
	SeqLen int `json:"seq_len,omitempty"`
	// Augment turns on random crops (padding of 1/8 of the image side) and horizontal flips for images.
	Augment bool `json:"augment,omitempty"`
}

// DataFormat returns the format that opts (or the path) selects.
func DataFormat(path string, opts DataOptions) string {
	if opts.Format != "" {
		return opts.Format
	}
	low := strings.ToLower(path)
	switch {
	case strings.HasSuffix(low, ".safetensors"):
		return FormatSafetensors
	case strings.HasSuffix(low, ".jsonl"):
		return FormatAlpaca
	case strings.HasSuffix(low, ".txt"):
		return FormatText
	case strings.HasSuffix(low, ".tar") || strings.HasSuffix(low, ".tar.gz") || strings.HasSuffix(low, ".tgz"):
		return FormatImageTar
	case strings.Contains(path, ","):
		return FormatIDX
	}
	return FormatImages
}

// hasTarget reports whether a label sequence has a token the loss learns from: one not ignored, after the first
// position (a causal LM predicts token t from the tokens before it).
func hasTarget(labels []int) bool {
	for i, l := range labels {
		if i > 0 && l != loss.IgnoreIndex {
			return true
		}
	}
	return false
}

// checkDataPath names what is wrong with the data path before any format-specific reading: a missing file or
// folder (each file of an IDX pair), or a file whose name does not say its format (an image folder is the
// default only for folders).
func checkDataPath(path, format string, opts DataOptions) error {
	paths := []string{path}
	if format == FormatIDX {
		paths = strings.Split(path, ",")
	}
	for _, p := range paths {
		info, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("data %s: no such file or folder", p)
		}
		if format == FormatImages && opts.Format == "" && !info.IsDir() {
			return fmt.Errorf("data %s: cannot tell its format from the name (.safetensors, .jsonl, .txt, .tar, .tar.gz, a folder, or an IDX pair \"images,labels\"): pass --data-format", p)
		}
	}
	return nil
}

// OpenData opens the run's training data for model as a resumable iterator of batches of batchSize with the
// given seed.
func OpenData(path string, opts DataOptions, model Model, modelDir string, batchSize int, seed uint64) (Iterator, error) {
	format := DataFormat(path, opts)
	if err := checkDataPath(path, format, opts); err != nil {
		return nil, err
	}
	switch format {
	case FormatSafetensors:
		ex, err := LoadExamples(path, model)
		if err != nil {
			return nil, err
		}
		return NewLoader(ex, batchSize, seed, true)
	case FormatImages, FormatImageTar, FormatIDX:
		v, ok := model.(ViT)
		if !ok {
			return nil, fmt.Errorf("image data (%s) needs a ViT model", format)
		}
		src, err := OpenImages(path, format, opts.Split)
		if err != nil {
			return nil, err
		}
		if v.Config.Architecture == "" || len(v.Config.Labels) != len(src.Classes()) {
			return nil, fmt.Errorf("%s has %d classes %v but the model classifies %d: give the model a head of %d (finetune init --from %s --num-labels %d --out NEW)",
				path, len(src.Classes()), src.Classes(), len(v.Config.Labels), len(src.Classes()), modelDir, len(src.Classes()))
		}
		pre, err := data.ReadPreprocessor(modelDir, v.Config.NumChannels, v.Config.ImageSize)
		if err != nil {
			return nil, err
		}
		var aug *data.Augment
		if opts.Augment {
			aug = &data.Augment{Pad: max(1, v.Config.ImageSize/8), Flip: true}
		}
		return wrapImages(data.NewImageLoader(src, pre, aug, batchSize, seed, true))
	case FormatAlpaca, FormatText, FormatGLUE:
		ex, notes, err := textExamples(path, opts, model, modelDir)
		if err != nil {
			return nil, err
		}
		l, err := NewLoader(ex, batchSize, seed, true)
		if err != nil {
			return nil, err
		}
		l.Notes = notes
		return l, nil
	}
	return nil, fmt.Errorf("unknown data format %q (%s, %s, %s, %s, %s, %s, %s)", format, FormatSafetensors, FormatImages,
		FormatImageTar, FormatIDX, FormatAlpaca, FormatText, FormatGLUE)
}

// OpenImages opens an image dataset in one of the image formats.
func OpenImages(path, format, split string) (data.ImageSource, error) {
	switch format {
	case FormatImages:
		return data.ImageFolder(filepath.Join(path, split))
	case FormatImageTar:
		return data.ImageTar(path, split)
	case FormatIDX:
		parts := strings.Split(path, ",")
		if len(parts) != 2 {
			return nil, fmt.Errorf("IDX data is \"images.idx[.gz],labels.idx[.gz]\", got %q", path)
		}
		imgs, err := data.ReadIDX(parts[0])
		if err != nil {
			return nil, err
		}
		labs, err := data.ReadIDX(parts[1])
		if err != nil {
			return nil, err
		}
		return data.IDXImages(imgs, labs, nil)
	}
	return nil, fmt.Errorf("%q is not an image format", format)
}

type imageIterator struct{ l *data.ImageLoader }

func wrapImages(l *data.ImageLoader, err error) (Iterator, error) {
	if err != nil {
		return nil, err
	}
	return imageIterator{l}, nil
}

func (it imageIterator) Next() (Batch, error) {
	b, err := it.l.Next()
	return Batch(b), err
}
func (it imageIterator) State() (json.RawMessage, error) { return it.l.State() }
func (it imageIterator) Restore(s json.RawMessage) error { return it.l.Restore(s) }

// TextExamples reads text data for a LLaMA model: Alpaca instructions (prompt masked), plain text packed into
// SeqLen blocks, or a GLUE task's split as sequence classification (pairs joined by the tokenizer's pair
// template, or by a newline when it has none).
//
// Alpaca examples longer than the sequence length are cut on the right; one whose response is cut off entirely
// (no target token left) would only add steps with no gradient, so it is left out. OpenData's loader reports
// both counts in its Notes.
func TextExamples(path string, opts DataOptions, model Model, modelDir string) (Examples, error) {
	ex, _, err := textExamples(path, opts, model, modelDir)
	return ex, err
}

func textExamples(path string, opts DataOptions, model Model, modelDir string) (Examples, []string, error) {
	var notes []string
	ex, err := textExamplesNoted(path, opts, model, modelDir, func(format string, args ...any) { notes = append(notes, fmt.Sprintf(format, args...)) })
	return ex, notes, err
}

func textExamplesNoted(path string, opts DataOptions, model Model, modelDir string, note func(string, ...any)) (Examples, error) {
	m, ok := model.(Llama)
	if !ok {
		return nil, fmt.Errorf("text data needs a LLaMA model")
	}
	tokPath := opts.Tokenizer
	if tokPath == "" {
		tokPath = modelDir
	}
	tok, err := tokenizer.Load(tokPath)
	if err != nil {
		return nil, fmt.Errorf("text data needs a tokenizer (--tokenizer, or tokenizer files in the model folder): %w", err)
	}
	if err := CheckTokenizer(tok, model); err != nil {
		return nil, fmt.Errorf("%s: %w", tokPath, err)
	}
	seqLen := opts.SeqLen
	if seqLen == 0 {
		seqLen = min(256, m.Config.MaxPositionEmbeddings)
	}
	if seqLen < 2 || seqLen > m.Config.MaxPositionEmbeddings {
		return nil, fmt.Errorf("--seq-len %d: a sequence needs 2 to %d tokens (the model's max_position_embeddings)", seqLen, m.Config.MaxPositionEmbeddings)
	}
	pad, ok := tok.Pad()
	if !ok {
		pad = max(0, m.Config.PadTokenID)
	}
	classifier := m.Config.Architecture == llama.ArchClassification
	format := DataFormat(path, opts)
	if classifier != (format == FormatGLUE) {
		return nil, fmt.Errorf("%s data needs a %s model, the model is %s", format,
			map[bool]string{true: "sequence-classification", false: "causal-LM"}[format == FormatGLUE], m.Config.Architecture)
	}
	var ex map[string]*tensors.Tensor
	switch format {
	case FormatAlpaca:
		rows, err := data.ReadInstructions(path)
		if err != nil {
			return nil, err
		}
		var ids, labels [][]int
		cut, empty := 0, 0
		for _, r := range rows {
			id, label := tok.FormatInstruction(r.Instruction, r.Input, r.Output)
			if len(id) > seqLen {
				cut++
				id, label = tokenizer.Truncate(id, seqLen, tokenizer.Right), tokenizer.Truncate(label, seqLen, tokenizer.Right)
			}
			if !hasTarget(label) {
				empty++
				continue
			}
			ids, labels = append(ids, id), append(labels, label)
		}
		if cut > 0 {
			note("%s: %d of %d examples are longer than --seq-len %d and were cut on the right", path, cut, len(rows), seqLen)
		}
		if empty > 0 {
			note("%s: %d examples have no response token within --seq-len %d and were left out (they would train nothing)", path, empty, seqLen)
		}
		if len(ids) == 0 {
			return nil, fmt.Errorf("%s: no example keeps a response token within --seq-len %d: raise it", path, seqLen)
		}
		ex, err = data.TokenExamples(ids, labels, seqLen, pad)
		if err != nil {
			return nil, err
		}
	case FormatText:
		raw, err := data.ReadTextFile(path)
		if err != nil {
			return nil, err
		}
		eos, _ := tok.EOS()
		var seqs [][]int
		for _, d := range data.Documents(raw) {
			seqs = append(seqs, tok.Encode(d, false))
		}
		blocks := data.Pack(seqs, eos, seqLen)
		if len(blocks) == 0 {
			return nil, fmt.Errorf("%s has fewer than %d tokens", path, seqLen)
		}
		if ex, err = data.TokenExamples(blocks, nil, seqLen, pad); err != nil {
			return nil, err
		}
	case FormatGLUE:
		split := opts.Split
		if split == "" {
			split = "train"
		}
		info, err := data.GLUETask(opts.Task)
		if err != nil {
			return nil, err
		}
		want := len(info.Classes)
		if info.Regression {
			want = 1
		}
		if len(m.Config.Labels) != want {
			return nil, fmt.Errorf("GLUE %s has %d labels but the model has %d", opts.Task, want, len(m.Config.Labels))
		}
		if m.Config.PadTokenID != pad {
			return nil, fmt.Errorf("the model's pad_token_id %d differs from the tokenizer's padding id %d: the classifier would pool the wrong token", m.Config.PadTokenID, pad)
		}
		rows, err := data.ReadGLUE(path, opts.Task, split)
		if err != nil {
			return nil, err
		}
		ids, classes := make([][]int, len(rows)), make([]int, len(rows))
		var scores []float32
		for i, r := range rows {
			ids[i] = GLUEIDs(tok, r)
			ids[i] = tokenizer.Truncate(ids[i], seqLen, tokenizer.Right)
			classes[i] = r.Label
			if info.Regression {
				scores = append(scores, float32(r.Score))
			}
		}
		if ex, err = data.ClassExamples(ids, classes, scores, seqLen, pad); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("%q is not a text format", format)
	}
	return Examples(ex), nil
}

// GLUEIDs encodes a GLUE example for sequence classification: r.TokenIDs(tok) (one sentence, or a pair with
// the tokenizer's pair template).
func GLUEIDs(tok *tokenizer.Tokenizer, r data.GLUEExample) []int { return r.TokenIDs(tok) }

// absData makes the data path absolute (both parts of an IDX pair).
func absData(path string) string {
	parts := strings.Split(path, ",")
	for i, p := range parts {
		if a, err := filepath.Abs(p); err == nil {
			parts[i] = a
		}
	}
	return strings.Join(parts, ",")
}
