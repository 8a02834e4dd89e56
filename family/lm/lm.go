// Package lm turns the shared decoder graph (models/decoder) into finetune families: a decoder family's package
// (family/llama, family/qwen, ...) describes what is its own in a Spec (its model_type, its config.json decoder
// and writer, its presets, its GGUF architecture) and registers it with Register from its init function; this
// package gives every such family the same trainable Model (causal LM or sequence classifier), text data, batch
// checks, planner shapes, random batches and weights, cut and cost model, generation config, classification head
// and GGUF export and import.
package lm

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"

	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/gguf"
	"github.com/memfit/memfit/gguf/llamagguf"
	"github.com/memfit/memfit/loss"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/models/hfconfig"
)

// Spec is what makes a decoder family its own: everything else is the shared graph's and this package's.
type Spec struct {
	// Name is the config.json model_type (and the preset prefix: "llama:tiny"); Title its name in messages.
	Name, Title string
	// Decode reads a config.json of the family (s itself, so that one function serves several families of a
	// package) into the decoder's Config (decoder.ReadCommon reads the shared fields; the family reads its own
	// and refuses what memfit does not build).
	Decode func(s *Spec, f hfconfig.Fields) (decoder.Config, error)
	// JSON writes a Config of the family as its config.json, as transformers writes it.
	JSON func(s *Spec, c decoder.Config) ([]byte, error)
	// Presets are named shapes of the family's models for the planner and finetune init (causal LMs; Preset
	// sets their token ids and task).
	Presets map[string]decoder.Config
	// GGUFArch is llama.cpp's general.architecture for the family ("" when llama.cpp has none: no GGUF export).
	GGUFArch string
	// CausalLM and Classifier are the family's transformers classes (config.json's "architectures"):
	// "LlamaForCausalLM", "LlamaForSequenceClassification".
	CausalLM, Classifier string
}

// ReadHead reads config.json's "architectures" into c's task (one of s's classes; none: a causal LM).
func (s *Spec) ReadHead(d *hfconfig.Decoder, c *decoder.Config) {
	if hfconfig.Architecture(d, s.CausalLM, s.Classifier) == s.Classifier {
		c.Task = decoder.SequenceClassification
	}
}

// Fields returns the config.json fields every family writes for c: the shared ones (Config.CommonJSON), its
// model_type and its class in "architectures". A family's JSON adds its own and marshals them (hfconfig.Marshal).
func (s *Spec) Fields(c decoder.Config) map[string]any {
	f := c.CommonJSON()
	f["model_type"] = s.Name
	f["architectures"] = []string{s.CausalLM}
	if c.Classifier() {
		f["architectures"] = []string{s.Classifier}
	}
	return f
}

// Activation reads the MLP activation from the first of fields the config has (Gemma's "hidden_activation",
// "hidden_act") into c (allowed holds the names a family takes and what they mean); any of them naming an
// activation the family does not build is the decoder's error naming the field. Absent, c keeps its default.
func Activation(d *hfconfig.Decoder, c *decoder.Config, allowed map[string]string, fields ...string) {
	found := false
	for _, f := range fields {
		var act string
		if !d.Get(f, &act) {
			continue
		}
		a, ok := allowed[act]
		switch {
		case !ok:
			names := slices.Sorted(maps.Keys(allowed))
			d.Fail("field %q is %q: memfit builds this family with %v", f, act, names)
			return
		case !found:
			c.Activation, found = a, true
		}
	}
}

// Nullable reads a number field that transformers' config class defaults to def when absent and that null turns
// off (sliding_window, the soft-caps): absent gives def, null 0, a value itself.
func Nullable[T int | float64](d *hfconfig.Decoder, field string, def T) T {
	v := def
	if d.IsNull(field) {
		v = 0
	}
	d.Get(field, &v)
	return v
}

// NoDropout refuses non-zero dropout probabilities in fields (memfit trains without dropout in the base model).
func NoDropout(d *hfconfig.Decoder, fields ...string) {
	for _, f := range fields {
		var p float64
		if d.Get(f, &p) && p != 0 {
			d.Fail("field %q is %g: dropout is not supported, set it to 0", f, p)
		}
	}
}

// LayerTypes reads "layer_types" (transformers 4.5x and later: "full_attention" or "sliding_attention" per
// layer) into c.Sliding, and reports whether the config has it.
func LayerTypes(d *hfconfig.Decoder, c *decoder.Config) bool {
	var types []string
	if !d.Get("layer_types", &types) {
		return false
	}
	c.Sliding = make([]bool, len(types))
	for i, t := range types {
		switch t {
		case "sliding_attention":
			c.Sliding[i] = true
		case "full_attention":
		default:
			d.Fail("field \"layer_types\" holds %q: memfit builds full_attention and sliding_attention layers", t)
			return true
		}
	}
	return true
}

// SlidingFields returns the config.json fields of c's attention layout: sliding_window (null without sliding
// layers) and layer_types.
func SlidingFields(c decoder.Config) map[string]any {
	types := make([]string, c.NumHiddenLayers)
	var window any
	for i := range types {
		types[i] = "full_attention"
		if c.IsSliding(i) {
			types[i], window = "sliding_attention", c.SlidingWindow
		}
	}
	return map[string]any{"sliding_window": window, "layer_types": types}
}

// decode is s.Decode of s.
func (s *Spec) decode(f hfconfig.Fields) (decoder.Config, error) { return s.Decode(s, f) }

// ConfigJSON writes c as the family's config.json (s.JSON).
func (s *Spec) ConfigJSON(c decoder.Config) ([]byte, error) { return s.JSON(s, c) }

// LoadConfig reads and decodes dir/config.json with s.Decode.
func (s *Spec) LoadConfig(dir string) (decoder.Config, error) {
	return hfconfig.LoadWith(dir, s.decode)
}

// ParseConfig decodes config.json bytes with s.Decode.
func (s *Spec) ParseConfig(data []byte) (decoder.Config, error) {
	return hfconfig.ParseWith(data, s.decode)
}

// Load reads a model folder of the family in the modes of opts.
func (s *Spec) Load(dir string, opts decoder.Options) (*decoder.Model, error) {
	return decoder.Load(dir, s.decode, opts)
}

// Preset returns the named preset as a causal LM (bos 1, eos 2, no pad), or as a sequence classifier with
// numLabels generic labels (LABEL_i) when numLabels > 0 (pad token 0).
func (s *Spec) Preset(name string, numLabels int) (decoder.Config, error) {
	c, err := hfconfig.Preset(s.Presets, s.Title, name)
	if err != nil {
		return decoder.Config{}, err
	}
	c.PadTokenID, c.BOSTokenID, c.EOSTokenID, c.EOSTokenIDs = -1, 1, 2, []int{2}
	c.Task = decoder.CausalLM
	if c.Activation == "" {
		c.Activation = decoder.ActSiLU
	}
	if numLabels > 0 {
		c.Task = decoder.SequenceClassification
		c.PadTokenID = 0
		c.Labels = hfconfig.GenericLabels(numLabels)
	}
	return c, c.Validate()
}

// Register registers the families of specs with finetune (call it from the family package's init function).
func Register(specs ...*Spec) {
	for _, s := range specs {
		finetune.RegisterFamily(Family(s))
	}
}

// Family returns the finetune family of s.
func Family(s *Spec) finetune.Family {
	wrap := func(c decoder.Config, opts finetune.ModelOptions) finetune.Model {
		return Model{Model: &decoder.Model{Config: c, Options: opts.Model()}, Spec: s}
	}
	f := finetune.Family{
		Name:  s.Name,
		Title: s.Title,
		Of:    func(m finetune.Model) bool { l, ok := m.(Model); return ok && l.Spec.Name == s.Name },
		Load: func(dir string, opts finetune.ModelOptions) (finetune.Model, error) {
			m, err := s.Load(dir, opts.Model())
			if err != nil {
				return nil, err
			}
			return Model{Model: m, Spec: s}, nil
		},
		Rebuild: func(m finetune.Model, params models.Params, msNorm bool) (finetune.Model, error) {
			return m.(Model).rebuild(params, msNorm)
		},
		RandomParams: func(m finetune.Model, seed uint64) models.Params {
			return decoder.RandomParams(m.(Model).Config, seed)
		},
		Shaped: func(dir string, opts finetune.ModelOptions) (finetune.Model, error) {
			c, err := s.LoadConfig(dir)
			if err != nil {
				return nil, err
			}
			return wrap(c, opts), nil
		},
		Preset: func(name string, labels int, opts finetune.ModelOptions) (finetune.Model, error) {
			c, err := s.Preset(name, labels)
			if err != nil {
				return nil, err
			}
			return wrap(c, opts), nil
		},
		Presets:  slices.Sorted(maps.Keys(s.Presets)),
		Sequence: true,
		BatchShapes: func(m finetune.Model, in finetune.Shape) (map[string]shapes.Shape, error) {
			out := map[string]shapes.Shape{
				"input_ids":      shapes.Make(dtypes.Int32, in.Batch, in.Seq),
				"attention_mask": shapes.Make(dtypes.Int32, in.Batch, in.Seq),
				"labels":         shapes.Make(dtypes.Int32, in.Batch, in.Seq),
			}
			if m.(Model).Config.Classifier() {
				out["labels"] = shapes.Make(dtypes.Int32, in.Batch)
			} else if in.Packed {
				out["position_ids"] = shapes.Make(dtypes.Int32, in.Batch, in.Seq)
			}
			return out, nil
		},
		RandomBatch:    randomBatch,
		Formats:        finetune.TextFormats,
		OpenData:       finetune.OpenText,
		CheckTokenizer: finetune.CheckTextTokenizer,
		GenerationConfig: func(m finetune.Model) map[string]any {
			c := m.(Model).Config
			if c.Classifier() {
				return nil
			}
			gen := map[string]any{"_from_model_config": true}
			for key, id := range map[string]int{"bos_token_id": c.BOSTokenID, "eos_token_id": c.EOSTokenID, "pad_token_id": c.PadTokenID} {
				if id >= 0 {
					gen[key] = id
				}
			}
			return gen
		},
		Cut: func(m finetune.Model, blocks int) finetune.Model {
			l := m.(Model)
			c := l.Config
			c.NumHiddenLayers = min(blocks, c.NumHiddenLayers)
			if c.Sliding != nil {
				c.Sliding = slices.Clone(c.Sliding[:c.NumHiddenLayers])
			}
			c.VocabSize = min(c.VocabSize, calibrationVocab)
			for _, id := range []*int{&c.PadTokenID, &c.BOSTokenID, &c.EOSTokenID} {
				if *id >= c.VocabSize {
					*id = -1
				}
			}
			c.EOSTokenIDs = slices.DeleteFunc(slices.Clone(c.EOSTokenIDs), func(id int) bool { return id >= c.VocabSize })
			opts := l.Options
			opts.Blocks = nil // the per-block plan is set afterwards, for the cut's blocks
			return Model{Model: &decoder.Model{Config: c, Options: opts}, Spec: s}
		},
		BlockFLOPs: func(m finetune.Model, in finetune.Shape) float64 {
			c := m.(Model).Config
			h, q, kv := float64(c.HiddenSize), float64(c.NumAttentionHeads*c.HeadDim), float64(c.NumKeyValueHeads*c.HeadDim)
			tokens, seq := float64(in.Batch*in.Seq), float64(in.Seq)
			linear := h*q + 2*h*kv + q*h + 3*h*float64(c.IntermediateSize) // q, k, v, o; gate, up, down
			return 2*tokens*linear + 4*tokens*seq*q                        // QK^T and AV over the whole sequence
		},
		NewHead: func(m finetune.Model, labels []string, seed uint64) ([]byte, models.Params, error) {
			c := m.(Model).Config
			if c.PadTokenID < 0 {
				return nil, nil, fmt.Errorf("the model has no pad_token_id: a sequence classifier needs one to find each row's last token")
			}
			params := maps.Clone(m.Params())
			delete(params, decoder.LMHead)
			delete(params, decoder.Score)
			c.Task, c.Labels, c.TieWordEmbeddings = decoder.SequenceClassification, labels, false
			// score.weight normal(0, 0.02), as transformers initialises a new head.
			maps.Copy(params, models.RandomParams(map[string][]int{decoder.Score: {len(labels), c.HiddenSize}}, seed, 0x4ead,
				func(string, []int) models.Init { return models.Init{Std: 0.02} }))
			config, err := s.ConfigJSON(c)
			return config, params, err
		},
	}
	if s.GGUFArch != "" {
		f.GGUFArchs = []string{s.GGUFArch}
		f.GGUF = func(m finetune.Model, params models.Params, o llamagguf.Options) ([]gguf.KV, []gguf.Tensor, error) {
			c := m.(Model).Config
			if c.Classifier() {
				return nil, nil, fmt.Errorf("GGUF export is for causal LMs; this model is a %s sequence classifier", s.Title)
			}
			if err := llamagguf.Check(c, s.GGUFArch); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", s.Title, err)
			}
			if params == nil {
				return nil, nil, nil
			}
			o.Arch, o.ModelType = s.GGUFArch, s.Name
			return llamagguf.Plan(c, params, o)
		}
		f.LoadGGUF = func(path string, opts finetune.ModelOptions) (finetune.Model, error) {
			g, err := llamagguf.Read(path)
			if err != nil {
				return nil, err
			}
			m, err := decoder.New(g.Config, g.Params, opts.Model())
			if err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			return Model{Model: m, Spec: s}, nil
		}
	}
	return f
}

// calibrationVocab is the vocabulary of a decoder cut for the autopilot's calibration (Family.Cut): the
// embedding and the head are outside the blocks, so their size changes no block's time, only the calibration's.
const calibrationVocab = 256

// randomBatch is a batch of random tokens (and random packed documents when in.Packed).
func randomBatch(m finetune.Model, in finetune.Shape, seed uint64) finetune.Batch {
	c := m.(Model).Config
	r := rand.New(rand.NewPCG(seed, 7))
	n := in.Batch * in.Seq
	ids := make([]int32, n)
	mask := make([]int32, n)
	for i := range ids {
		ids[i], mask[i] = int32(r.IntN(c.VocabSize)), 1
	}
	b := finetune.Batch{"input_ids": tensors.FromFlatDataAndDimensions(ids, in.Batch, in.Seq),
		"attention_mask": tensors.FromFlatDataAndDimensions(mask, in.Batch, in.Seq),
		"labels":         tensors.FromFlatDataAndDimensions(append([]int32(nil), ids...), in.Batch, in.Seq)}
	if in.Packed && !c.Classifier() {
		// Documents of random lengths from 1 to the sequence, positions restarting at each.
		pos := make([]int32, n)
		for row := 0; row < in.Batch; row++ {
			p, doc := 0, 1+r.IntN(in.Seq)
			for t := 0; t < in.Seq; t++ {
				if p == doc {
					p, doc = 0, 1+r.IntN(in.Seq)
				}
				pos[row*in.Seq+t] = int32(p)
				p++
			}
		}
		b["position_ids"] = tensors.FromFlatDataAndDimensions(pos, in.Batch, in.Seq)
	}
	return b
}

// Model adapts a models/decoder model of a family of Spec as a finetune.Model: causal language modelling
// (next-token cross entropy, labels [B, T] with -100 for positions to skip, shifted by one inside the loss) or
// sequence classification (labels [B]), given "input_ids" and "attention_mask" [B, T]. Its runner.Decoder
// methods (CacheShapes, Decode) and TextSpec are the decoder's.
type Model struct {
	*decoder.Model
	// Spec is the model's family.
	Spec *Spec
}

// Params returns the model's graph parameters.
func (m Model) Params() models.Params { return m.Model.Params }

// LinearLayers returns the model's linear layers.
func (m Model) LinearLayers() []models.LinearLayer { return decoder.LinearLayers(m.Config) }

// BatchInputs returns attention_mask, input_ids and labels.
func (m Model) BatchInputs() []string { return []string{"attention_mask", "input_ids", "labels"} }

// Logits returns the logits: [B, T, vocab] for the causal LM, [B, labels] for the classifier.
// A batch of packed sequences also has position_ids [B, T] (data.PackExamples): the model then restarts
// positions and keeps attention within each packed example (llama.Model.ForwardPacked).
func (m Model) Logits(b models.Bound, batch map[string]*graph.Node) *graph.Node {
	return m.ForwardPacked(b, batch["input_ids"], batch["attention_mask"], batch["position_ids"]).Logits
}

// Folds lists the model's MS-RMSNorm folds.
func (m Model) Folds() []models.Fold { return decoder.Folds(m.Config) }

// Task returns CAUSAL_LM or SEQ_CLS.
func (m Model) Task() string { return m.Config.Task }

// Shapes returns the checkpoint's parameter shapes.
func (m Model) Shapes() map[string][]int { return decoder.Shapes(m.Config) }

// Loss is the next-token cross entropy (causal LM) or the classification cross entropy.
func (m Model) Loss(b models.Bound, batch map[string]*graph.Node) *graph.Node {
	logits := loss.Float32(m.Logits(b, batch))
	labels := batch["labels"]
	if m.Config.Classifier() {
		if len(m.Config.Labels) == 1 { // regression (as transformers with num_labels 1): mean squared error
			d := graph.Sub(graph.Reshape(logits, logits.Shape().Dim(0)), graph.ConvertDType(labels, dtypes.Float32))
			return graph.ReduceAllMean(graph.Mul(d, d))
		}
		return loss.CrossEntropy(logits, labels, loss.IgnoreIndex)
	}
	n := logits.Shape().Dim(1)
	return loss.CrossEntropy(engine.SliceAxis(logits, 1, 0, n-1), engine.SliceAxis(labels, 1, 1, n), loss.IgnoreIndex)
}

// Folded returns the norm tensors removed by folding.
func (m Model) Folded() models.Params { return m.Model.Folded }

// ConfigJSON returns the model's config.json, as its family writes it.
func (m Model) ConfigJSON() ([]byte, error) { return m.Spec.ConfigJSON(m.Config) }

// BlockModes returns the model's per-block plan and its number of decoder layers.
func (m Model) BlockModes() ([]models.BlockMode, int) {
	return m.Options.Blocks, m.Config.NumHiddenLayers
}

// SetBlockModes sets the model's per-block plan.
func (m Model) SetBlockModes(modes []models.BlockMode) { m.Options.Blocks = modes }

// GradCheckpoint reports the model's model-wide gradient checkpointing.
func (m Model) GradCheckpoint() bool { return m.Options.GradCheckpoint }

func (m Model) rebuild(params models.Params, msNorm bool) (finetune.Model, error) {
	opts := m.Options
	opts.MSNorm = msNorm
	l, err := decoder.New(m.Config, params, opts)
	if err != nil {
		return nil, err
	}
	return Model{Model: l, Spec: m.Spec}, nil
}

// CheckBatch checks a batch: input_ids within the vocabulary and at most max_position_embeddings long,
// attention_mask of 0 and 1, and labels within the vocabulary or -100 (causal LM) or within the classes
// (sequence classification).
func (m Model) CheckBatch(b finetune.Batch) error {
	c := m.Config
	if err := finetune.CheckTokenInputs(b, c.VocabSize, c.MaxPositionEmbeddings, "max_position_embeddings"); err != nil {
		return err
	}
	if pos, ok := b["position_ids"]; ok {
		if c.Classifier() {
			return fmt.Errorf("position_ids: packed sequences are for the causal LM, the model is a sequence classifier")
		}
		if ids, ok := b["input_ids"]; ok && fmt.Sprint(pos.Shape().Dimensions) != fmt.Sprint(ids.Shape().Dimensions) {
			return fmt.Errorf("position_ids has shape %v, input_ids %v: they go together", pos.Shape().Dimensions, ids.Shape().Dimensions)
		}
		if pos.Rank() == 2 {
			if err := models.CheckRange(pos, "position_ids", 0, pos.Shape().Dim(1), "a packed example's positions count from 0 within the sequence"); err != nil {
				return err
			}
		}
	}
	if l, ok := b["labels"]; ok {
		if c.Classifier() {
			return models.CheckRange(l, "labels", 0, len(c.Labels), fmt.Sprintf("the model has %d classes (num_labels)", len(c.Labels)))
		}
		return models.CheckRange(l, "labels", 0, c.VocabSize, fmt.Sprintf(
			"the model's vocabulary has %d tokens (vocab_size), and -100 leaves a position out", c.VocabSize), loss.IgnoreIndex)
	}
	return nil
}

// HasTargets reports whether a causal-LM batch has a token to learn: a label other than -100 at positions 1 and
// on (position 0 predicts nothing). A batch without one gives loss 0 and a zero gradient, yet an optimizer step on
// it would still move the weights (AdamW's moments, weight decay): Fit skips it and counts it. Classification
// batches always have targets.
func (m Model) HasTargets(b finetune.Batch) bool {
	l, ok := b["labels"]
	if !ok || m.Config.Classifier() || l.Rank() != 2 {
		return true
	}
	if dt := l.DType(); dt != dtypes.Int32 && dt != dtypes.Int64 {
		return true // FindInt reads int32 and int64 labels; others are not judged
	}
	n := l.Shape().Dim(1)
	return models.FindInt(l, func(i int, v int64) bool { return i%n > 0 && v != loss.IgnoreIndex }) >= 0
}
