// Package encoder builds BERT-style post-LN encoders (model_type "bert", "roberta" and "xlm-roberta") in the Hugging
// Face layout: BertModel / RobertaModel, ...ForSequenceClassification (BERT's pooler + classifier, RoBERTa's
// classification head on <s>; num_labels 1 as regression) and ...ForMaskedLM (the tied decoder, for
// pretraining), in any combination of the memory-saving options: ReGELU2 in the MLP, MS-LN on the post-LN
// residual stream (see fold.go), Mesa and gradient checkpointing per encoder layer.
package encoder

import (
	"fmt"
	"slices"
	"strings"

	"github.com/memfit/memfit/models/hfconfig"
)

// Model types this package reads.
const (
	TypeBERT       = "bert"
	TypeRoBERTa    = "roberta"
	TypeXLMRoBERTa = "xlm-roberta"
)

// ModelTypes are the model_type values this package reads, in the order messages list them.
var ModelTypes = []string{TypeBERT, TypeRoBERTa, TypeXLMRoBERTa}

// Head is what sits on the encoder.
type Head int

// The heads.
const (
	// HeadNone is the bare encoder (BertModel, RobertaModel): its output is the last hidden state.
	HeadNone Head = iota
	// HeadClassification is ...ForSequenceClassification: BERT's pooler (dense + tanh on [CLS]) and classifier,
	// or RoBERTa's classification head (dense + tanh + out_proj on <s>).
	HeadClassification
	// HeadMaskedLM is ...ForMaskedLM (and BertForPreTraining, read as its masked-LM part): dense, GELU,
	// LayerNorm, then the decoder tied to the word embeddings plus a bias.
	HeadMaskedLM
)

// Problem types of a classification head (config.json's problem_type).
const (
	ProblemRegression    = "regression"
	ProblemSingleLabel   = "single_label_classification"
	problemMultiLabel    = "multi_label_classification"
	defaultClassifierNum = 2 // transformers' default num_labels
)

// Config is a Hugging Face BertConfig, RobertaConfig or XLMRobertaConfig.
type Config struct {
	// ModelType is TypeBERT, TypeRoBERTa or TypeXLMRoBERTa.
	ModelType             string
	VocabSize             int
	HiddenSize            int
	NumHiddenLayers       int
	NumAttentionHeads     int
	IntermediateSize      int
	MaxPositionEmbeddings int
	TypeVocabSize         int
	LayerNormEps          float64
	// PadTokenID is the padding id (RoBERTa's position ids count from it); BOSTokenID and EOSTokenID are -1
	// when absent.
	PadTokenID, BOSTokenID, EOSTokenID int
	// TieWordEmbeddings ties the masked-LM decoder to the word embeddings (transformers' default, true).
	TieWordEmbeddings bool
	// HiddenDropout, AttentionDropout and ClassifierDropout (-1: null) are kept for config.json; memfit trains
	// encoders without dropout (see docs/encoders.md).
	HiddenDropout, AttentionDropout, ClassifierDropout float64
	// Labels are the class names of a classification head (one for regression).
	Labels []string
	// ProblemType is "", ProblemRegression or ProblemSingleLabel (config.json's problem_type).
	ProblemType string
	// Architecture is the config's architectures entry (the class name); Head is what it puts on the encoder.
	Architecture string
	Head         Head
	// Unknown lists config fields memfit does not know; they are ignored (callers may warn).
	Unknown []string
}

// architectures returns the class names of model type mt by head, and the class prefix ("Bert", "Roberta",
// "XLMRoberta").
func architectures(mt string) map[string]Head {
	prefix := map[string]string{TypeBERT: "Bert", TypeRoBERTa: "Roberta", TypeXLMRoBERTa: "XLMRoberta"}[mt]
	out := map[string]Head{prefix + "Model": HeadNone, prefix + "ForSequenceClassification": HeadClassification,
		prefix + "ForMaskedLM": HeadMaskedLM}
	if mt == TypeBERT {
		out["BertForPreTraining"] = HeadMaskedLM // its masked-LM part; the next-sentence head is not read
	}
	return out
}

// ArchitectureOf returns the class name of model type mt with head h.
func ArchitectureOf(mt string, h Head) string {
	for name, head := range architectures(mt) {
		if head == h && name != "BertForPreTraining" {
			return name
		}
	}
	return ""
}

// ParseConfig decodes and validates a BERT, RoBERTa or XLM-RoBERTa config.json.
func ParseConfig(data []byte) (Config, error) { return hfconfig.ParseWith(data, decode) }

// LoadConfig reads and validates dir/config.json.
func LoadConfig(dir string) (Config, error) { return hfconfig.LoadWith(dir, decode) }

func decode(f hfconfig.Fields) (Config, error) {
	d := hfconfig.NewDecoder(f)
	var mt string
	d.Require("model_type", &mt)
	if err := d.Err(); err != nil {
		return Config{}, err
	}
	if !slices.Contains(ModelTypes, mt) {
		return Config{}, fmt.Errorf("field \"model_type\" is %q, not one of %s", mt, strings.Join(ModelTypes, ", "))
	}
	// transformers' defaults (BertConfig, RobertaConfig; XLMRobertaConfig has RoBERTa's).
	c := Config{ModelType: mt, MaxPositionEmbeddings: 512, TypeVocabSize: 2, LayerNormEps: 1e-12,
		PadTokenID: 0, BOSTokenID: -1, EOSTokenID: -1, TieWordEmbeddings: true, HiddenDropout: 0.1,
		AttentionDropout: 0.1, ClassifierDropout: -1}
	if mt != TypeBERT {
		c.PadTokenID, c.BOSTokenID, c.EOSTokenID = 1, 0, 2
	}
	d.Require("vocab_size", &c.VocabSize)
	d.Require("hidden_size", &c.HiddenSize)
	d.Require("num_hidden_layers", &c.NumHiddenLayers)
	d.Require("num_attention_heads", &c.NumAttentionHeads)
	d.Require("intermediate_size", &c.IntermediateSize)
	d.Get("max_position_embeddings", &c.MaxPositionEmbeddings)
	d.Get("type_vocab_size", &c.TypeVocabSize)
	d.Get("layer_norm_eps", &c.LayerNormEps)
	d.Get("tie_word_embeddings", &c.TieWordEmbeddings)
	for name, id := range map[string]*int{"pad_token_id": &c.PadTokenID, "bos_token_id": &c.BOSTokenID, "eos_token_id": &c.EOSTokenID} {
		if _, present := f[name]; present && !d.Has(name) {
			*id = -1 // null
		}
		if ids := d.TokenIDs(name); len(ids) > 1 {
			d.Fail("field %q lists %d ids: give one", name, len(ids))
		} else if len(ids) == 1 {
			*id = ids[0]
		}
	}
	var act string
	if d.Get("hidden_act", &act) && act != "gelu" {
		d.Fail("field \"hidden_act\" is %q: memfit's encoders support only \"gelu\" (the exact erf GELU)", act)
	}
	var pos string
	if d.Get("position_embedding_type", &pos) && pos != "absolute" {
		d.Fail("field \"position_embedding_type\" is %q: memfit's encoders support only \"absolute\" position embeddings", pos)
	}
	for _, name := range []string{"is_decoder", "add_cross_attention"} {
		var on bool
		if d.Get(name, &on) && on {
			d.Fail("field %q is true: memfit's encoders are bidirectional encoders without cross-attention; set it to false", name)
		}
	}
	d.Get("hidden_dropout_prob", &c.HiddenDropout)
	d.Get("attention_probs_dropout_prob", &c.AttentionDropout)
	d.Get("classifier_dropout", &c.ClassifierDropout)
	if d.Get("problem_type", &c.ProblemType) {
		switch c.ProblemType {
		case ProblemRegression, ProblemSingleLabel:
		case problemMultiLabel:
			d.Fail("field \"problem_type\" is %q: memfit's classifiers take one label per example (regression or single_label_classification)", c.ProblemType)
		default:
			d.Fail("field \"problem_type\" is %q: use \"regression\" or \"single_label_classification\"", c.ProblemType)
		}
	}
	c.Labels = hfconfig.Labels(d)
	archs := architectures(mt)
	c.Architecture = hfconfig.Architecture(d, slices.Sorted(mapKeys(archs))...)
	d.Ignore("gradient_checkpointing", "output_past", "position_ids", "layer_norm_type")
	d.Ignore(hfconfig.CommonIgnored...)
	if err := d.Err(); err != nil {
		return Config{}, err
	}
	switch {
	case c.Architecture != "":
		c.Head = archs[c.Architecture]
	case len(c.Labels) > 0:
		c.Head = HeadClassification
		c.Architecture = ArchitectureOf(mt, HeadClassification)
	default:
		c.Head = HeadMaskedLM
		c.Architecture = ArchitectureOf(mt, HeadMaskedLM)
	}
	if c.Head == HeadClassification && len(c.Labels) == 0 {
		c.Labels = hfconfig.GenericLabels(defaultClassifierNum)
	}
	c.Unknown = d.Unknown()
	return c, c.Validate()
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// Prefix returns the name prefix of the encoder's parameters in the task models: "bert." or "roberta." (XLM-R's
// classes keep RoBERTa's).
func (c Config) Prefix() string {
	if c.ModelType == TypeBERT {
		return "bert."
	}
	return "roberta."
}

// IsRoBERTa reports whether the model counts positions from the padding id and has RoBERTa's heads (roberta and
// xlm-roberta).
func (c Config) IsRoBERTa() bool { return c.ModelType != TypeBERT }

// Regression reports whether a classification head is a regression head: problem_type "regression", or one
// label without a problem_type (transformers' rule).
func (c Config) Regression() bool {
	return c.Head == HeadClassification && (c.ProblemType == ProblemRegression || c.ProblemType == "" && len(c.Labels) == 1)
}

// HeadDim returns the attention heads' width.
func (c Config) HeadDim() int { return c.HiddenSize / c.NumAttentionHeads }

// MaxSequence returns the longest sequence the position embeddings take: max_position_embeddings, less the
// padding_idx + 1 positions RoBERTa skips.
func (c Config) MaxSequence() int {
	if c.IsRoBERTa() {
		return c.MaxPositionEmbeddings - c.PadTokenID - 1
	}
	return c.MaxPositionEmbeddings
}

// Validate checks the sizes, the token ids against the vocabulary and the head against the labels; an error names
// the field and its value.
func (c Config) Validate() error {
	if !slices.Contains(ModelTypes, c.ModelType) {
		return fmt.Errorf("model type %q is not one of %s", c.ModelType, strings.Join(ModelTypes, ", "))
	}
	if err := hfconfig.CheckSizes(hfconfig.Size{Name: "vocab_size", Value: c.VocabSize, Max: 1 << 24},
		hfconfig.Size{Name: "hidden_size", Value: c.HiddenSize, Max: 1 << 16},
		hfconfig.Size{Name: "num_hidden_layers", Value: c.NumHiddenLayers, Max: 4096},
		hfconfig.Size{Name: "num_attention_heads", Value: c.NumAttentionHeads, Max: 4096},
		hfconfig.Size{Name: "intermediate_size", Value: c.IntermediateSize, Max: 1 << 18},
		hfconfig.Size{Name: "max_position_embeddings", Value: c.MaxPositionEmbeddings, Max: 1 << 20},
		hfconfig.Size{Name: "type_vocab_size", Value: c.TypeVocabSize, Max: 1 << 16},
		hfconfig.Size{Name: "num_labels", Value: max(len(c.Labels), 1), Max: hfconfig.MaxLabels}); err != nil {
		return err
	}
	if c.HiddenSize%c.NumAttentionHeads != 0 {
		return fmt.Errorf("field \"hidden_size\" (%d) is not a multiple of \"num_attention_heads\" (%d)", c.HiddenSize, c.NumAttentionHeads)
	}
	if !(c.LayerNormEps > 0) {
		return fmt.Errorf("field \"layer_norm_eps\" must be positive, got %g", c.LayerNormEps)
	}
	vocab := fmt.Sprintf("the vocabulary [0, %d) (vocab_size)", c.VocabSize)
	if c.PadTokenID < -1 || c.PadTokenID >= c.VocabSize {
		return fmt.Errorf("field \"pad_token_id\" is %d, outside %s", c.PadTokenID, vocab)
	}
	if c.IsRoBERTa() {
		if c.PadTokenID < 0 {
			return fmt.Errorf("field \"pad_token_id\" is needed by %s: its position ids count from it", c.ModelType)
		}
		if c.MaxSequence() < 1 {
			return fmt.Errorf("field \"max_position_embeddings\" (%d) leaves no position after the padding_idx + 1 = %d that %s skips", c.MaxPositionEmbeddings, c.PadTokenID+1, c.ModelType)
		}
	}
	for name, id := range map[string]int{"bos_token_id": c.BOSTokenID, "eos_token_id": c.EOSTokenID} {
		if id < -1 || id >= c.VocabSize {
			return fmt.Errorf("field %q is %d, outside %s", name, id, vocab)
		}
	}
	switch c.Head {
	case HeadClassification:
		if len(c.Labels) == 0 {
			return fmt.Errorf("field \"architectures\" is %s but the config has no labels (id2label or num_labels)", c.Architecture)
		}
		if c.ProblemType == ProblemRegression && len(c.Labels) != 1 {
			return fmt.Errorf("field \"problem_type\" is regression with %d labels: memfit's regression head predicts one score (num_labels 1)", len(c.Labels))
		}
		if c.ProblemType == ProblemSingleLabel && len(c.Labels) < 2 {
			return fmt.Errorf("field \"problem_type\" is single_label_classification with %d label: give at least 2 classes, or problem_type regression", len(c.Labels))
		}
	case HeadNone, HeadMaskedLM:
		if c.ProblemType != "" {
			return fmt.Errorf("field \"problem_type\" is %q but %s has no classification head", c.ProblemType, c.Architecture)
		}
	default:
		return fmt.Errorf("unknown head %d", int(c.Head))
	}
	return nil
}

// JSON returns the config as config.json bytes, as transformers writes them.
func (c Config) JSON() ([]byte, error) {
	fields := map[string]any{
		"architectures":                []string{c.Architecture},
		"model_type":                   c.ModelType,
		"vocab_size":                   c.VocabSize,
		"hidden_size":                  c.HiddenSize,
		"num_hidden_layers":            c.NumHiddenLayers,
		"num_attention_heads":          c.NumAttentionHeads,
		"intermediate_size":            c.IntermediateSize,
		"hidden_act":                   "gelu",
		"hidden_dropout_prob":          c.HiddenDropout,
		"attention_probs_dropout_prob": c.AttentionDropout,
		"max_position_embeddings":      c.MaxPositionEmbeddings,
		"type_vocab_size":              c.TypeVocabSize,
		"initializer_range":            0.02,
		"layer_norm_eps":               c.LayerNormEps,
		"position_embedding_type":      "absolute",
		"use_cache":                    true,
		"classifier_dropout":           nil,
		"torch_dtype":                  "float32",
	}
	if c.ClassifierDropout >= 0 {
		fields["classifier_dropout"] = c.ClassifierDropout
	}
	if c.PadTokenID >= 0 {
		fields["pad_token_id"] = c.PadTokenID
	} else {
		fields["pad_token_id"] = nil
	}
	for key, id := range map[string]int{"bos_token_id": c.BOSTokenID, "eos_token_id": c.EOSTokenID} {
		if id >= 0 {
			fields[key] = id
		}
	}
	if !c.TieWordEmbeddings {
		fields["tie_word_embeddings"] = false
	}
	if c.ProblemType != "" {
		fields["problem_type"] = c.ProblemType
	}
	if len(c.Labels) > 0 {
		fields["id2label"], fields["label2id"] = hfconfig.LabelFields(c.Labels)
	}
	return hfconfig.Marshal(fields)
}

// Presets are named encoder shapes (`finetune init --arch bert|roberta`, `finetune memory --model NAME`).
var Presets = map[string]Config{
	// roberta-mini: for tests (the shape of the golden roberta_a model: hidden 64, 2 layers, vocabulary 320).
	"roberta-mini": {ModelType: TypeRoBERTa, VocabSize: 320, HiddenSize: 64, NumHiddenLayers: 2, NumAttentionHeads: 4,
		IntermediateSize: 128, MaxPositionEmbeddings: 40, TypeVocabSize: 1, LayerNormEps: 1e-5},
	// roberta-base: FacebookAI/roberta-base shapes.
	"roberta-base": {ModelType: TypeRoBERTa, VocabSize: 50265, HiddenSize: 768, NumHiddenLayers: 12, NumAttentionHeads: 12,
		IntermediateSize: 3072, MaxPositionEmbeddings: 514, TypeVocabSize: 1, LayerNormEps: 1e-5},
	// bert-base: google-bert/bert-base-uncased shapes.
	"bert-base": {ModelType: TypeBERT, VocabSize: 30522, HiddenSize: 768, NumHiddenLayers: 12, NumAttentionHeads: 12,
		IntermediateSize: 3072, MaxPositionEmbeddings: 512, TypeVocabSize: 2, LayerNormEps: 1e-12},
}

// Preset returns the named preset as a masked LM, or as a sequence classifier with numLabels generic labels
// (LABEL_i; 1: a regression head) when numLabels > 0.
func Preset(name string, numLabels int) (Config, error) {
	c, err := hfconfig.Preset(Presets, "encoder", name)
	if err != nil {
		return Config{}, err
	}
	c.PadTokenID, c.BOSTokenID, c.EOSTokenID = 0, -1, -1
	if c.IsRoBERTa() {
		c.PadTokenID, c.BOSTokenID, c.EOSTokenID = 1, 0, 2
	}
	c.TieWordEmbeddings, c.HiddenDropout, c.AttentionDropout, c.ClassifierDropout = true, 0.1, 0.1, -1
	c.Head, c.Labels = HeadMaskedLM, nil
	if numLabels > 0 {
		c.Head, c.Labels = HeadClassification, hfconfig.GenericLabels(numLabels)
	}
	c.Architecture = ArchitectureOf(c.ModelType, c.Head)
	return c, c.Validate()
}
