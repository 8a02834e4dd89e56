package finetune

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/internal/readfile"
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
	return models.NormOf(m.Folds(), m.Folded(), weight)
}

// layerTensors returns the float32 tensors of the adapter of the layer at path, by suffix: trained values from
// t.Train, frozen ones from the set.
func (t *Trainer) layerTensors(path string) (models.Params, error) {
	out := models.Params{}
	for suffix, v := range t.Adapters.LayerParams(path, t.Train) {
		f, err := models.Params{suffix: v}.Float32s(suffix)
		if err != nil {
			return nil, fmt.Errorf("adapter tensor %s.%s: %w", path, suffix, err)
		}
		out[suffix] = tensors.FromFlatDataAndDimensions(f, v.Shape().Dimensions...)
	}
	return out, nil
}

// ExportAdapter writes the run's adapters in PEFT's format to dir: adapter_model.safetensors, each tensor keyed
// "base_model.model.<module path>.<suffix>" with the suffixes the adapter names its tensors by, and
// adapter_config.json (the adapter's PEFTConfig over the common keys). Modules
// trained next to the adapters (TrainModules) are saved as PEFT's modules_to_save ("base_model.model.<name>").
//
// Adapters trained on an MS-norm-folded layer live in the folded basis; each is moved to the original one with
// its UnfoldInput (msnorm's change of input basis). Trained folded modules are unfolded.
func (t *Trainer) ExportAdapter(dir, baseModel string) error {
	return t.ExportAdapterAt(dir, baseModel, "")
}

// ExportAdapterAt is ExportAdapter for a base model at a revision of its Hub repository (the commit it was
// trained from): adapter_config.json's revision, which PEFT loads the base model at.
func (t *Trainer) ExportAdapterAt(dir, baseModel, revision string) error {
	if t.Adapters == nil {
		return fmt.Errorf("this run has no adapters (method %q): use the merged export", t.Config.Method)
	}
	if err := t.sharedNormsExportable(); err != nil {
		return err
	}
	out := map[string]*tensors.Tensor{}
	suffixes := map[string]bool{}
	var peft map[string]any
	for _, path := range t.Adapters.Paths() {
		a, layer := t.Adapters.Adapters[path], t.Adapters.Layers[path]
		params, err := t.layerTensors(path)
		if err != nil {
			return err
		}
		if norm, folded, err := foldOf(t.Model, path+".weight"); err != nil {
			return err
		} else if folded {
			base, err := BaseWeights(t.Model)(layer)()
			if err != nil {
				return err
			}
			if params, err = a.UnfoldInput(layer, params, adapter.FoldedInput{Norm: norm, Base: base}); err != nil {
				return fmt.Errorf("exporting the %s adapter of %s in PEFT's format: %w (the merged export has no such limit)", a.Type(), path, err)
			}
		}
		for suffix, v := range params {
			out[peftPrefix+path+"."+suffix] = v
			suffixes[suffix] = true
		}
	}
	if suffixes[lora.SuffixBBias] {
		// PEFT's lora_bias is one flag for the whole adapter: every LoRA layer has a bias of B. Layers whose change
		// of basis gave none (no norm with a shift before them) get a zero one.
		for _, path := range t.Adapters.Paths() {
			key := peftPrefix + path + "." + lora.SuffixBBias
			if _, ok := out[key]; !ok && t.Adapters.Adapters[path].Type() == "LORA" && out[peftPrefix+path+"."+lora.SuffixB] != nil {
				out[key] = tensors.FromFlatDataAndDimensions(make([]float32, t.Adapters.Layers[path].Out), t.Adapters.Layers[path].Out)
			}
		}
	}
	names := make([]string, 0, len(suffixes))
	for s := range suffixes {
		names = append(names, s)
	}
	sort.Strings(names)
	for _, path := range t.Adapters.Paths() {
		c := t.Adapters.Adapters[path].PEFTConfig(names)
		if peft == nil {
			peft = c
		} else if fmt.Sprint(c) != fmt.Sprint(peft) {
			return fmt.Errorf("the adapters of this run have different settings (%v, %v): PEFT's adapter_config.json holds one", peft, c)
		}
	}
	modules, err := t.trainedBaseUnfolded()
	if err != nil {
		return err
	}
	for name, v := range modules {
		out[peftPrefix+name] = v
	}
	settings := map[string]any{
		adapter.KeyTargets: t.Adapters.Paths(), adapter.KeyBaseModel: baseModel, "inference_mode": true,
		"revision": nil, adapter.KeyModulesToSave: nil, adapter.KeyTaskType: nil,
	}
	if revision != "" {
		settings["revision"] = revision
	}
	for k, v := range peft {
		settings[k] = v
	}
	if len(t.Config.TrainModules) > 0 {
		settings[adapter.KeyModulesToSave] = t.Config.TrainModules
	}
	if task := t.Model.Task(); task != "" {
		settings[adapter.KeyTaskType] = task
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := safetensors.WriteTensors(filepath.Join(dir, AdapterWeights), out, "", nil); err != nil {
		return err
	}
	return writeJSON(filepath.Join(dir, AdapterConfig), settings)
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

// sharedNormsExportable refuses a PEFT export that cannot be exact: under MS-norm, a post-LN norm whose affine
// the residual stream still uses (a Shared fold) trained while a layer folded with its starting affine did not.
// The run's model computes that layer from the starting affine; PEFT's base model would apply the trained norm
// to it. The merged export unfolds with the trained norm and has no such limit.
func (t *Trainer) sharedNormsExportable() error {
	for _, f := range t.Model.Folds() {
		if !f.Shared {
			continue
		}
		_, gamma := t.Train[f.Gamma]
		_, beta := t.Train[f.Beta]
		if !gamma && !beta {
			continue
		}
		for _, l := range f.Linears {
			if _, ok := t.Train[l.Weight]; !ok {
				return fmt.Errorf("%s trained under ms_norm while %s, which ms_norm folded it into, did not: a PEFT adapter cannot hold that exactly; use the merged export, or train without ms_norm", strings.TrimSuffix(f.Gamma, ".weight"), strings.TrimSuffix(l.Weight, ".weight"))
			}
		}
	}
	return nil
}

// trainedBaseUnfolded returns the trained base tensors (not adapters) in the original basis: a folded linear
// layer's weight and bias are unfolded with msnorm.Unfold.
func (t *Trainer) trainedBaseUnfolded() (models.Params, error) {
	base := models.Params{}
	for name, p := range t.Train {
		if !t.isAdapterTensor(name) {
			base[name] = p
		}
	}
	return t.unfoldAll(base, true)
}

func (t *Trainer) isAdapterTensor(name string) bool {
	if t.Adapters == nil {
		return false
	}
	_, ok := t.Adapters.Params[name]
	return ok
}

// denseOf returns the linear layer l of p as a msnorm.Dense (its bias when p has one).
func denseOf(p models.Params, l models.Linear, out, in int) (msnorm.Dense, error) {
	w, err := p.Float32s(l.Weight)
	if err != nil {
		return msnorm.Dense{}, err
	}
	d := msnorm.Dense{Out: out, In: in, W: w}
	if _, ok := p[l.Bias]; ok && l.Bias != "" {
		if d.B, err = p.Float32s(l.Bias); err != nil {
			return msnorm.Dense{}, err
		}
	}
	return d, nil
}

// setDense writes d into p under l's names (the bias only when d has one).
func setDense(p models.Params, l models.Linear, d msnorm.Dense) {
	p[l.Weight] = tensors.FromFlatDataAndDimensions(d.W, d.Out, d.In)
	if d.B != nil {
		p[l.Bias] = tensors.FromFlatDataAndDimensions(d.B, d.Out)
	}
}

// unfoldAll unfolds, in p, every linear layer that MS-norm folded (models.UndoFolds).
func (t *Trainer) unfoldAll(p models.Params, partial bool) (models.Params, error) {
	return models.UndoFolds(p, t.Model.Folds(), t.Model.Folded(), partial)
}

// ExportMerged writes a full Hugging Face checkpoint of the trained model to dir (config.json and
// model.safetensors): each adapter merged into its layer with its Merge (in the basis the layer was trained in),
// then MS-norm folding undone (norm weights and biases restored, linear layers unfolded), so transformers and
// memfit's plain model load it unchanged. A bias that folding or merging added to a layer the architecture has
// without one must be zero (up to rounding) and is dropped; otherwise the merged export is refused.
func (t *Trainer) ExportMerged(dir string) error {
	merged, err := t.Merged()
	if err != nil {
		return err
	}
	config, err := t.Model.ConfigJSON()
	if err != nil {
		return err
	}
	return models.SaveCheckpoint(dir, config, merged, 0)
}

// ExportMergedModel writes model with the adapters of set (nil: none) merged in as ExportMergedFolder writes a
// run's: for a model folder and a PEFT adapter exported without a training run.
func ExportMergedModel(dir string, model Model, set *adapter.Set, baseModel, tokenizer string) error {
	return (&Trainer{Model: model, Adapters: set, Train: models.Params{}}).ExportMergedFolder(dir, baseModel, tokenizer)
}

// MergedParams returns model's parameters with the adapters of set merged in (Trainer.Merged for a model and
// a PEFT adapter read without a training run; set may be nil).
func MergedParams(model Model, set *adapter.Set) (models.Params, error) {
	return (&Trainer{Model: model, Adapters: set, Train: models.Params{}}).Merged()
}

// Merged returns the trained model's parameters as ExportMerged writes them: float32, by Hugging Face name, in
// the original basis (adapters merged, MS-norm folding undone, a QLoRA base dequantised).
func (t *Trainer) Merged() (models.Params, error) {
	// QLoRA: the merge goes into the dequantised NF4 base (what the adapters were trained over), not into the
	// original float weights.
	p, err := dequantizeAll(t.Model.Params(), t.Model.LinearLayers())
	if err != nil {
		return nil, err
	}
	for name, v := range t.Train {
		if !t.isAdapterTensor(name) {
			p[name] = v
		}
	}
	if t.Adapters != nil {
		for _, path := range t.Adapters.Paths() {
			a, layer := t.Adapters.Adapters[path], t.Adapters.Layers[path]
			params, err := t.layerTensors(path)
			if err != nil {
				return nil, err
			}
			names := models.Linear{Weight: path + ".weight", Bias: path + ".bias"}
			base, err := denseOf(p, names, layer.Out, layer.In)
			if err != nil {
				return nil, err
			}
			merged, err := a.Merge(layer, base, params)
			if err != nil {
				return nil, fmt.Errorf("merging the %s adapter of %s: %w", a.Type(), path, err)
			}
			setDense(p, names, merged)
		}
	}
	unfolded, err := t.unfoldAll(p, false)
	if err != nil {
		return nil, err
	}
	for name, v := range t.Model.Folded() {
		if _, ok := unfolded[name]; !ok { // a shared fold's norm is in p already, as trained
			unfolded[name] = v
		}
	}
	shapes := t.Model.Shapes()
	for _, name := range unfolded.Names() {
		if _, ok := shapes[name]; ok {
			continue
		}
		v, err := unfolded.Float32s(name)
		if err != nil {
			return nil, err
		}
		for _, x := range v {
			if math.Abs(float64(x)) > 1e-5 {
				return nil, fmt.Errorf("cannot merge: %s is not part of the architecture and is not zero (a norm bias folded into a layer without bias)", name)
			}
		}
		delete(unfolded, name)
	}
	if err := models.CheckShapes(unfolded, shapes); err != nil {
		return nil, fmt.Errorf("merged model: %w", err)
	}
	return unfolded, nil
}

// mergedFolderFiles are the files of a Hugging Face model folder, besides its config and weights, that a merged
// export copies from the base model (the tokenizer's from the run's tokenizer when it had its own).
var (
	tokenizerFiles   = []string{"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "tokenizer.model", "special_tokens_map.json"}
	modelFolderFiles = []string{"preprocessor_config.json", GenerationConfig}
)

// GenerationConfig is the generation settings file of a Hugging Face causal-LM folder.
const GenerationConfig = "generation_config.json"

// ExportMergedFolder writes the merged checkpoint (ExportMerged) to dir as a complete Hugging Face folder: the
// tokenizer files (tokenizer.json, tokenizer_config.json and its chat template, chat_template.jinja when the
// model keeps it there, tokenizer.model, special_tokens_map.json) of the
// run's tokenizer (a folder or file; "" for the base model's), and the base model folder's
// preprocessor_config.json and generation_config.json, each where the source has it; a causal LM whose base
// has no generation_config.json gets one made from its config's token ids, as transformers makes it
// (GenerationConfig.from_model_config). Every file is written atomically.
func (t *Trainer) ExportMergedFolder(dir, baseModel, tokenizer string) error {
	if err := t.ExportMerged(dir); err != nil {
		return err
	}
	tokDir, given := baseModel, ""
	if tokenizer != "" {
		tokDir = tokenizer
		if st, err := os.Stat(tokenizer); err == nil && !st.IsDir() {
			tokDir, given = filepath.Dir(tokenizer), filepath.Base(tokenizer)
			if err := copyAtomic(tokenizer, filepath.Join(dir, given)); err != nil {
				return err
			}
		}
	}
	copied := map[string]bool{}
	for _, f := range tokenizerFiles {
		if f == given {
			continue
		}
		if err := copyAtomic(filepath.Join(tokDir, f), filepath.Join(dir, f)); err == nil {
			copied[f] = true
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	for _, f := range modelFolderFiles {
		if err := copyAtomic(filepath.Join(baseModel, f), filepath.Join(dir, f)); err == nil {
			copied[f] = true
		} else if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	if copied[GenerationConfig] {
		return nil
	}
	fam, ok := FamilyOf(t.Model)
	if !ok || fam.GenerationConfig == nil {
		return nil
	}
	gen := fam.GenerationConfig(t.Model)
	if gen == nil {
		return nil
	}
	return writeJSON(filepath.Join(dir, GenerationConfig), gen)
}

// copyAtomic copies the file from to the path to through a temporary file and a rename.
func copyAtomic(from, to string) error {
	b, err := readfile.Read(from, readfile.Tokenizer)
	if err != nil {
		return err
	}
	return safetensors.WriteAtomic(to, func(w *bufio.Writer) error {
		_, err := w.Write(b)
		return err
	})
}

// PEFTAdapter is a PEFT adapter folder read for a model.
type PEFTAdapter struct {
	// Set holds the adapters, in the basis of the model's layers (moved into the folded basis by each adapter's
	// FoldInput when the model was loaded with MS-norm).
	Set *adapter.Set
	// Config is the adapter_config.json.
	Config adapter.PEFTConfig
	// Modules are the modules_to_save tensors by base parameter name (without "base_model.model.").
	Modules models.Params
}

// notAnAdapter says what a folder given as a PEFT adapter is instead (a model, a training checkpoint, a run).
func notAnAdapter(dir string) error {
	has := func(name string) bool { _, err := os.Stat(filepath.Join(dir, name)); return err == nil }
	switch {
	case has("config.json"):
		return fmt.Errorf("%s is a model folder (config.json), not a PEFT adapter (adapter_config.json): give it as --model, and an adapter folder as --adapter", dir)
	case has(StateFile):
		return fmt.Errorf("%s is a training checkpoint, not a PEFT adapter: export it first (finetune export --run RUN --checkpoint N --out DIR)", dir)
	case has(RunFile):
		return fmt.Errorf("%s is a training run folder, not a PEFT adapter: its adapter is in %s", dir, filepath.Join(dir, "adapter"))
	}
	return fmt.Errorf("%s is not a PEFT adapter folder: it has no %s", dir, AdapterConfig)
}

// ReadAdapter reads the PEFT adapter folder dir (adapter_config.json and adapter_model.safetensors) for model:
// the registered format that reads its config (adapter.FormatOf: LoRA, or a custom adapter's) makes one
// adapter per adapted layer; every key is either a base parameter of the model in one of modules_to_save, or
// "<linear layer path>.<adapter suffix>".
//
// The config and the weights must agree, as PEFT's loading assumes: the layers with adapter tensors are exactly
// those target_modules, exclude_modules and layers_to_transform select (adapter.Targeting; a target_modules
// name or expression that matches no linear layer of the model is refused, naming it), each holds exactly the
// tensors a fresh adapter of the config has (in the same shapes: the per-layer ranks of rank_pattern), and every
// module in modules_to_save has its tensors in the file (they replace the model's). Anything else is an error
// naming what disagrees.
func ReadAdapter(dir string, model Model) (*PEFTAdapter, error) {
	raw, err := readfile.Read(filepath.Join(dir, AdapterConfig), readfile.Config)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, notAnAdapter(dir)
	}
	if err != nil {
		return nil, err
	}
	cfg, err := adapter.ParsePEFTConfig(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, AdapterConfig), err)
	}
	format, err := adapter.FormatOf(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	newAdapter, err := format.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s (%s adapter): %w", filepath.Join(dir, AdapterConfig), format.Name, err)
	}
	targeting, err := cfg.Targeting()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, AdapterConfig), err)
	}
	if missing := targeting.Unmatched(model.LinearLayers()); len(missing) > 0 {
		named := strings.Join(missing, ", ")
		if len(missing) > 3 { // an adapter of another family misses every module: name a few
			named = fmt.Sprintf("%s and %d more", strings.Join(missing[:3], ", "), len(missing)-3)
		}
		return nil, fmt.Errorf("%s: target_modules names %s, which match no linear layer of this model (module names end in: %s): the adapter belongs to another model",
			filepath.Join(dir, AdapterConfig), named, strings.Join(adapter.ModuleNames(model.LinearLayers()), ", "))
	}
	if ignored := targeting.LayerFilterIgnored(model.LinearLayers()); len(ignored) > 0 {
		return nil, fmt.Errorf("%s: layers_to_transform %v leaves out %s, which target_modules names by its whole path (PEFT adapts it anyway): the config contradicts itself; name the modules by their last components (e.g. q_proj) or list only the layers wanted",
			filepath.Join(dir, AdapterConfig), targeting.Layers, ignored[0])
	}
	toSave, err := cfg.Strings(adapter.KeyModulesToSave)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, AdapterConfig), err)
	}
	f, err := safetensors.Open(filepath.Join(dir, AdapterWeights))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	layers := map[string]models.LinearLayer{}
	for _, l := range model.LinearLayers() {
		layers[l.Path] = l
	}
	base := model.Shapes()
	out := &PEFTAdapter{Config: cfg, Modules: models.Params{},
		Set: &adapter.Set{Layers: map[string]models.LinearLayer{}, Adapters: map[string]adapter.Adapter{}, Params: models.Params{}}}
	for _, key := range f.Names() {
		if !strings.HasPrefix(key, peftPrefix) {
			return nil, fmt.Errorf("%s: key %q does not start with %q", dir, key, peftPrefix)
		}
		name := key[len(peftPrefix):]
		v, err := f.TensorAs(key, dtypes.Float32)
		if err != nil {
			return nil, err
		}
		if err := models.CheckFinite(v, key); err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(dir, AdapterWeights), err)
		}
		if _, ok := base[name]; ok {
			if _, saved := adapter.ModulesToSave(name, toSave); !saved {
				return nil, fmt.Errorf("%s: %s holds %q, a parameter of the model in no module of modules_to_save (%v): PEFT would not load it",
					dir, AdapterWeights, key, toSave)
			}
			out.Modules[name] = v
			continue
		}
		path := ""
		for p := range layers {
			if strings.HasPrefix(name, p+".") && len(p) > len(path) {
				path = p
			}
		}
		if path == "" {
			return nil, fmt.Errorf("%s: tensor %q belongs to no linear layer of this model and is not one of its parameters", dir, name)
		}
		out.Set.Layers[path] = layers[path]
		out.Set.Params[name] = v
	}
	if len(out.Set.Layers) == 0 {
		return nil, fmt.Errorf("%s: no %s adapter tensors", dir, format.Name)
	}
	for _, m := range toSave {
		inModel, found := false, false
		for name := range base {
			if got, _ := adapter.ModulesToSave(name, []string{m}); got == m {
				inModel = true
				_, found = out.Modules[name]
				if found {
					break
				}
			}
		}
		// A name that matches no module of this model is one PEFT wraps nothing for (its sequence classifiers
		// add both "classifier" and "score"): nothing to load.
		if inModel && !found {
			return nil, fmt.Errorf("%s: modules_to_save names %q but %s holds none of its tensors (a module of the model whose path ends in %q)",
				dir, m, AdapterWeights, m)
		}
	}
	for _, l := range model.LinearLayers() {
		_, has := out.Set.Layers[l.Path]
		switch want := targeting.Selects(l); {
		case has && !want:
			return nil, fmt.Errorf("%s: %s holds tensors for %s, which target_modules, exclude_modules and layers_to_transform leave out: the config and the weights disagree",
				dir, AdapterWeights, l.Path)
		case want && !has:
			return nil, fmt.Errorf("%s: target_modules selects %s but %s has no tensors for it: the config and the weights disagree",
				dir, l.Path, AdapterWeights)
		}
	}
	bases := BaseWeights(model)
	for _, path := range out.Set.Paths() {
		l := out.Set.Layers[path]
		a := newAdapter(l)
		out.Set.Adapters[path] = a
		// The tensors a fresh adapter with these settings has must all be here, in the same shapes, and no others
		// (PEFT would leave them out: lora_B.bias without lora_bias).
		fresh, err := a.Init(l, bases(l), rand.New(rand.NewPCG(0, 0)))
		if err != nil {
			return nil, fmt.Errorf("%s: %s adapter for %s: %w", dir, format.Name, path, err)
		}
		for suffix := range out.Set.LayerParams(path, nil) {
			if _, ok := fresh[suffix]; !ok {
				return nil, fmt.Errorf("%s: tensor %q is not one that adapter_config.json implies (%s: %s; lora_B.bias goes with lora_bias true): PEFT would leave it out",
					dir, peftPrefix+path+"."+suffix, format.Chosen(), strings.Join(slices.Sorted(maps.Keys(fresh)), ", "))
			}
		}
		for _, suffix := range slices.Sorted(maps.Keys(fresh)) {
			want := fresh[suffix]
			got, ok := out.Set.Params[path+"."+suffix]
			if !ok {
				return nil, fmt.Errorf("%s: no tensor %q, which adapter_config.json implies (%s)", dir, peftPrefix+path+"."+suffix, format.Chosen())
			}
			if !slices.Equal(got.Shape().Dimensions, want.Shape().Dimensions) {
				return nil, fmt.Errorf("%s: tensor %q has shape %v, but adapter_config.json implies %v (%s; its r, or its rank_pattern entry for this layer)",
					dir, peftPrefix+path+"."+suffix, got.Shape().Dimensions, want.Shape().Dimensions, format.Chosen())
			}
		}
		norm, folded, err := foldOf(model, path+".weight")
		if err != nil {
			return nil, err
		}
		if !folded {
			continue
		}
		params := out.Set.LayerParams(path, nil)
		base, err := bases(l)()
		if err != nil {
			return nil, err
		}
		moved, err := a.FoldInput(l, params, adapter.FoldedInput{Norm: norm, Base: base})
		if err != nil {
			return nil, fmt.Errorf("%s: the %s adapter of %s cannot be used with MS-norm: %w", dir, a.Type(), path, err)
		}
		for suffix := range params {
			delete(out.Set.Params, path+"."+suffix)
		}
		for suffix, v := range moved {
			out.Set.Params[path+"."+suffix] = v
		}
	}
	return out, nil
}

// ImportAdapter reads a PEFT adapter folder for model (ReadAdapter) and returns its adapters and config.
func ImportAdapter(dir string, model Model) (*adapter.Set, adapter.PEFTConfig, error) {
	a, err := ReadAdapter(dir, model)
	if err != nil {
		return nil, nil, err
	}
	return a.Set, a.Config, nil
}
