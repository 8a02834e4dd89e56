package encoder

import (
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/models"
)

// Hugging Face module paths of one encoder layer's linear layers, relative to LayerPrefix (their parameters are
// <path>.weight and <path>.bias).
const (
	Query        = "attention.self.query"
	Key          = "attention.self.key"
	Value        = "attention.self.value"
	AttnOut      = "attention.output.dense"
	Intermediate = "intermediate.dense"
	Output       = "output.dense"
)

// Hugging Face names of one encoder layer's LayerNorms, relative to LayerPrefix: after the attention's residual
// add, and after the MLP's.
const (
	AttnNorm   = "attention.output.LayerNorm"
	OutputNorm = "output.LayerNorm"
)

// Names of the embeddings' parameters, relative to Config.Prefix.
const (
	WordEmbeddings     = "embeddings.word_embeddings.weight"
	PositionEmbeddings = "embeddings.position_embeddings.weight"
	TokenTypes         = "embeddings.token_type_embeddings.weight"
	EmbeddingsNorm     = "embeddings.LayerNorm"
)

// Module paths of the heads (whole names).
const (
	BertPooler        = "bert.pooler.dense"
	BertClassifier    = "classifier"
	RobertaDense      = "classifier.dense"
	RobertaOutProj    = "classifier.out_proj"
	BertMLMDense      = "cls.predictions.transform.dense"
	BertMLMNorm       = "cls.predictions.transform.LayerNorm"
	BertMLMBias       = "cls.predictions.bias"
	BertMLMDecoder    = "cls.predictions.decoder"
	RobertaMLMDense   = "lm_head.dense"
	RobertaMLMNorm    = "lm_head.layer_norm"
	RobertaMLMBias    = "lm_head.bias"
	RobertaMLMDecoder = "lm_head.decoder"
)

// LayerPrefix returns the name prefix of encoder layer i: "bert.encoder.layer.{i}." or "roberta.encoder.layer.{i}.".
func (c Config) LayerPrefix(i int) string { return fmt.Sprintf("%sencoder.layer.%d.", c.Prefix(), i) }

// heads returns the module paths of the head's linear layers in order: [pooler, classifier] for BERT,
// [dense, out_proj] for RoBERTa, [dense] for a masked LM, none for the bare encoder.
func (c Config) heads() []string {
	switch {
	case c.Head == HeadClassification && c.IsRoBERTa():
		return []string{RobertaDense, RobertaOutProj}
	case c.Head == HeadClassification:
		return []string{BertPooler, BertClassifier}
	case c.Head == HeadMaskedLM && c.IsRoBERTa():
		return []string{RobertaMLMDense}
	case c.Head == HeadMaskedLM:
		return []string{BertMLMDense}
	}
	return nil
}

// mlm returns the masked-LM head's names: its LayerNorm, output bias and (untied) decoder path.
func (c Config) mlm() (norm, bias, decoder string) {
	if c.IsRoBERTa() {
		return RobertaMLMNorm, RobertaMLMBias, RobertaMLMDecoder
	}
	return BertMLMNorm, BertMLMBias, BertMLMDecoder
}

// Shapes returns every parameter name of cfg's model with its shape.
func Shapes(cfg Config) map[string][]int {
	d, m, p := cfg.HiddenSize, cfg.IntermediateSize, cfg.Prefix()
	s := map[string][]int{
		p + WordEmbeddings:             {cfg.VocabSize, d},
		p + PositionEmbeddings:         {cfg.MaxPositionEmbeddings, d},
		p + TokenTypes:                 {cfg.TypeVocabSize, d},
		p + EmbeddingsNorm + ".weight": {d}, p + EmbeddingsNorm + ".bias": {d},
	}
	linear := func(path string, out, in int) {
		s[path+".weight"], s[path+".bias"] = []int{out, in}, []int{out}
	}
	norm := func(path string) { s[path+".weight"], s[path+".bias"] = []int{d}, []int{d} }
	for i := 0; i < cfg.NumHiddenLayers; i++ {
		pre := cfg.LayerPrefix(i)
		linear(pre+Query, d, d)
		linear(pre+Key, d, d)
		linear(pre+Value, d, d)
		linear(pre+AttnOut, d, d)
		norm(pre + AttnNorm)
		linear(pre+Intermediate, m, d)
		linear(pre+Output, d, m)
		norm(pre + OutputNorm)
	}
	heads := cfg.heads()
	switch cfg.Head {
	case HeadClassification:
		linear(heads[0], d, d)
		linear(heads[1], len(cfg.Labels), d)
	case HeadMaskedLM:
		linear(heads[0], d, d)
		n, bias, decoder := cfg.mlm()
		norm(n)
		s[bias] = []int{cfg.VocabSize}
		if !cfg.TieWordEmbeddings {
			s[decoder+".weight"] = []int{cfg.VocabSize, d}
		}
	}
	return s
}

// LinearLayers lists cfg's linear layers (query, key, value, the attention's output dense, intermediate and
// output dense of every layer, and the head's: BERT's pooler and classifier, RoBERTa's classifier.dense and
// out_proj, the masked LM's transform dense); the classifier layers are the heads that "all-linear" leaves out.
// The embeddings, and the masked LM's decoder (tied to them), are not linear layers adapters wrap.
func LinearLayers(cfg Config) []models.LinearLayer {
	heads := []string{BertClassifier, RobertaDense, RobertaOutProj}
	_, _, decoder := cfg.mlm()
	return models.LinearLayers(Shapes(cfg), heads, cfg.Prefix()+WordEmbeddings, cfg.Prefix()+PositionEmbeddings,
		cfg.Prefix()+TokenTypes, decoder+".weight")
}

// RandomParams returns freshly initialised parameters for cfg, as transformers' BERT initialisation does: linear
// and embedding weights normal(0, 0.02) (initializer_range), biases zero, LayerNorm weights one, the embedding
// rows of the padding id zero (nn.Embedding's padding_idx; RoBERTa's position row padding_idx too).
func RandomParams(cfg Config, seed uint64) models.Params {
	r := rand.New(rand.NewPCG(seed, 0xbe27))
	p := models.Params{}
	shapes := Shapes(cfg)
	names := make([]string, 0, len(shapes))
	for name := range shapes {
		names = append(names, name)
	}
	sort.Strings(names) // draw in a fixed order: the same seed gives the same weights
	for _, name := range names {
		dims := shapes[name]
		n := 1
		for _, d := range dims {
			n *= d
		}
		data := make([]float32, n)
		switch {
		case len(dims) == 1 && isNormWeight(name):
			for i := range data {
				data[i] = 1
			}
		case len(dims) == 1:
		default:
			for i := range data {
				data[i] = float32(0.02 * r.NormFloat64())
			}
		}
		zeroRow := func(row int) {
			if row >= 0 && row < dims[0] {
				clear(data[row*dims[1] : (row+1)*dims[1]])
			}
		}
		switch name {
		case cfg.Prefix() + WordEmbeddings:
			zeroRow(cfg.PadTokenID)
		case cfg.Prefix() + PositionEmbeddings:
			if cfg.IsRoBERTa() {
				zeroRow(cfg.PadTokenID)
			}
		}
		p[name] = tensors.FromFlatDataAndDimensions(data, dims...)
	}
	return p
}

func isNormWeight(name string) bool {
	return strings.HasSuffix(name, "LayerNorm.weight") || strings.HasSuffix(name, "layer_norm.weight")
}
