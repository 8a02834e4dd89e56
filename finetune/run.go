package finetune

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	yaml3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"

	"github.com/memfit/memfit/internal/readfile"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/quant"
	"github.com/memfit/memfit/safetensors"

	"github.com/gomlx/compute/dtypes"
)

// LoadModel loads the model folder dir (of a registered family, by its config's model_type), or a GGUF file, with
// the model options of cfg (approximate activation, MS-norm, gradient checkpointing, attention kind) and its
// per-block plan.
func LoadModel(dir string, cfg Config) (Model, error) {
	opts, err := ModelOptionsOf(cfg)
	if err != nil {
		return nil, err
	}
	// Load -> quantise (QLoRA) -> fold -> graph: QLoRA loads the float weights unfolded, quantises them, and
	// builds the model again from the quantised weights; building folds the norms (models.ApplyFolds), into NF4
	// weights as into float ones.
	qlora := cfg.Method == MethodQLoRA
	opts.MSNorm = cfg.MSNorm && !qlora
	var fam Family
	var model Model
	if st, err := os.Stat(dir); IsGGUF(dir) && err != nil {
		return nil, fmt.Errorf("GGUF model %s: %w", dir, errors.Unwrap(err))
	} else if err == nil && !st.IsDir() {
		if !IsGGUF(dir) {
			return nil, fmt.Errorf("%s is a file: a model is a folder (config.json and its safetensors), here %s, or a .gguf file", dir, filepath.Dir(dir))
		}
		if model, fam, err = LoadGGUF(dir, opts); err != nil {
			return nil, err
		}
	} else {
		if fam, err = FamilyOfFolder(dir); err != nil {
			return nil, err
		}
		if model, err = fam.Load(dir, opts); err != nil {
			return nil, err
		}
	}
	if err := ApplyBlockPlan(model, cfg); err != nil {
		return nil, err
	}
	if !qlora {
		return model, nil
	}
	q, err := quant.QuantizeWeights(model.Params(), nf4Targets(model.LinearLayers()))
	if err != nil {
		return nil, err
	}
	quantised, err := fam.Rebuild(model, q, cfg.MSNorm)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	return quantised, nil
}

// PerBlock is a Model whose transformer blocks each take a memory mode of a per-block plan (Config.BlockPlan);
// ViT and Llama are.
type PerBlock interface {
	// BlockModes returns the model's per-block plan (nil: none, the model-wide options hold) and its number of
	// blocks.
	BlockModes() (modes []models.BlockMode, count int)
	// SetBlockModes sets the per-block plan (nil: none).
	SetBlockModes(modes []models.BlockMode)
	// GradCheckpoint reports the model-wide grad_ckpt option (what holds without a per-block plan).
	GradCheckpoint() bool
}

// BlockCount returns the number of transformer blocks of model (what a block plan covers).
func BlockCount(model Model) (int, error) {
	bp, ok := model.(PerBlock)
	if !ok {
		return 0, fmt.Errorf("model %T has no per-block options", model)
	}
	_, n := bp.BlockModes()
	return n, nil
}

// ApplyBlockPlan gives model the per-block plan of cfg when cfg has one (a model built with its own
// Options.Blocks and a config without a plan keeps them), then checks that at most MaxCheckpointedBlocks blocks
// are checkpointed (a *CheckpointLimitError otherwise).
func ApplyBlockPlan(model Model, cfg Config) error {
	bp, ok := model.(PerBlock)
	if cfg.BlockPlan != "" {
		if !ok {
			return fmt.Errorf("block_plan: model %T has no per-block options", model)
		}
		_, n := bp.BlockModes()
		modes, err := cfg.blockModes(n)
		if err != nil {
			return err
		}
		bp.SetBlockModes(modes)
	}
	if !ok {
		return nil
	}
	modes, n := bp.BlockModes()
	ckpt := 0
	if modes == nil {
		if bp.GradCheckpoint() {
			ckpt = n
		}
	} else {
		for _, m := range modes {
			if m.GradCheckpoint {
				ckpt++
			}
		}
	}
	if ckpt > MaxCheckpointedBlocks {
		return &CheckpointLimitError{Blocks: ckpt}
	}
	return nil
}

// CheckpointLimitError is the error of a step that would checkpoint more than MaxCheckpointedBlocks blocks.
type CheckpointLimitError struct {
	// Blocks is the number of blocks the step would checkpoint.
	Blocks int
}

// Error says why the bound is there and what to do, in one line.
func (e *CheckpointLimitError) Error() string {
	return fmt.Sprintf("gradient checkpointing of %d blocks: memfit checkpoints at most %d (the reverse pass, GoMLX's algorithm in engine.Gradient, walks the whole graph once per checkpointed block, so building the step takes time quadratic in their number: about 10 s for 256 blocks, 40 s for 512): checkpoint fewer blocks with a block_plan, or leave gradient checkpointing off (memory: --variants without grad-ckpt)",
		e.Blocks, MaxCheckpointedBlocks)
}

// MaxCheckpointedBlocks is the most blocks a step checkpoints (grad_ckpt, or grad-ckpt blocks of a block_plan).
// Each checkpointed block's recomputation takes its gradient with engine.Gradient (GoMLX's reverse-pass algorithm),
// whose cost is the size of the whole graph, so building a step takes time quadratic in the checkpointed blocks (the pure-Go backend, 2
// cores, LLaMA blocks: 4 s for 128, 10 s for 256, 41 s for 512); the bound keeps it to seconds.
const MaxCheckpointedBlocks = 256

// usesBlockMesa reports whether model's per-block plan stores some block's activations with Mesa.
func usesBlockMesa(model Model) bool {
	bp, ok := model.(PerBlock)
	if !ok {
		return false
	}
	modes, _ := bp.BlockModes()
	for _, m := range modes {
		if len(m.Mesa) > 0 {
			return true
		}
	}
	return false
}

// LoadExamples reads a dataset stored as a safetensors file: one tensor per model input, the examples on the
// first axis ("pixel_values" [N, C, H, W] float and "labels" [N] for ViT; "input_ids" and "attention_mask"
// [N, T] and "labels" [N, T] or [N] for LLaMA). It checks the names against the model's inputs.
func LoadExamples(path string, model Model) (Examples, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := Examples{}
	for _, n := range f.Names() {
		info, _ := f.Info(n)
		if info.DType.IsFloat() {
			out[n], err = f.TensorAs(n, dtypes.Float32)
		} else {
			out[n], err = f.Tensor(n)
		}
		if err != nil {
			return nil, err
		}
	}
	want := model.BatchInputs()
	for _, n := range want {
		if _, ok := out[n]; !ok {
			return nil, fmt.Errorf("%s has no %q tensor (the model needs %v)", path, n, want)
		}
	}
	for n := range out {
		found := false
		for _, w := range want {
			found = found || w == n
		}
		if !found {
			names := append([]string(nil), want...)
			sort.Strings(names)
			return nil, fmt.Errorf("%s has a tensor %q that the model does not take (it takes %v)", path, n, names)
		}
	}
	if out.Len() == 0 {
		return nil, fmt.Errorf("%s holds no examples", path)
	}
	return out, nil
}

// RunSpec is what a training run needs besides its config: where the base model and the data are. It is saved
// as run.yaml in the output folder, so export and resume need only that folder.
type RunSpec struct {
	Model string `json:"model"`
	// ModelGiven is the base model as the user gave it (--model), before AbsPaths made Model absolute: what the
	// PEFT adapter's base_model_name_or_path records (ModelName). Empty in runs written before it was kept.
	ModelGiven string `json:"model_given,omitempty"`
	Data       string `json:"data"`
	// DataOptions say how to read Data (format, split, tokenizer, sequence length, augmentation).
	DataOptions DataOptions `json:"data_options,omitempty"`
	// EvalData is a validation set, read as Data is (its format from its path, DataOptions with EvalDataSplit
	// for the split when given); Config.EvalSplit holds one out of Data instead.
	EvalData      string `json:"eval_data,omitempty"`
	EvalDataSplit string `json:"eval_data_split,omitempty"`
	Config        Config `json:"config"`
	// ModelHub, DataHub, EvalDataHub and InitAdapterHub say which Hub repository and commit Model, Data, EvalData
	// and Config.InitAdapter came from when they were named by Hub id (they are then folders of the
	// huggingface_hub cache), so that the run names exactly what it trained.
	ModelHub       *HubSource `json:"model_hub,omitempty"`
	DataHub        *HubSource `json:"data_hub,omitempty"`
	EvalDataHub    *HubSource `json:"eval_data_hub,omitempty"`
	InitAdapterHub *HubSource `json:"init_adapter_hub,omitempty"`
}

// HubSource is a Hugging Face Hub repository at the commit a run read.
type HubSource struct {
	// Repo is ORG/NAME; Revision the branch, tag or commit named ("" for main); Commit what it resolved to.
	Repo     string `json:"repo"`
	Revision string `json:"revision,omitempty"`
	Commit   string `json:"commit"`
	// Path is the file or folder of a dataset repository read ("" for all of it); Config its config.
	Path   string `json:"path,omitempty"`
	Config string `json:"config,omitempty"`
}

// ModelName is the base model as the user named it, for the PEFT adapter's base_model_name_or_path: the Hub id
// when the model came from the Hub, else the path the user gave (ModelGiven; Model, the absolute path, for a
// run written before memfit kept it). This is the one place that says what the user named the model.
func (s RunSpec) ModelName() string {
	switch {
	case s.ModelHub != nil:
		return s.ModelHub.Repo
	case s.ModelGiven != "":
		return s.ModelGiven
	}
	return s.Model
}

// ModelRevision is the commit of the Hub repository the base model came from ("" for a local folder), for the
// PEFT adapter's revision.
func (s RunSpec) ModelRevision() string {
	if s.ModelHub != nil {
		return s.ModelHub.Commit
	}
	return ""
}

// Open loads the run's model (in the config's modes) and opens its data.
func (s RunSpec) Open() (Model, Iterator, error) {
	model, err := LoadModel(s.Model, s.Config)
	if err != nil {
		return nil, nil, err
	}
	it, err := OpenData(s.Data, s.DataOptions, model, s.Model, s.Config.BatchSize, s.Config.Seed)
	if err != nil {
		return nil, nil, err
	}
	return model, it, nil
}

// AbsPaths returns s with its model, data and tokenizer paths made absolute (run.yaml must not depend on the
// directory a later --resume runs in).
func (s RunSpec) AbsPaths() RunSpec {
	if a, err := filepath.Abs(s.Model); err == nil {
		s.Model = a
	}
	s.Data = absData(s.Data)
	if s.EvalData != "" {
		s.EvalData = absData(s.EvalData)
	}
	if s.DataOptions.Tokenizer != "" {
		if a, err := filepath.Abs(s.DataOptions.Tokenizer); err == nil {
			s.DataOptions.Tokenizer = a
		}
	}
	return s
}

// RunFile is the name of the run spec in an output folder.
const RunFile = "run.yaml"

// ReadRunSpec reads out/run.yaml (strictly: unknown keys are errors).
func ReadRunSpec(out string) (RunSpec, error) {
	data, err := readfile.Read(filepath.Join(out, RunFile), readfile.Config)
	if err != nil {
		return RunSpec{}, fmt.Errorf("%s is not a training output folder: %w", out, err)
	}
	path := filepath.Join(out, RunFile)
	// A hand-edited run.yaml is read as strictly as a config file: syntax, keys given twice, a second document,
	// and the config's values in words.
	root, err := yamlDocument(path, data)
	if err != nil {
		return RunSpec{}, err
	}
	if root != nil && root.Kind == yaml3.MappingNode {
		for i := 0; i+1 < len(root.Content); i += 2 {
			if root.Content[i].Value == "config" {
				if _, _, err := configFromNode(path, resolveAlias(root.Content[i+1]), Defaults()); err != nil {
					return RunSpec{}, err
				}
			}
		}
	}
	var spec RunSpec
	if err := yaml.UnmarshalStrict(data, &spec); err != nil {
		return RunSpec{}, fmt.Errorf("%s: %w", path, err)
	}
	return spec, spec.Config.Validate()
}

// WriteRunSpec writes out/run.yaml atomically.
func WriteRunSpec(out string, spec RunSpec) error {
	data, err := yaml.Marshal(spec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	return safetensors.WriteAtomic(filepath.Join(out, RunFile), func(w *bufio.Writer) error {
		_, err := w.Write(data)
		return err
	})
}
