// Package llama is the LLaMA family (model_type "llama": LlamaForCausalLM, LlamaForSequenceClassification) on the
// shared decoder graph: its config.json decoder and writer and its presets, registered with finetune through
// family/lm from this package's init. A program that trains LLaMAs imports it (or family/all) for that side
// effect.
package llama

import (
	"github.com/memfit/memfit/family/lm"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/hfconfig"
)

// Architecture names accepted in config.json's "architectures".
const (
	ArchCausalLM       = "LlamaForCausalLM"
	ArchClassification = "LlamaForSequenceClassification"
)

// Spec is the LLaMA family.
var Spec = &lm.Spec{Name: "llama", Title: "LLaMA", Decode: decode, JSON: writeJSON, Presets: Presets, GGUFArch: "llama",
	CausalLM: ArchCausalLM, Classifier: ArchClassification}

func init() { lm.Register(Spec) }

// ParseConfig decodes and validates a LLaMA config.json.
func ParseConfig(data []byte) (decoder.Config, error) { return Spec.ParseConfig(data) }

// LoadConfig reads and validates dir/config.json.
func LoadConfig(dir string) (decoder.Config, error) { return Spec.LoadConfig(dir) }

// Load reads a LLaMA model folder (config.json and safetensors weights) in the modes of opts.
func Load(dir string, opts decoder.Options) (*decoder.Model, error) { return Spec.Load(dir, opts) }

// Preset returns the named preset as a causal LM, or as a sequence classifier with numLabels generic labels
// (LABEL_i) when numLabels > 0 (pad token 0).
func Preset(name string, numLabels int) (decoder.Config, error) { return Spec.Preset(name, numLabels) }

func decode(s *lm.Spec, f hfconfig.Fields) (decoder.Config, error) {
	d := hfconfig.NewDecoder(f)
	if err := hfconfig.ModelType(d, "llama"); err != nil {
		return decoder.Config{}, err
	}
	c := decoder.Config{RMSNormEps: 1e-6, RopeTheta: 10000, MaxPositionEmbeddings: 2048, PadTokenID: -1, BOSTokenID: -1, EOSTokenID: -1}
	decoder.ReadCommon(d, &c)
	d.Get("attention_bias", &c.AttentionBias)
	d.Get("mlp_bias", &c.MLPBias)
	lm.Activation(d, &c, map[string]string{"silu": decoder.ActSiLU}, "hidden_act")
	var tp int
	if d.Get("pretraining_tp", &tp) && tp != 1 {
		d.Fail("field \"pretraining_tp\" is %d: only 1 is supported", tp)
	}
	var partial float64
	if d.Get("partial_rotary_factor", &partial) && partial != 1 {
		d.Fail("field \"partial_rotary_factor\" is %g: memfit rotates the whole head (1 only)", partial)
	}
	s.ReadHead(d, &c)
	return c, decoder.Finish(d, &c)
}

// JSON returns c as a LLaMA config.json, as transformers writes it.
func JSON(c decoder.Config) ([]byte, error) { return Spec.ConfigJSON(c) }

func writeJSON(s *lm.Spec, c decoder.Config) ([]byte, error) {
	fields := s.Fields(c)
	fields["hidden_act"] = "silu"
	fields["attention_bias"] = c.AttentionBias
	fields["mlp_bias"] = c.MLPBias
	fields["pretraining_tp"] = 1
	return hfconfig.Marshal(fields)
}

// Presets are named LLaMA shapes for `finetune init` and the planner.
var Presets = map[string]decoder.Config{
	// tiny: for tests (the shape of the golden llama_a model).
	"tiny": {VocabSize: 256, HiddenSize: 64, IntermediateSize: 172, NumHiddenLayers: 2, NumAttentionHeads: 4,
		NumKeyValueHeads: 2, HeadDim: 16, MaxPositionEmbeddings: 128, RMSNormEps: 1e-5, RopeTheta: 10000},
	// llama-1b: TinyLlama-1.1B shapes.
	"llama-1b": {VocabSize: 32000, HiddenSize: 2048, IntermediateSize: 5632, NumHiddenLayers: 22, NumAttentionHeads: 32,
		NumKeyValueHeads: 4, HeadDim: 64, MaxPositionEmbeddings: 2048, RMSNormEps: 1e-5, RopeTheta: 10000},
	// llama-7b: LLaMA-2-7B shapes.
	"llama-7b": {VocabSize: 32000, HiddenSize: 4096, IntermediateSize: 11008, NumHiddenLayers: 32, NumAttentionHeads: 32,
		NumKeyValueHeads: 32, HeadDim: 128, MaxPositionEmbeddings: 4096, RMSNormEps: 1e-5, RopeTheta: 10000},
}
