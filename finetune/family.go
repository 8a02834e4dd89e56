package finetune

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/gomlx/compute/shapes"

	"github.com/memfit/memfit/attention"
	"github.com/memfit/memfit/gguf"
	"github.com/memfit/memfit/gguf/llamagguf"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/hfconfig"
	"github.com/memfit/memfit/tokenizer"
)

// Family is a kind of model that finetune trains: how to load it, make it from its config alone for the memory
// planner, feed it random batches, open and check its data, give it a head, export it to GGUF. finetune holds no
// family of its own: each family is a package that registers itself from its init function with RegisterFamily
// (the shipped ones are under family/, and family/all imports them all), and everything in finetune and in package
// plan looks families up (FamilyByName, FamilyOf, FamilyOfFolder, FamiliesOfFormat) instead of switching on a
// model's type (docs/families.md). The optional fields may be nil.
type Family struct {
	// Name is the model_type of the family's config.json ("vit", "llama") and the prefix of its preset names
	// ("vit:tiny"); Title is its name in messages ("ViT", "LLaMA").
	Name, Title string
	// Of reports whether a model is of this family.
	Of func(m Model) bool
	// Load loads a model folder (config.json and safetensors) in the model-wide modes of opts (folding its norms
	// when opts.MSNorm).
	Load func(dir string, opts ModelOptions) (Model, error)
	// Rebuild builds m again, in its own options, over other parameters (QLoRA's quantised ones, random ones),
	// folding the norms when msNorm.
	Rebuild func(m Model, params models.Params, msNorm bool) (Model, error)
	// RandomParams returns random parameters of m's architecture, by Hugging Face name, unfolded.
	RandomParams func(m Model, seed uint64) models.Params
	// Shaped returns the model of a folder's config.json, without weights, in the modes of opts: enough to build
	// training graphs (the planner's), not to run them.
	Shaped func(dir string, opts ModelOptions) (Model, error)
	// Preset returns the named preset without weights, in the modes of opts (labels: the classes of a
	// classification head, 0 for none); Presets lists the preset names.
	Preset  func(name string, labels int, opts ModelOptions) (Model, error)
	Presets []string
	// Sequence says that the family's batches have a sequence length to choose (Shape.Seq); FixedSequence, for a
	// family without, says why in a message ("a ViT's sequence is fixed by its image size").
	Sequence      bool
	FixedSequence string
	// BatchShapes returns the shapes of m's batch tensors at shape in (what the planner builds a step for);
	// RandomBatch returns a batch of random inputs at in.
	BatchShapes func(m Model, in Shape) (map[string]shapes.Shape, error)
	RandomBatch func(m Model, in Shape, seed uint64) Batch
	// Formats are the data formats (RunSpec.Data, DataFormat) that OpenData reads besides safetensors, which
	// every family reads (LoadExamples): TextFormats with OpenText for a model over token ids, ImageFormats with
	// OpenImageData for an image classifier.
	Formats  []string
	OpenData func(src DataSource) (Iterator, error)
	// Trainable refuses a model that cannot be fine-tuned as it is (a ViTModel without a head); nil: all can.
	Trainable func(m Model) error
	// CheckTokenizer refuses a tokenizer that does not belong to m (more tokens than its vocabulary:
	// CheckTextTokenizer); nil: the family takes no text.
	CheckTokenizer func(tok *tokenizer.Tokenizer, m Model) error
	// GenerationConfig returns the generation_config.json a merged export of m writes when its base model folder
	// has none (nil, or a nil map: none).
	GenerationConfig func(m Model) map[string]any
	// Cut returns m (made from its config alone, without weights) with only its first blocks transformer blocks
	// and, outside the blocks, the smallest parts the family allows (LLaMA: a 256-token vocabulary), its width,
	// heads and MLP unchanged: the model the autopilot's fast calibration times a block on (package plan). nil:
	// the family's blocks are not timed alone (the autopilot then uses its cost model).
	Cut func(m Model, blocks int) Model
	// BlockFLOPs returns the floating-point operations of one transformer block's forward pass at shape in (its
	// linear layers, 2 per multiply-add, and attention's two batched products): what gradient checkpointing
	// computes again, the autopilot's cost model. nil: the family has no cost model.
	BlockFLOPs func(m Model, in Shape) float64
	// NewHead returns the config.json and parameters of m (loaded from a folder, unfolded) with a freshly
	// initialised classification head of the given classes (one: a regression) in place of its own head, as
	// transformers initialises one when a checkpoint is loaded into a ...ForSequenceClassification /
	// ...ForImageClassification class (finetune init --from DIR --num-labels N: NewHead). nil: the family has
	// no classifier.
	NewHead func(m Model, labels []string, seed uint64) (config []byte, params models.Params, err error)
	// GGUFArchs are the general.architecture values of the GGUF files the family writes (GGUF) and reads
	// (LoadGGUF): llama.cpp's architecture names.
	GGUFArchs []string
	// GGUF returns the metadata and tensors of m as a GGUF file of params (a merged model's, by Hugging Face
	// name) with the options' tokenizer vocabulary, in llama.cpp's names and layouts (ExportGGUF writes them);
	// an error says why m cannot be exported (a classifier, say); with params nil it only checks that (nil
	// metadata and tensors). nil: no GGUF export.
	GGUF func(m Model, params models.Params, o llamagguf.Options) ([]gguf.KV, []gguf.Tensor, error)
	// LoadGGUF loads a GGUF file of one of GGUFArchs (tensors dequantised to float32) in the model-wide modes of
	// opts.
	LoadGGUF func(path string, opts ModelOptions) (Model, error)
}

// CutModel returns model cut to blocks transformer blocks by its family's Cut (see Family.Cut).
func CutModel(model Model, blocks int) (Model, error) {
	fam, ok := FamilyOf(model)
	if !ok || fam.Cut == nil {
		return nil, fmt.Errorf("model %T: its family does not cut its blocks out (Family.Cut)", model)
	}
	if blocks < 1 {
		return nil, fmt.Errorf("cutting a model to %d blocks: give at least one", blocks)
	}
	return fam.Cut(model, blocks), nil
}

// BlockFLOPs returns the forward FLOPs of one of model's transformer blocks at shape in, by its family's
// BlockFLOPs (see Family.BlockFLOPs).
func BlockFLOPs(model Model, in Shape) (float64, error) {
	fam, ok := FamilyOf(model)
	if !ok || fam.BlockFLOPs == nil {
		return 0, fmt.Errorf("model %T: its family has no block cost (Family.BlockFLOPs)", model)
	}
	return fam.BlockFLOPs(model, in), nil
}

// DataSource is data for a family's OpenData to open: the path and its format (DataFormat), how to read it, the
// model it is for and its folder (tokenizer, preprocessor), and the batches to make of it.
type DataSource struct {
	Path, Format string
	Options      DataOptions
	Model        Model
	ModelDir     string
	BatchSize    int
	Seed         uint64
}

// ModelOptions are the model-wide memory-saving modes and the attention kind a family builds a model in (a
// Config's approx_act, ms_norm, grad_ckpt and attention); the per-block plan is set afterwards (ApplyBlockPlan).
type ModelOptions struct {
	ApproxAct, MSNorm, GradCkpt bool
	Attention                   attention.Kind
}

// Model returns the options as a model package builds a model in (models.Options, without a per-block plan).
func (o ModelOptions) Model() models.Options {
	return models.Options{ApproxActivation: o.ApproxAct, MSNorm: o.MSNorm, GradCheckpoint: o.GradCkpt, Attention: o.Attention}
}

// ModelOptionsOf returns cfg's model options.
func ModelOptionsOf(cfg Config) (ModelOptions, error) {
	kind, err := attention.ParseKind(cfg.Attention)
	if err != nil {
		return ModelOptions{}, err
	}
	return ModelOptions{ApproxAct: cfg.ApproxAct, MSNorm: cfg.MSNorm, GradCkpt: cfg.GradCkpt, Attention: kind}, nil
}

var (
	familiesMu sync.Mutex
	families   []Family
)

// RegisterFamily adds a model family (call it from the family's package's init function); families keep the
// order they were registered in, the shipped ones first. A second family of the same name, or one without Name,
// Of, Load or Rebuild, is a programming error: it panics.
func RegisterFamily(f Family) {
	familiesMu.Lock()
	defer familiesMu.Unlock()
	if f.Name == "" || f.Of == nil || f.Load == nil || f.Rebuild == nil {
		panic(fmt.Sprintf("finetune.RegisterFamily: family %q needs a Name, Of, Load and Rebuild", f.Name))
	}
	for _, g := range families {
		if g.Name == f.Name {
			panic(fmt.Sprintf("finetune.RegisterFamily: family %q registered twice", f.Name))
		}
	}
	families = append(families, f)
}

// Families returns the registered families, in the order they were registered.
func Families() []Family {
	familiesMu.Lock()
	defer familiesMu.Unlock()
	return slices.Clone(families)
}

// FamilyByName returns the family of a model_type.
func FamilyByName(name string) (Family, bool) {
	for _, f := range Families() {
		if f.Name == name {
			return f, true
		}
	}
	return Family{}, false
}

// FamilyOf returns the family of a model.
func FamilyOf(m Model) (Family, bool) {
	for _, f := range Families() {
		if f.Of(m) {
			return f, true
		}
	}
	return Family{}, false
}

// FamiliesOfFormat returns the families whose OpenData reads a data format (not safetensors, which all read).
func FamiliesOfFormat(format string) []Family {
	var out []Family
	for _, f := range Families() {
		if slices.Contains(f.Formats, format) {
			out = append(out, f)
		}
	}
	return out
}

// FamilyOfGGUFArch returns the family that reads GGUF files of general.architecture arch.
func FamilyOfGGUFArch(arch string) (Family, bool) {
	for _, f := range Families() {
		if f.LoadGGUF != nil && slices.Contains(f.GGUFArchs, arch) {
			return f, true
		}
	}
	return Family{}, false
}

// familyTitle says in a message which family model is of: "this model is a ViT".
func familyTitle(model Model) string {
	if fam, ok := FamilyOf(model); ok {
		return "this model is a " + fam.Title
	}
	return fmt.Sprintf("this model (%T) is of no registered family", model)
}

// familyTitles lists the families' titles for a message: "LLaMA, Qwen2 or Gemma".
func familyTitles(fams []Family) string {
	var titles []string
	for _, f := range fams {
		titles = append(titles, f.Title)
	}
	switch len(titles) {
	case 0:
		return "registered"
	case 1:
		return titles[0]
	}
	return strings.Join(titles[:len(titles)-1], ", ") + " or " + titles[len(titles)-1]
}

// familyNames lists the registered families' names (model_type values), in registration order.
func familyNames() []string {
	var names []string
	for _, f := range Families() {
		names = append(names, f.Name)
	}
	return names
}

// FamilyOfFolder returns the family of the model folder dir, by its config.json's model_type. A missing
// model_type, or one that no registered family trains, is an error naming the file and the types memfit trains.
func FamilyOfFolder(dir string) (Family, error) {
	fields, file, err := hfconfig.Read(dir)
	if err != nil {
		return Family{}, err
	}
	var mt string
	if raw, ok := fields["model_type"]; !ok || json.Unmarshal(raw, &mt) != nil || mt == "" {
		return Family{}, fmt.Errorf("%s: field \"model_type\" is missing", file)
	}
	fam, ok := FamilyByName(mt)
	switch {
	case !ok && len(Families()) == 0:
		return Family{}, fmt.Errorf("%s: model_type %q: no model family is registered in this program (import github.com/memfit/memfit/family/all, or a family's package, for its side effect)", file, mt)
	case !ok:
		return Family{}, fmt.Errorf("%s: field \"model_type\" is %q: memfit supports %v", file, mt, familyNames())
	}
	return fam, nil
}
