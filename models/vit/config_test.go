package vit

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/memfit/memfit/internal/golden"
)

func TestGoldenConfig(t *testing.T) {
	c, err := LoadConfig(filepath.Join(golden.SharedDir(t), "golden", "vit_a"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Architecture != ArchClassification || len(c.Labels) != 10 || c.HiddenSize != 48 || c.NumPatches() != 16 ||
		c.LayerNormEps != 1e-12 || !c.QKVBias || len(c.Unknown) != 0 {
		t.Errorf("decoded %+v", c)
	}
}

func TestConfigErrors(t *testing.T) {
	base := `"hidden_size":48,"num_hidden_layers":1,"num_attention_heads":4,"intermediate_size":96,"image_size":32,"patch_size":8`
	for _, tc := range []struct{ json, want string }{
		{`{"model_type":"deit",` + base + `}`, `"model_type" is "deit"`},
		{`{"model_type":"vit",` + base + `,"hidden_act":"gelu_new"}`, `"hidden_act"`},
		{`{"model_type":"vit",` + base + `,"hidden_dropout_prob":0.1}`, `"hidden_dropout_prob"`},
		{`{"model_type":"vit",` + base + `,"patch_size":7}`, `"image_size"`},
		{`{"model_type":"vit",` + base + `,"num_attention_heads":5}`, `"num_attention_heads"`},
		{`{"model_type":"vit",` + base + `,"architectures":["ViTForImageClassification"]}`, `no labels`},
		{`{"model_type":"vit",` + base + `,"id2label":{"x":"a"}}`, `"id2label"`},
		{`{"model_type":"vit",` + base + `,"image_size":"big"}`, `field "image_size" is "big": want a whole number`},
		{`{"model_type":"vit",` + base + `,"num_attention_heads":0}`, `field "num_attention_heads" must be positive, got 0`},
		{`{"model_type":"vit",` + base + `,"hidden_size":-48}`, `field "hidden_size" must be positive, got -48`},
		{`{"model_type":"vit",` + base + `,"layer_norm_eps":0}`, `field "layer_norm_eps" must be positive, got 0`},
		{`{"model_type":"vit",` + base + `,"qkv_bias":1}`, `field "qkv_bias" is 1: want true or false`},
		{`{"model_type":"vit",` + base + `,"id2label":["a","b"]}`, `field "id2label" is ["a","b"]: want an object`},
	} {
		_, err := ParseConfig([]byte(tc.json))
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error %v, want one line containing %s", tc.json, err, tc.want)
		}
	}
	c, err := ParseConfig([]byte(`{"model_type":"vit",` + base + `,"some_new_field":1}`))
	if err != nil || len(c.Unknown) != 1 || c.Unknown[0] != "some_new_field" {
		t.Errorf("unknown field: %v, %v", c.Unknown, err)
	}
}

func TestConfigRoundTripAndPresets(t *testing.T) {
	for _, name := range []string{"tiny", "vit-b16"} {
		for _, labels := range []int{0, 10} {
			c, err := Preset(name, labels)
			if err != nil {
				t.Fatal(err)
			}
			data, err := c.JSON()
			if err != nil {
				t.Fatal(err)
			}
			back, err := ParseConfig(data)
			if err != nil {
				t.Fatalf("%s: %v\n%s", name, err, data)
			}
			if len(back.Unknown) != 0 || back.HiddenSize != c.HiddenSize || back.Architecture != c.Architecture || len(back.Labels) != labels {
				t.Errorf("%s: round trip %+v -> %+v", name, c, back)
			}
		}
	}
}

// TestBicubicWeights: same size is the identity; rows sum to one; upsampling 2 -> 4 matches torch's
// coefficients for A = -0.75 worked out by hand.
func TestBicubicWeights(t *testing.T) {
	id := bicubicWeights(5, 5)
	for o := range id {
		for i := range id[o] {
			want := 0.0
			if i == o {
				want = 1
			}
			if id[o][i] != want {
				t.Fatalf("identity[%d][%d] = %g", o, i, id[o][i])
			}
		}
	}
	for _, sz := range [][2]int{{4, 7}, {14, 16}, {16, 14}} {
		for o, row := range bicubicWeights(sz[0], sz[1]) {
			s := 0.0
			for _, v := range row {
				s += v
			}
			if math.Abs(s-1) > 1e-12 {
				t.Errorf("%v: row %d sums to %g", sz, o, s)
			}
		}
	}
	// in 2 -> out 4: x = (o + 0.5)/2 - 0.5 = -0.25, 0.25, 0.75, 1.25.
	// o = 1: x0 = 0, t = 0.25, taps -1..2 clamped to 0,0,1,1.
	const a = -0.75
	c1 := func(x float64) float64 { return ((a+2)*x-(a+3))*x*x + 1 }
	c2 := func(x float64) float64 { return ((a*x-5*a)*x+8*a)*x - 4*a }
	w := bicubicWeights(2, 4)
	want0 := c2(1.25) + c1(0.25)
	want1 := c1(0.75) + c2(1.75)
	if math.Abs(w[1][0]-want0) > 1e-15 || math.Abs(w[1][1]-want1) > 1e-15 {
		t.Errorf("row 1 = %v, want [%g %g]", w[1], want0, want1)
	}
}
