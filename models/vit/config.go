package vit

import (
	"fmt"

	"github.com/memfit/memfit/models/hfconfig"
)

// Architecture names accepted in config.json's "architectures".
const (
	ArchModel          = "ViTModel"
	ArchClassification = "ViTForImageClassification"
)

// Config is a Hugging Face ViTConfig (model_type "vit").
type Config struct {
	HiddenSize        int
	NumHiddenLayers   int
	NumAttentionHeads int
	IntermediateSize  int
	LayerNormEps      float64
	ImageSize         int
	PatchSize         int
	NumChannels       int
	QKVBias           bool
	// Labels are the class names in id order (empty for ViTModel).
	Labels []string
	// Architecture is ArchModel or ArchClassification (ArchClassification when Labels are given and config.json
	// names none).
	Architecture string
	// Unknown lists config fields memfit does not know; they are ignored (callers may warn).
	Unknown []string
}

// NumPatches returns the number of patches of an image of the configured size.
func (c Config) NumPatches() int { return (c.ImageSize / c.PatchSize) * (c.ImageSize / c.PatchSize) }

// ParseConfig decodes and validates a ViT config.json.
func ParseConfig(data []byte) (Config, error) { return hfconfig.ParseWith(data, decode) }

// LoadConfig reads and validates dir/config.json.
func LoadConfig(dir string) (Config, error) { return hfconfig.LoadWith(dir, decode) }

func decode(f hfconfig.Fields) (Config, error) {
	d := hfconfig.NewDecoder(f)
	if err := hfconfig.ModelType(d, "vit"); err != nil {
		return Config{}, err
	}
	c := Config{LayerNormEps: 1e-12, NumChannels: 3, QKVBias: true}
	d.Require("hidden_size", &c.HiddenSize)
	d.Require("num_hidden_layers", &c.NumHiddenLayers)
	d.Require("num_attention_heads", &c.NumAttentionHeads)
	d.Require("intermediate_size", &c.IntermediateSize)
	d.Require("image_size", &c.ImageSize)
	d.Require("patch_size", &c.PatchSize)
	d.Get("num_channels", &c.NumChannels)
	d.Get("layer_norm_eps", &c.LayerNormEps)
	d.Get("qkv_bias", &c.QKVBias)
	var act string
	if d.Get("hidden_act", &act) && act != "gelu" {
		d.Fail("field \"hidden_act\" is %q: memfit's ViT supports only \"gelu\" (exact erf GELU)", act)
	}
	for _, name := range []string{"hidden_dropout_prob", "attention_probs_dropout_prob"} {
		var p float64
		if d.Get(name, &p) && p != 0 {
			d.Fail("field %q is %g: dropout is not supported, set it to 0", name, p)
		}
	}
	c.Labels = hfconfig.Labels(d)
	c.Architecture = hfconfig.Architecture(d, ArchModel, ArchClassification)
	d.Ignore("encoder_stride", "pooler_act", "pooler_output_size", "add_pooling_layer")
	d.Ignore(hfconfig.CommonIgnored...)
	if err := d.Err(); err != nil {
		return Config{}, err
	}
	if c.Architecture == "" {
		c.Architecture = ArchModel
		if len(c.Labels) > 0 {
			c.Architecture = ArchClassification
		}
	}
	c.Unknown = d.Unknown()
	return c, c.Validate()
}

// Validate checks the sizes.
func (c Config) Validate() error {
	if err := hfconfig.CheckSizes(hfconfig.Size{Name: "hidden_size", Value: c.HiddenSize, Max: 1 << 16},
		hfconfig.Size{Name: "num_hidden_layers", Value: c.NumHiddenLayers, Max: 4096},
		hfconfig.Size{Name: "num_attention_heads", Value: c.NumAttentionHeads, Max: 4096},
		hfconfig.Size{Name: "intermediate_size", Value: c.IntermediateSize, Max: 1 << 18},
		hfconfig.Size{Name: "image_size", Value: c.ImageSize, Max: 1 << 14},
		hfconfig.Size{Name: "patch_size", Value: c.PatchSize, Max: 1 << 14},
		hfconfig.Size{Name: "num_channels", Value: c.NumChannels, Max: 64},
		hfconfig.Size{Name: "num_labels", Value: max(len(c.Labels), 1), Max: hfconfig.MaxLabels}); err != nil {
		return err
	}
	if c.HiddenSize%c.NumAttentionHeads != 0 {
		return fmt.Errorf("field \"hidden_size\" (%d) is not a multiple of \"num_attention_heads\" (%d)", c.HiddenSize, c.NumAttentionHeads)
	}
	if c.ImageSize%c.PatchSize != 0 {
		return fmt.Errorf("field \"image_size\" (%d) is not a multiple of \"patch_size\" (%d)", c.ImageSize, c.PatchSize)
	}
	if c.LayerNormEps <= 0 {
		return fmt.Errorf("field \"layer_norm_eps\" must be positive, got %g", c.LayerNormEps)
	}
	if c.Architecture == ArchClassification && len(c.Labels) == 0 {
		return fmt.Errorf("field \"architectures\" is %s but the config has no labels (id2label or num_labels)", ArchClassification)
	}
	return nil
}

// JSON returns the config as config.json bytes, as transformers writes them.
func (c Config) JSON() ([]byte, error) {
	fields := map[string]any{
		"architectures":                []string{c.Architecture},
		"model_type":                   "vit",
		"hidden_size":                  c.HiddenSize,
		"num_hidden_layers":            c.NumHiddenLayers,
		"num_attention_heads":          c.NumAttentionHeads,
		"intermediate_size":            c.IntermediateSize,
		"hidden_act":                   "gelu",
		"hidden_dropout_prob":          0.0,
		"attention_probs_dropout_prob": 0.0,
		"initializer_range":            0.02,
		"layer_norm_eps":               c.LayerNormEps,
		"image_size":                   c.ImageSize,
		"patch_size":                   c.PatchSize,
		"num_channels":                 c.NumChannels,
		"qkv_bias":                     c.QKVBias,
		"encoder_stride":               c.PatchSize,
		"torch_dtype":                  "float32",
	}
	if len(c.Labels) > 0 {
		fields["id2label"], fields["label2id"] = hfconfig.LabelFields(c.Labels)
	}
	return hfconfig.Marshal(fields)
}

// Presets are named ViT shapes for `finetune init`.
var Presets = map[string]Config{
	// tiny: for tests (32x32 images, patch 8, 17 tokens).
	"tiny": {HiddenSize: 48, NumHiddenLayers: 2, NumAttentionHeads: 4, IntermediateSize: 96, LayerNormEps: 1e-12,
		ImageSize: 32, PatchSize: 8, NumChannels: 3, QKVBias: true, Architecture: ArchClassification},
	// vit-b16: ViT-B/16 at 224x224 (google/vit-base-patch16-224 shapes).
	"vit-b16": {HiddenSize: 768, NumHiddenLayers: 12, NumAttentionHeads: 12, IntermediateSize: 3072, LayerNormEps: 1e-12,
		ImageSize: 224, PatchSize: 16, NumChannels: 3, QKVBias: true, Architecture: ArchClassification},
}

// Preset returns the named preset with numLabels generic labels (LABEL_i); numLabels 0 gives a ViTModel.
func Preset(name string, numLabels int) (Config, error) {
	c, err := hfconfig.Preset(Presets, "ViT", name)
	if err != nil {
		return Config{}, err
	}
	c.Labels = nil
	c.Architecture = ArchModel
	if numLabels > 0 {
		c.Architecture = ArchClassification
		c.Labels = hfconfig.GenericLabels(numLabels)
	}
	return c, c.Validate()
}
