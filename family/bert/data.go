package bert

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/loss"
	"github.com/memfit/memfit/models/encoder"
	"github.com/memfit/memfit/tokenizer"
)

// DefaultSeqLen is an encoder's sequence length when none is given: 128 tokens, the paper's (and run_glue's).
const DefaultSeqLen = 128

// openData opens text data for an encoder: a GLUE task (sequence classification) or plain text (masked-LM
// pretraining, dynamically masked).
func openData(src finetune.DataSource) (finetune.Iterator, error) {
	m, ok := src.Model.(Encoder)
	if !ok {
		return nil, fmt.Errorf("%s data: the model is not an encoder", src.Format)
	}
	tok, _, err := finetune.LoadTextTokenizer(src.Options, src.ModelDir, m)
	if err != nil {
		return nil, err
	}
	switch src.Format {
	case finetune.FormatGLUE:
		ex, err := GLUEExamples(src.Path, src.Options, m, tok)
		if err != nil {
			return nil, err
		}
		return finetune.NewLoader(finetune.Examples(ex), src.BatchSize, src.Seed, true)
	case finetune.FormatText:
		return OpenMaskedLM(src.Path, src.Options, m, tok, src.BatchSize, src.Seed)
	}
	return nil, fmt.Errorf("%s data cannot train an encoder: give a GLUE task folder (--format glue --task ...) or text for masked-LM pretraining", src.Format)
}

// seqLen returns the sequence length of opts for m (DefaultSeqLen when none), checked against its positions.
func seqLen(opts finetune.DataOptions, m Encoder) (int, error) {
	n := opts.SeqLen
	if n == 0 {
		n = min(DefaultSeqLen, m.Config.MaxSequence())
	}
	if n < 3 || n > m.Config.MaxSequence() {
		return 0, fmt.Errorf("--seq-len %d: an encoder's sequence needs 3 to %d tokens (its max_position_embeddings %d)", n, m.Config.MaxSequence(), m.Config.MaxPositionEmbeddings)
	}
	return n, nil
}

// GLUEExamples reads a GLUE task's split (opts.Split, default train) from the GLUE data root at path as sequence
// classification examples for m: each sentence or pair encoded with the tokenizer's template and token type ids,
// truncated to the sequence length as transformers' run_glue does (truncation=True), padded with the model's
// pad id; labels are classes, or STS-B's scores for a one-label regression head.
func GLUEExamples(path string, opts finetune.DataOptions, m Encoder, tok *tokenizer.Tokenizer) (map[string]*tensors.Tensor, error) {
	c := m.Config
	if c.Head != encoder.HeadClassification {
		return nil, fmt.Errorf("GLUE data needs a sequence classifier; the model is %s (give it a head: finetune init --from MODEL --num-labels N)", c.Architecture)
	}
	info, err := data.GLUETask(opts.Task)
	if err != nil {
		return nil, err
	}
	want := len(info.Classes)
	if info.Regression {
		want = 1
	}
	if len(c.Labels) != want || info.Regression != c.Regression() {
		return nil, fmt.Errorf("GLUE %s has %d label(s)%s but the model has %d%s: give it a head of %d (finetune init --from MODEL --num-labels %d)",
			opts.Task, want, map[bool]string{true: " (regression)"}[info.Regression], len(c.Labels), map[bool]string{true: " (regression)"}[c.Regression()], want, want)
	}
	n, err := seqLen(opts, m)
	if err != nil {
		return nil, err
	}
	split := opts.Split
	if split == "" {
		split = "train"
	}
	rows, err := data.ReadGLUE(path, opts.Task, split)
	if err != nil {
		return nil, err
	}
	encs := make([]tokenizer.Encoding, len(rows))
	classes := make([]int, len(rows))
	var scores []float32
	for i, r := range rows {
		if info.Pair != (r.TextB != "") {
			return nil, fmt.Errorf("GLUE %s row %d has %s: the task takes %s", opts.Task, i+1,
				map[bool]string{true: "a sentence pair", false: "one sentence"}[r.TextB != ""], map[bool]string{true: "pairs", false: "single sentences"}[info.Pair])
		}
		encs[i] = r.Inputs(tok, n)
		classes[i] = r.Label
		if info.Regression {
			scores = append(scores, float32(r.Score))
		}
	}
	if info.Regression {
		classes = nil
	}
	return data.EncoderExamples(encs, classes, scores, n, padID(c, tok), m.TokenTypes())
}

// padID is the id input rows are padded with: the model's pad_token_id (RoBERTa counts positions from it), else
// the tokenizer's.
func padID(c encoder.Config, tok *tokenizer.Tokenizer) int {
	if c.PadTokenID >= 0 {
		return c.PadTokenID
	}
	if p, ok := tok.Pad(); ok {
		return p
	}
	return 0
}

// MaskProbability is the share of tokens a masked-LM batch predicts (BERT's and RoBERTa's 15%); of those, 80%
// are replaced by the mask token, 10% by a random token and 10% kept, as transformers'
// DataCollatorForLanguageModeling does.
const MaskProbability = 0.15

// OpenMaskedLM opens plain text (paragraphs as documents) for masked-LM pretraining of m: the documents are
// encoded without special tokens, concatenated with the separator between them and cut into rows of the sequence
// length, each row <s> ... </s> (BERT: [CLS] ... [SEP]) as RoBERTa's FULL-SENTENCES input; every batch is masked
// afresh (dynamic masking) from a generator seeded by (seed, batch index), so a resumed run masks the same way.
func OpenMaskedLM(path string, opts finetune.DataOptions, m Encoder, tok *tokenizer.Tokenizer, batchSize int, seed uint64) (finetune.Iterator, error) {
	if m.Config.Head != encoder.HeadMaskedLM {
		return nil, fmt.Errorf("text data trains a masked LM; the model is %s", m.Config.Architecture)
	}
	raw, err := data.ReadTextFile(path)
	if err != nil {
		return nil, err
	}
	n, err := seqLen(opts, m)
	if err != nil {
		return nil, err
	}
	rows, mask, err := MaskedLMRows(data.Documents(raw), tok, n, m)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	ex, err := MaskedLMExamples(rows, n, padID(m.Config, tok))
	if err != nil {
		return nil, err
	}
	l, err := finetune.NewLoader(ex, batchSize, seed, true)
	if err != nil {
		return nil, err
	}
	return NewMaskedLM(l, seed, mask, m.Config.VocabSize, SpecialIDs(tok)), nil
}

// MaskedLMRows encodes documents into masked-LM rows of length n: the documents' tokens, the separator between
// documents, cut into n-2 token pieces each wrapped in the tokenizer's single-text template (<s> ... </s>). It
// returns the mask token's id too.
func MaskedLMRows(docs []string, tok *tokenizer.Tokenizer, n int, m Encoder) (rows [][]int, mask int, err error) {
	mask = -1
	for _, name := range []string{"<mask>", "[MASK]"} {
		if id, ok := tok.TokenID(name); ok {
			mask = id
			break
		}
	}
	if mask < 0 || mask >= m.Config.VocabSize {
		return nil, 0, fmt.Errorf("the tokenizer has no mask token (<mask> or [MASK]) inside the model's vocabulary: masked-LM pretraining needs one")
	}
	wrap := tok.Encode("", true) // the template's specials around an empty text: <s> </s>, [CLS] [SEP]
	if len(wrap) != 2 {
		return nil, 0, fmt.Errorf("the tokenizer's template adds %d tokens to a text, not a start and an end token: it is not an encoder's tokenizer", len(wrap))
	}
	var seqs [][]int
	for _, d := range docs {
		seqs = append(seqs, tok.Encode(d, false))
	}
	blocks := data.Pack(seqs, wrap[1], n-2)
	if len(blocks) == 0 {
		return nil, 0, fmt.Errorf("the text has fewer than %d tokens", n-2)
	}
	rows = make([][]int, len(blocks))
	for i, b := range blocks {
		rows[i] = append(append([]int{wrap[0]}, b...), wrap[1])
	}
	return rows, mask, nil
}

// MaskedLMExamples turns masked-LM rows (MaskedLMRows) into input_ids and attention_mask [N, n], unmasked.
func MaskedLMExamples(rows [][]int, n, pad int) (finetune.Examples, error) {
	ex, err := data.TokenExamples(rows, nil, n, pad)
	if err != nil {
		return nil, err
	}
	delete(ex, "labels")
	return finetune.Examples(ex), nil
}

// NewMaskedLM returns an iterator over the loader's masked-LM rows that masks each batch afresh (Mask) with a
// generator seeded by (seed, batch index); its state is the loader's and the batch count, so a resumed run masks
// as the original would have.
func NewMaskedLM(loader *finetune.Loader, seed uint64, maskID, vocab int, special map[int]bool) finetune.Iterator {
	return &maskedLM{loader: loader, seed: seed, mask: maskID, vocab: vocab, special: special}
}

// SpecialIDs returns the ids of the tokenizer's special tokens (never masked).
func SpecialIDs(tok *tokenizer.Tokenizer) map[int]bool {
	out := map[int]bool{}
	for id := 0; id < tok.VocabSize(); id++ {
		if tok.IsSpecial(id) {
			out[id] = true
		}
	}
	return out
}

// maskedLM batches masked-LM rows, masking each batch afresh.
type maskedLM struct {
	loader  *finetune.Loader
	seed    uint64
	step    int
	mask    int
	vocab   int
	special map[int]bool
}

// Next returns the next batch with input_ids masked and labels holding the original ids at the masked
// positions (-100 elsewhere).
func (it *maskedLM) Next() (finetune.Batch, error) {
	b, err := it.loader.Next()
	if err != nil {
		return nil, err
	}
	r := rand.New(rand.NewPCG(it.seed, 0x6d6c6d0000000000|uint64(it.step)))
	it.step++
	masked, labels := Mask(b["input_ids"], b["attention_mask"], r, it.mask, it.vocab, it.special)
	b["input_ids"].FinalizeAll()
	b["input_ids"], b["labels"] = masked, labels
	return b, nil
}

// Mask returns input_ids [N, T] with about MaskProbability of the real (mask 1), non-special tokens chosen by r
// and replaced as BERT does (80% by maskID, 10% by a random id below vocab, 10% kept), and the labels: the
// original ids at the chosen positions, -100 elsewhere.
func Mask(ids, mask *tensors.Tensor, r *rand.Rand, maskID, vocab int, special map[int]bool) (masked, labels *tensors.Tensor) {
	dims := ids.Shape().Dimensions
	in := make([]int32, ids.Shape().Size())
	ids.MustConstFlatData(func(f any) { copy(in, f.([]int32)) })
	var real []int32
	mask.MustConstFlatData(func(f any) { real = append(real, f.([]int32)...) })
	lab := make([]int32, len(in))
	for i, id := range in {
		lab[i] = loss.IgnoreIndex
		if real[i] == 0 || special[int(id)] || r.Float64() >= MaskProbability {
			continue
		}
		lab[i] = id
		switch p := r.Float64(); {
		case p < 0.8:
			in[i] = int32(maskID)
		case p < 0.9:
			in[i] = int32(r.IntN(vocab))
		}
	}
	return tensors.FromFlatDataAndDimensions(in, dims...), tensors.FromFlatDataAndDimensions(lab, dims...)
}

type maskedLMState struct {
	Loader json.RawMessage `json:"loader"`
	Step   int             `json:"step"`
}

// State returns the loader's position and the number of batches masked.
func (it *maskedLM) State() (json.RawMessage, error) {
	l, err := it.loader.State()
	if err != nil {
		return nil, err
	}
	return json.Marshal(maskedLMState{Loader: l, Step: it.step})
}

// Restore moves to a saved position.
func (it *maskedLM) Restore(state json.RawMessage) error {
	var s maskedLMState
	if err := json.Unmarshal(state, &s); err != nil || s.Step < 0 {
		return fmt.Errorf("masked-LM data position: %v", err)
	}
	if err := it.loader.Restore(s.Loader); err != nil {
		return err
	}
	it.step = s.Step
	return nil
}
