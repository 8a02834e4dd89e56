package encoder_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/models/encoder"
)

// TestConfigRoundTrip: the goldens' config.json files decode to their heads and labels, and JSON writes a config
// that decodes to the same model.
func TestConfigRoundTrip(t *testing.T) {
	for name, want := range map[string]struct {
		head       encoder.Head
		labels     int
		regression bool
		maxSeq     int
	}{"roberta_a": {encoder.HeadClassification, 3, false, 38}, "roberta_reg_a": {encoder.HeadClassification, 1, true, 38},
		"bert_a": {encoder.HeadClassification, 2, false, 32}} {
		c, err := encoder.LoadConfig(filepath.Join(golden.SharedDir(t), "golden", name))
		if err != nil {
			t.Fatal(err)
		}
		if c.Head != want.head || len(c.Labels) != want.labels || c.Regression() != want.regression || c.MaxSequence() != want.maxSeq || len(c.Unknown) > 0 {
			t.Errorf("%s: head %d, %d labels, regression %v, max sequence %d, unknown %v", name, c.Head, len(c.Labels), c.Regression(), c.MaxSequence(), c.Unknown)
		}
		j, err := c.JSON()
		if err != nil {
			t.Fatal(err)
		}
		back, err := encoder.ParseConfig(j)
		if err != nil {
			t.Fatalf("%s: %v\n%s", name, err, j)
		}
		if back.Architecture != c.Architecture || back.ModelType != c.ModelType || len(back.Labels) != len(c.Labels) || back.Regression() != c.Regression() ||
			back.PadTokenID != c.PadTokenID || back.LayerNormEps != c.LayerNormEps || back.TypeVocabSize != c.TypeVocabSize {
			t.Errorf("%s: JSON round trip changed the config: %+v -> %+v", name, c, back)
		}
	}
}

// TestConfigRefused: what memfit's encoders do not compute is refused by name, in one line.
func TestConfigRefused(t *testing.T) {
	base := `"vocab_size": 100, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16`
	for _, c := range []struct{ json, want string }{
		{`{"model_type": "roberta", ` + base + `, "position_embedding_type": "relative_key"}`, `"position_embedding_type" is "relative_key"`},
		{`{"model_type": "bert", ` + base + `, "is_decoder": true}`, `"is_decoder" is true`},
		{`{"model_type": "bert", ` + base + `, "add_cross_attention": true}`, `"add_cross_attention" is true`},
		{`{"model_type": "bert", ` + base + `, "hidden_act": "relu"}`, `"hidden_act" is "relu"`},
		{`{"model_type": "bert", ` + base + `, "num_labels": 3, "problem_type": "multi_label_classification"}`, `multi_label_classification`},
		{`{"model_type": "bert", ` + base + `, "num_labels": 3, "problem_type": "regression"}`, `regression with 3 labels`},
		{`{"model_type": "roberta", ` + base + `, "architectures": ["RobertaForCausalLM"]}`, `"RobertaForCausalLM" is not supported`},
		{`{"model_type": "roberta", ` + base + `, "max_position_embeddings": 2}`, `leaves no position`},
		{`{"model_type": "electra", ` + base + `}`, `"electra", not one of bert, roberta, xlm-roberta`},
		{`{"model_type": "bert", ` + base + `, "pad_token_id": 100}`, `"pad_token_id" is 100`},
	} {
		_, err := encoder.ParseConfig([]byte(c.json))
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: got %v, want one line with %q", c.json, err, c.want)
		}
	}
}

// TestConfigDefaults: transformers' defaults fill what a config leaves out (a config with num_labels alone is a
// classifier, one without labels or architectures a masked LM; RoBERTa's ids 1/0/2, BERT's pad 0; an explicit
// null pad id is none), and the Hub's real configs decode without unknown fields.
func TestConfigDefaults(t *testing.T) {
	base := `"vocab_size": 100, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16`
	c, err := encoder.ParseConfig([]byte(`{"model_type": "xlm-roberta", ` + base + `, "num_labels": 1}`))
	if err != nil || c.Head != encoder.HeadClassification || !c.Regression() || c.PadTokenID != 1 || c.Architecture != "XLMRobertaForSequenceClassification" || c.Prefix() != "roberta." {
		t.Errorf("xlm-roberta with num_labels 1: %+v, %v", c, err)
	}
	c, err = encoder.ParseConfig([]byte(`{"model_type": "bert", ` + base + `, "pad_token_id": null}`))
	if err != nil || c.Head != encoder.HeadMaskedLM || c.PadTokenID != -1 || c.Architecture != "BertForMaskedLM" {
		t.Errorf("bert without labels: %+v, %v", c, err)
	}
	// roberta-base's and bert-base-uncased's config.json as the Hub serves them.
	for _, j := range []string{
		`{"architectures":["RobertaForMaskedLM"],"attention_probs_dropout_prob":0.1,"bos_token_id":0,"eos_token_id":2,"hidden_act":"gelu","hidden_dropout_prob":0.1,"hidden_size":768,"initializer_range":0.02,"intermediate_size":3072,"layer_norm_eps":1e-05,"max_position_embeddings":514,"model_type":"roberta","num_attention_heads":12,"num_hidden_layers":12,"pad_token_id":1,"type_vocab_size":1,"vocab_size":50265}`,
		`{"architectures":["BertForMaskedLM"],"attention_probs_dropout_prob":0.1,"gradient_checkpointing":false,"hidden_act":"gelu","hidden_dropout_prob":0.1,"hidden_size":768,"initializer_range":0.02,"intermediate_size":3072,"layer_norm_eps":1e-12,"max_position_embeddings":512,"model_type":"bert","num_attention_heads":12,"num_hidden_layers":12,"pad_token_id":0,"position_embedding_type":"absolute","transformers_version":"4.6.0.dev0","type_vocab_size":2,"use_cache":true,"vocab_size":30522}`,
	} {
		c, err := encoder.ParseConfig([]byte(j))
		if err != nil || len(c.Unknown) > 0 || c.Head != encoder.HeadMaskedLM || c.HiddenSize != 768 {
			t.Errorf("%s: %+v, %v", j[:40], c, err)
		}
	}
	for _, name := range []string{"roberta-base", "bert-base", "roberta-mini"} {
		if _, err := encoder.Preset(name, 2); err != nil {
			t.Errorf("preset %s: %v", name, err)
		}
	}
}
