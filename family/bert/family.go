package bert

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/encoder"
	"github.com/memfit/memfit/tokenizer"
)

// The three model types register as three families over one implementation, in this order.
func init() {
	for _, mt := range encoder.ModelTypes {
		finetune.RegisterFamily(Family(mt))
	}
}

// titles are the families' names in messages.
var titles = map[string]string{encoder.TypeBERT: "BERT", encoder.TypeRoBERTa: "RoBERTa", encoder.TypeXLMRoBERTa: "XLM-RoBERTa"}

// Presets returns the preset names of model type mt (encoder.Presets of that type).
func Presets(mt string) []string {
	var out []string
	for name, c := range encoder.Presets {
		if c.ModelType == mt {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// Family returns the registration of model type mt ("bert", "roberta" or "xlm-roberta").
func Family(mt string) finetune.Family {
	of := func(m finetune.Model) bool {
		e, ok := m.(Encoder)
		return ok && e.Config.ModelType == mt
	}
	shaped := func(c encoder.Config, opts finetune.ModelOptions) finetune.Model {
		return Encoder{Model: &encoder.Model{Config: c, Options: opts.Model()}}
	}
	return finetune.Family{
		Name:  mt,
		Title: titles[mt],
		Of:    of,
		Load: func(dir string, opts finetune.ModelOptions) (finetune.Model, error) {
			m, err := encoder.Load(dir, opts.Model())
			if err != nil {
				return nil, err
			}
			return Encoder{Model: m}, nil
		},
		Rebuild: func(m finetune.Model, params models.Params, msNorm bool) (finetune.Model, error) {
			return m.(Encoder).rebuild(params, msNorm)
		},
		RandomParams: func(m finetune.Model, seed uint64) models.Params {
			return encoder.RandomParams(m.(Encoder).Config, seed)
		},
		Shaped: func(dir string, opts finetune.ModelOptions) (finetune.Model, error) {
			c, err := encoder.LoadConfig(dir)
			if err != nil {
				return nil, err
			}
			return shaped(c, opts), nil
		},
		// A preset is a sequence classifier (2 classes unless labels says otherwise): what encoders are
		// fine-tuned as, and the paper's GLUE setting.
		Preset: func(name string, labels int, opts finetune.ModelOptions) (finetune.Model, error) {
			if c, ok := encoder.Presets[name]; !ok || c.ModelType != mt {
				return nil, fmt.Errorf("unknown %s preset %q (have: %v)", titles[mt], name, Presets(mt))
			}
			if labels == 0 {
				labels = 2
			}
			c, err := encoder.Preset(name, labels)
			if err != nil {
				return nil, err
			}
			return shaped(c, opts), nil
		},
		Presets:     Presets(mt),
		Sequence:    true,
		BatchShapes: batchShapes,
		RandomBatch: randomBatch,
		Formats:     []string{finetune.FormatGLUE, finetune.FormatText},
		OpenData:    openData,
		Trainable: func(m finetune.Model) error {
			if c := m.(Encoder).Config; c.Head == encoder.HeadNone {
				return fmt.Errorf("%w: %s is a bare encoder; give it one (finetune init --from MODEL --num-labels N)", finetune.ErrNoHead, c.Architecture)
			}
			return nil
		},
		CheckTokenizer: func(tok *tokenizer.Tokenizer, m finetune.Model) error { return checkTokenizer(tok, m.(Encoder)) },
		NewHead:        NewHead,
		Cut: func(m finetune.Model, blocks int) finetune.Model {
			e := m.(Encoder)
			c := e.Config
			c.NumHiddenLayers = min(blocks, c.NumHiddenLayers)
			// The embeddings and the masked LM's decoder are outside the blocks: a small vocabulary times the
			// blocks as well.
			c.VocabSize = min(c.VocabSize, calibrationVocab) // above every preset's special ids
			opts := e.Options
			opts.Blocks = nil
			return Encoder{Model: &encoder.Model{Config: c, Options: opts}}
		},
		BlockFLOPs: func(m finetune.Model, in finetune.Shape) float64 {
			c := m.(Encoder).Config
			h, seq := float64(c.HiddenSize), float64(in.Seq)
			tokens := float64(in.Batch) * seq
			linear := 4*h*h + 2*h*float64(c.IntermediateSize) // query, key, value, attention output; MLP in and out
			return 2*tokens*linear + 4*tokens*seq*h           // QK^T and AV over the whole sequence
		},
	}
}

// calibrationVocab is the vocabulary of an encoder cut for the autopilot's calibration (Family.Cut).
const calibrationVocab = 256

// batchShapes returns an encoder batch's shapes at in: input_ids, attention_mask (token_type_ids for BERT) and
// labels ([B] classes or scores, [B, T] for the masked LM).
func batchShapes(m finetune.Model, in finetune.Shape) (map[string]shapes.Shape, error) {
	e := m.(Encoder)
	if in.Packed {
		return nil, fmt.Errorf("--packing packs causal-LM examples; an encoder's rows are not packed")
	}
	if in.Seq > e.Config.MaxSequence() {
		return nil, fmt.Errorf("sequences of %d tokens are longer than the model's %d positions (max_position_embeddings %d)", in.Seq, e.Config.MaxSequence(), e.Config.MaxPositionEmbeddings)
	}
	out := map[string]shapes.Shape{
		"input_ids":      shapes.Make(dtypes.Int32, in.Batch, in.Seq),
		"attention_mask": shapes.Make(dtypes.Int32, in.Batch, in.Seq),
		"labels":         shapes.Make(dtypes.Int32, in.Batch),
	}
	if e.TokenTypes() {
		out["token_type_ids"] = shapes.Make(dtypes.Int32, in.Batch, in.Seq)
	}
	switch {
	case e.Config.Regression():
		out["labels"] = shapes.Make(dtypes.Float32, in.Batch)
	case e.Config.Head == encoder.HeadMaskedLM:
		out["labels"] = shapes.Make(dtypes.Int32, in.Batch, in.Seq)
	}
	return out, nil
}

// randomBatch returns random inputs at in: token ids below the vocabulary (none of them the pad id), no padding,
// segment B on the second half for BERT, random labels.
func randomBatch(m finetune.Model, in finetune.Shape, seed uint64) finetune.Batch {
	c := m.(Encoder).Config
	r := rand.New(rand.NewPCG(seed, 7))
	n := in.Batch * in.Seq
	ids, mask, types := make([]int32, n), make([]int32, n), make([]int32, n)
	for i := range ids {
		id := r.IntN(c.VocabSize)
		if id == c.PadTokenID {
			id = (id + 1) % c.VocabSize
		}
		ids[i], mask[i] = int32(id), 1
		if i%in.Seq >= in.Seq/2 && c.TypeVocabSize > 1 {
			types[i] = 1
		}
	}
	b := finetune.Batch{"input_ids": tensors.FromFlatDataAndDimensions(ids, in.Batch, in.Seq),
		"attention_mask": tensors.FromFlatDataAndDimensions(mask, in.Batch, in.Seq)}
	if c.TypeVocabSize > 1 {
		b["token_type_ids"] = tensors.FromFlatDataAndDimensions(types, in.Batch, in.Seq)
	}
	switch {
	case c.Regression():
		scores := make([]float32, in.Batch)
		for i := range scores {
			scores[i] = float32(5 * r.Float64())
		}
		b["labels"] = tensors.FromFlatDataAndDimensions(scores, in.Batch)
	case c.Head == encoder.HeadMaskedLM:
		labels := make([]int32, n)
		for i := range labels {
			labels[i] = -100
			if r.Float64() < MaskProbability {
				labels[i] = ids[i]
			}
		}
		b["labels"] = tensors.FromFlatDataAndDimensions(labels, in.Batch, in.Seq)
	default:
		labels := make([]int32, in.Batch)
		for i := range labels {
			labels[i] = int32(r.IntN(max(1, len(c.Labels))))
		}
		b["labels"] = tensors.FromFlatDataAndDimensions(labels, in.Batch)
	}
	return b
}

// checkTokenizer refuses a tokenizer that does not belong to the encoder m: more tokens than its vocabulary,
// another kind of tokenizer than the family's (RoBERTa's byte-level BPE, XLM-RoBERTa's unigram), a template whose
// start and end tokens are not the config's bos/eos ids, or a padding id that is not the config's pad_token_id
// (RoBERTa counts positions from it).
func checkTokenizer(tok *tokenizer.Tokenizer, m Encoder) error {
	c := m.Config
	if n := tok.VocabSize(); n > c.VocabSize {
		return fmt.Errorf("the tokenizer has %d tokens but the model's vocabulary has %d (vocab_size): they do not belong together; use the model's own tokenizer", n, c.VocabSize)
	}
	want := map[string]string{encoder.TypeRoBERTa: "BPE", encoder.TypeXLMRoBERTa: "Unigram"}[c.ModelType]
	if kind := tok.ModelKind(); want != "" && kind != want {
		names := map[string]string{"BPE": "a byte-level BPE", "WordPiece": "a WordPiece (BERT's)", "Unigram": "a SentencePiece unigram"}
		return fmt.Errorf("the tokenizer is %s tokenizer but a %s takes %s tokenizer: use the model's own tokenizer", names[kind], titles[c.ModelType], names[want])
	}
	wrap := tok.Encode("", true)
	if len(wrap) != 2 {
		return fmt.Errorf("the tokenizer's template adds %d tokens to a text, not an encoder's start and end tokens: use the model's own tokenizer", len(wrap))
	}
	if c.IsRoBERTa() && c.BOSTokenID >= 0 && c.EOSTokenID >= 0 && (wrap[0] != c.BOSTokenID || wrap[1] != c.EOSTokenID) {
		return fmt.Errorf("the tokenizer wraps a text in ids %d and %d but the model's bos_token_id and eos_token_id are %d and %d: use the model's own tokenizer", wrap[0], wrap[1], c.BOSTokenID, c.EOSTokenID)
	}
	if pad, ok := tok.Pad(); ok && c.PadTokenID >= 0 && pad != c.PadTokenID {
		return fmt.Errorf("the tokenizer pads with id %d but the model's pad_token_id is %d: use the model's own tokenizer", pad, c.PadTokenID)
	}
	return nil
}
