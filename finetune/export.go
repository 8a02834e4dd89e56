package finetune

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/lora"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/msnorm"
	"github.com/memfit/memfit/safetensors"
)

// PEFT adapter files.
const (
	AdapterWeights = "adapter_model.safetensors"
	AdapterConfig  = "adapter_config.json"
	peftPrefix     = "base_model.model."
)

// foldOf returns the norm affine folded into the linear layer with weight name, if any.
func foldOf(m Model, weight string) (msnorm.NormAffine, bool, error) {
	folded := m.Folded()
	if len(folded) == 0 {
		return msnorm.NormAffine{}, false, nil
	}
	for _, f := range m.Folds() {
		for _, l := range f.Linears {
			if l.Weight != weight {
				continue
			}
			gamma, err := folded.Float32s(f.Gamma)
			if err != nil {
				return msnorm.NormAffine{}, false, err
			}
			a := msnorm.NormAffine{Gamma: gamma, PlusOne: f.PlusOne}
			if _, ok := folded[f.Beta]; ok && f.Beta != "" {
				if a.Beta, err = folded.Float32s(f.Beta); err != nil {
					return msnorm.NormAffine{}, false, err
				}
			}
			return a, true, nil
		}
	}
	return msnorm.NormAffine{}, false, nil
}

func scaleOf(a msnorm.NormAffine, i int) float64 {
	if a.PlusOne {
		return 1 + float64(a.Gamma[i])
	}
	return float64(a.Gamma[i])
}

// adapterTensor returns the current float32 value of an adapter tensor (trained, or frozen at its init).
func (t *Trainer) adapterTensor(name string) ([]float32, []int, error) {
	p, ok := t.Train[name]
	if !ok {
		p, ok = t.Adapters.Params[name]
	}
	if !ok {
		return nil, nil, fmt.Errorf("no adapter tensor %q", name)
	}
	v, err := models.Params{name: p}.Float32s(name)
	return v, p.Shape().Dimensions, err
}

// ExportAdapter writes the run's LoRA adapters in PEFT's format to dir: adapter_model.safetensors (keys
// "base_model.model.<module path>.lora_A.weight" [r, in] and ".lora_B.weight" [out, r]) and
// adapter_config.json. Modules trained next to the adapters (TrainModules) are saved as PEFT's
// modules_to_save ("base_model.model.<name>").
//
// Adapters trained on an MS-norm-folded layer live in the folded basis: the layer's input there is z, the norm
// output without its affine, while the original layer sees u = g ∘ z + beta. Since A z = A diag(1/g) (u - beta),
// the exported A is A diag(1/g), exact for RMSNorm; a LayerNorm's beta leaves a constant -s B A diag(1/g) beta
// on the output, exported as lora_B.bias (PEFT's lora_bias option, so PEFT versions without it cannot load
// such an adapter; the merged export has no such restriction). Trained folded modules are unfolded.
func (t *Trainer) ExportAdapter(dir, baseModel string) error {
	if t.Adapters == nil {
		return fmt.Errorf("this run has no adapters (method %q): use the merged export", t.Config.Method)
	}
	out := map[string]*tensors.Tensor{}
	loraBias := false
	var targets []string
	for path := range t.Adapters.Layers {
		targets = append(targets, path)
		a, aDims, err := t.adapterTensor(path + "." + lora.SuffixA)
		if err != nil {
			return err
		}
		b, bDims, err := t.adapterTensor(path + "." + lora.SuffixB)
		if err != nil {
			return err
		}
		var bBias []float64
		if _, has := t.Adapters.Params[path+"."+lora.SuffixBBias]; has {
			v, _, err := t.adapterTensor(path + "." + lora.SuffixBBias)
			if err != nil {
				return err
			}
			bBias = make([]float64, len(v))
			for i, x := range v {
				bBias[i] = float64(x)
			}
		}
		rank, in, outDim := aDims[0], aDims[1], bDims[0]
		affine, folded, err := foldOf(t.Model, path+".weight")
		if err != nil {
			return err
		}
		if folded {
			// A_orig = A diag(1/g); constant from beta: -B A_orig beta.
			for k := 0; k < rank; k++ {
				for i := 0; i < in; i++ {
					a[k*in+i] = float32(float64(a[k*in+i]) / scaleOf(affine, i))
				}
			}
			if nonZero(affine.Beta) {
				if bBias == nil {
					bBias = make([]float64, outDim)
				}
				aBeta := make([]float64, rank)
				for k := 0; k < rank; k++ {
					for i := 0; i < in; i++ {
						aBeta[k] += float64(a[k*in+i]) * float64(affine.Beta[i])
					}
				}
				for o := 0; o < outDim; o++ {
					for k := 0; k < rank; k++ {
						bBias[o] -= float64(b[o*rank+k]) * aBeta[k]
					}
				}
			}
		}
		out[peftPrefix+path+"."+lora.SuffixA] = tensors.FromFlatDataAndDimensions(a, aDims...)
		out[peftPrefix+path+"."+lora.SuffixB] = tensors.FromFlatDataAndDimensions(b, bDims...)
		if bBias != nil {
			loraBias = true
			out[peftPrefix+path+"."+lora.SuffixBBias] = tensors.FromFlatDataAndDimensions(toF32s(bBias), outDim)
		}
	}
	sort.Strings(targets)
	modules, err := t.trainedBaseUnfolded()
	if err != nil {
		return err
	}
	for name, v := range modules {
		out[peftPrefix+name] = v
	}
	settings := map[string]any{
		"peft_type": "LORA", "r": t.Config.LoRARank, "lora_alpha": t.Config.LoRAAlpha, "use_rslora": t.Config.RSLoRA,
		"target_modules": targets, "base_model_name_or_path": baseModel, "bias": "none", "lora_dropout": t.Config.LoRADropout,
		"fan_in_fan_out": false, "inference_mode": true, "init_lora_weights": true, "use_dora": false,
		"lora_bias": loraBias, "revision": nil, "modules_to_save": nil, "task_type": nil,
	}
	if len(t.Config.TrainModules) > 0 {
		settings["modules_to_save"] = t.Config.TrainModules
	}
	if task := t.Model.Task(); task != "" {
		settings["task_type"] = task
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := safetensors.WriteTensors(filepath.Join(dir, AdapterWeights), out, "", nil); err != nil {
		return err
	}
	return writeJSON(filepath.Join(dir, AdapterConfig), settings)
}

func nonZero(v []float32) bool {
	for _, x := range v {
		if x != 0 {
			return true
		}
	}
	return false
}

func toF32s(v []float64) []float32 {
	out := make([]float32, len(v))
	for i, x := range v {
		out[i] = float32(x)
	}
	return out
}

func writeJSON(path string, v any) error {
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return safetensors.WriteAtomic(path, func(w *bufio.Writer) error {
		_, err := w.Write(append(data, '\n'))
		return err
	})
}

// trainedBaseUnfolded returns the trained base tensors (not adapters) in the original basis: a folded linear
// layer's weight and bias are unfolded with msnorm.Unfold.
func (t *Trainer) trainedBaseUnfolded() (models.Params, error) {
	base := models.Params{}
	for name, p := range t.Train {
		if t.Adapters != nil {
			if _, isAdapter := t.Adapters.Params[name]; isAdapter {
				continue
			}
		}
		base[name] = p
	}
	return t.unfoldAll(base, true)
}

// unfoldAll unfolds, in p, every linear layer that MS-norm folded (only those present in p when partial). The
// norm tensors themselves are not added.
func (t *Trainer) unfoldAll(p models.Params, partial bool) (models.Params, error) {
	out := models.Params{}
	for n, v := range p {
		out[n] = v
	}
	if len(t.Model.Folded()) == 0 {
		return out, nil
	}
	for _, f := range t.Model.Folds() {
		for _, l := range f.Linears {
			if _, ok := p[l.Weight]; !ok {
				if partial {
					continue
				}
				return nil, fmt.Errorf("missing %s to unfold", l.Weight)
			}
			affine, _, err := foldOf(t.Model, l.Weight)
			if err != nil {
				return nil, err
			}
			w, err := p.Float32s(l.Weight)
			if err != nil {
				return nil, err
			}
			dims := p.Dims(l.Weight)
			var b []float32
			if _, ok := p[l.Bias]; ok && l.Bias != "" {
				if b, err = p.Float32s(l.Bias); err != nil {
					return nil, err
				}
			}
			d, err := msnorm.Unfold(affine, msnorm.Dense{Out: dims[0], In: dims[1], W: w, B: b})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", l.Weight, err)
			}
			out[l.Weight] = tensors.FromFlatDataAndDimensions(d.W, dims...)
			if d.B != nil {
				out[l.Bias] = tensors.FromFlatDataAndDimensions(d.B, dims[0])
			}
		}
	}
	return out, nil
}

// ExportMerged writes a full Hugging Face checkpoint of the trained model to dir (config.json and
// model.safetensors): adapters merged into their layers (W + s B A, and s b_B into the bias), MS-norm folding
// undone (norm weights and biases restored, linear layers unfolded), so transformers and memfit's plain model
// load it unchanged. A bias that folding added to a layer the architecture has without one must be zero (up to
// rounding) and is dropped; otherwise the merged export is refused.
func (t *Trainer) ExportMerged(dir string) error {
	// QLoRA: the merge goes into the dequantised NF4 base (what the adapters were trained over), not into the
	// original float weights.
	p, err := dequantizeAll(t.Model.Params(), t.Model.LinearLayers())
	if err != nil {
		return err
	}
	for name, v := range t.Train {
		if t.Adapters != nil {
			if _, isAdapter := t.Adapters.Params[name]; isAdapter {
				continue
			}
		}
		p[name] = v
	}
	if t.Adapters != nil {
		scale := (lora.Config{Rank: t.Config.LoRARank, Alpha: t.Config.LoRAAlpha, RSLoRA: t.Config.RSLoRA}).Scale()
		for path := range t.Adapters.Layers {
			a, aDims, err := t.adapterTensor(path + "." + lora.SuffixA)
			if err != nil {
				return err
			}
			b, bDims, err := t.adapterTensor(path + "." + lora.SuffixB)
			if err != nil {
				return err
			}
			w, err := p.Float32s(path + ".weight")
			if err != nil {
				return err
			}
			rank, in, outDim := aDims[0], aDims[1], bDims[0]
			row := make([]float64, in)
			for o := 0; o < outDim; o++ {
				for i := range row {
					row[i] = 0
				}
				for k := 0; k < rank; k++ {
					bk := float64(b[o*rank+k])
					if bk == 0 {
						continue
					}
					ak := a[k*in : (k+1)*in]
					for i, av := range ak {
						row[i] += bk * float64(av)
					}
				}
				for i := range row {
					w[o*in+i] = float32(float64(w[o*in+i]) + scale*row[i])
				}
			}
			p[path+".weight"] = tensors.FromFlatDataAndDimensions(w, outDim, in)
			if _, has := t.Adapters.Params[path+"."+lora.SuffixBBias]; has {
				bb, _, err := t.adapterTensor(path + "." + lora.SuffixBBias)
				if err != nil {
					return err
				}
				var bias []float32
				if _, ok := p[path+".bias"]; ok {
					if bias, err = p.Float32s(path + ".bias"); err != nil {
						return err
					}
				} else {
					bias = make([]float32, outDim)
				}
				for o := range bias {
					bias[o] = float32(float64(bias[o]) + scale*float64(bb[o]))
				}
				p[path+".bias"] = tensors.FromFlatDataAndDimensions(bias, outDim)
			}
		}
	}
	unfolded, err := t.unfoldAll(p, false)
	if err != nil {
		return err
	}
	for name, v := range t.Model.Folded() {
		unfolded[name] = v
	}
	shapes := t.Model.Shapes()
	for _, name := range unfolded.Names() {
		if _, ok := shapes[name]; ok {
			continue
		}
		v, err := unfolded.Float32s(name)
		if err != nil {
			return err
		}
		for _, x := range v {
			if math.Abs(float64(x)) > 1e-5 {
				return fmt.Errorf("cannot merge: %s is not part of the architecture and is not zero (a norm bias folded into a layer without bias)", name)
			}
		}
		delete(unfolded, name)
	}
	if err := models.CheckShapes(unfolded, shapes); err != nil {
		return fmt.Errorf("merged model: %w", err)
	}
	config, err := t.Model.ConfigJSON()
	if err != nil {
		return err
	}
	return models.SaveCheckpoint(dir, config, unfolded, 0)
}

// ImportAdapter reads a PEFT LoRA adapter (adapter_config.json and adapter_model.safetensors) for model and
// returns it as a lora.Set with its LoRA settings. When model was loaded with MS-norm, the adapter is moved into
// the folded basis (A diag(g), and B A beta into lora_B.bias), the inverse of ExportAdapter.
func ImportAdapter(dir string, model Model) (*lora.Set, lora.Config, error) {
	raw, err := os.ReadFile(filepath.Join(dir, AdapterConfig))
	if err != nil {
		return nil, lora.Config{}, err
	}
	var cfg struct {
		PeftType      string   `json:"peft_type"`
		R             int      `json:"r"`
		Alpha         float64  `json:"lora_alpha"`
		RSLoRA        bool     `json:"use_rslora"`
		UseDoRA       bool     `json:"use_dora"`
		FanInFanOut   bool     `json:"fan_in_fan_out"`
		ModulesToSave []string `json:"modules_to_save"`
	}
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return nil, lora.Config{}, fmt.Errorf("%s: %w", filepath.Join(dir, AdapterConfig), err)
	}
	if cfg.PeftType != "LORA" || cfg.UseDoRA || cfg.FanInFanOut {
		return nil, lora.Config{}, fmt.Errorf("%s: only plain LoRA adapters can be imported (peft_type %q, use_dora %v, fan_in_fan_out %v)", dir, cfg.PeftType, cfg.UseDoRA, cfg.FanInFanOut)
	}
	if cfg.Alpha == 0 {
		cfg.Alpha = 8 // PEFT's default
	}
	lc := lora.Config{Rank: cfg.R, Alpha: cfg.Alpha, RSLoRA: cfg.RSLoRA}
	if err := lc.Validate(); err != nil {
		return nil, lora.Config{}, fmt.Errorf("%s: %w", dir, err)
	}
	f, err := safetensors.Open(filepath.Join(dir, AdapterWeights))
	if err != nil {
		return nil, lora.Config{}, err
	}
	defer f.Close()
	layers := map[string]models.LinearLayer{}
	for _, l := range model.LinearLayers() {
		layers[l.Path] = l
	}
	set := &lora.Set{Layers: map[string]models.LinearLayer{}, Adapters: map[string]lora.Adapter{}, Params: models.Params{}}
	for _, key := range f.Names() {
		if !strings.HasPrefix(key, peftPrefix) {
			return nil, lora.Config{}, fmt.Errorf("%s: key %q does not start with %q", dir, key, peftPrefix)
		}
		name := key[len(peftPrefix):]
		var path, suffix string
		for _, s := range []string{lora.SuffixA, lora.SuffixB, lora.SuffixBBias} {
			if strings.HasSuffix(name, "."+s) {
				path, suffix = strings.TrimSuffix(name, "."+s), s
			}
		}
		if path == "" {
			continue // modules_to_save tensors: handled by the caller if it wants them
		}
		l, ok := layers[path]
		if !ok {
			return nil, lora.Config{}, fmt.Errorf("%s: adapter for %q, which is not a linear layer of this model", dir, path)
		}
		v, err := f.TensorAs(key, dtypes.Float32)
		if err != nil {
			return nil, lora.Config{}, err
		}
		set.Layers[path] = l
		set.Adapters[path] = &lora.LoRA{Config: lc}
		set.Params[path+"."+suffix] = v
	}
	if len(set.Layers) == 0 {
		return nil, lora.Config{}, fmt.Errorf("%s: no LoRA tensors", dir)
	}
	for path := range set.Layers {
		affine, folded, err := foldOf(model, path+".weight")
		if err != nil {
			return nil, lora.Config{}, err
		}
		if !folded {
			continue
		}
		a, _ := set.Params.Float32s(path + "." + lora.SuffixA)
		b, _ := set.Params.Float32s(path + "." + lora.SuffixB)
		aDims, bDims := set.Params.Dims(path+"."+lora.SuffixA), set.Params.Dims(path+"."+lora.SuffixB)
		rank, in, outDim := aDims[0], aDims[1], bDims[0]
		if nonZero(affine.Beta) {
			// u = g z + beta: B A u = B (A diag(g)) z + B A beta.
			bias := make([]float64, outDim)
			if bb, err := set.Params.Float32s(path + "." + lora.SuffixBBias); err == nil {
				for o := range bias {
					bias[o] = float64(bb[o])
				}
			}
			aBeta := make([]float64, rank)
			for k := 0; k < rank; k++ {
				for i := 0; i < in; i++ {
					aBeta[k] += float64(a[k*in+i]) * float64(affine.Beta[i])
				}
			}
			for o := 0; o < outDim; o++ {
				for k := 0; k < rank; k++ {
					bias[o] += float64(b[o*rank+k]) * aBeta[k]
				}
			}
			set.Params[path+"."+lora.SuffixBBias] = tensors.FromFlatDataAndDimensions(toF32s(bias), outDim)
		}
		for k := 0; k < rank; k++ {
			for i := 0; i < in; i++ {
				a[k*in+i] = float32(float64(a[k*in+i]) * scaleOf(affine, i))
			}
		}
		set.Params[path+"."+lora.SuffixA] = tensors.FromFlatDataAndDimensions(a, aDims...)
	}
	return set, lc, nil
}
