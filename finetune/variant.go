package finetune

import (
	"fmt"

	"github.com/memfit/memfit/quant"
)

// Variant is one combination of the memory-saving options, applied on top of a Config.
type Variant struct {
	Name      string
	ApproxAct bool
	MSNorm    bool
	GradCkpt  bool
	// Mesa lists the activation kinds stored as int8 (quant.Mesa).
	Mesa []string
}

// Apply returns cfg with the variant's options set (and the others cleared).
func (v Variant) Apply(cfg Config) Config {
	cfg.ApproxAct, cfg.MSNorm, cfg.GradCkpt, cfg.Mesa = v.ApproxAct, v.MSNorm, v.GradCkpt, v.Mesa
	return cfg
}

// Variants are the memory-saving variants that the memory planner (package plan) compares by default, plain
// first.
var Variants = []Variant{
	{Name: "plain"},
	{Name: "approx-act", ApproxAct: true},
	{Name: "ms-norm", MSNorm: true},
	{Name: "approx-act+ms-norm", ApproxAct: true, MSNorm: true},
	{Name: "grad-ckpt", GradCkpt: true},
	{Name: "mesa", Mesa: []string{quant.MesaActivation, quant.MesaNorm}},
	{Name: "approx-act+ms-norm+mesa-softmax", ApproxAct: true, MSNorm: true, Mesa: []string{quant.MesaSoftmax}},
	// approx-act+mesa is the autopilot's block mode of that name on every block: Mesa on every kind.
	{Name: "approx-act+mesa", ApproxAct: true, Mesa: append([]string(nil), quant.MesaKinds...)},
}

// VariantByName returns the named variant of Variants.
func VariantByName(name string) (Variant, error) {
	for _, v := range Variants {
		if v.Name == name {
			return v, nil
		}
	}
	names := make([]string, len(Variants))
	for i, v := range Variants {
		names[i] = v.Name
	}
	return Variant{}, fmt.Errorf("unknown variant %q (have %v)", name, names)
}
