package finetune

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/memfit/memfit/attention"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/lora"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/quant"
)

// Methods of fine-tuning.
const (
	MethodFull   = "full"    // every model parameter trains
	MethodLoRA   = "lora"    // LoRA adapters train, the base is frozen
	MethodLoRAFA = "lora-fa" // LoRA with A frozen: only B trains
	MethodCustom = "custom"  // adapters given by the caller (finetune.WithAdapters), the base is frozen
)

// Config configures training. Its YAML/JSON keys are the snake_case names below; Settings describes each field
// (key, flag, help, range).
type Config struct {
	// Method is full, lora, lora-fa or qlora (LoRA over an NF4-quantised base).
	Method string `json:"method" yaml:"method"`
	// LoRA settings (lora and lora-fa).
	LoRARank  int     `json:"lora_r" yaml:"lora_r"`
	LoRAAlpha float64 `json:"lora_alpha" yaml:"lora_alpha"`
	RSLoRA    bool    `json:"rslora" yaml:"rslora"`
	// LoRADropout drops adapter-branch inputs in training with this probability.
	LoRADropout float64  `json:"lora_dropout" yaml:"lora_dropout"`
	LoRATarget  []string `json:"lora_targets" yaml:"lora_targets"`
	// InitAdapter, when set, is a PEFT LoRA adapter folder to start from instead of fresh adapters (its rank and
	// alpha must match lora_r and lora_alpha; its modules_to_save initialise the trained modules).
	InitAdapter string `json:"init_adapter" yaml:"init_adapter"`
	// TrainModules are module-path prefixes of base parameters that train too (e.g. "classifier" or "score" for
	// a new head next to LoRA adapters).
	TrainModules []string `json:"train_modules" yaml:"train_modules"`

	// Optimizer is adamw or sgd.
	Optimizer   string  `json:"optimizer" yaml:"optimizer"`
	LR          float64 `json:"lr" yaml:"lr"`
	WeightDecay float64 `json:"weight_decay" yaml:"weight_decay"`
	Beta1       float64 `json:"beta1" yaml:"beta1"`
	Beta2       float64 `json:"beta2" yaml:"beta2"`
	Eps         float64 `json:"eps" yaml:"eps"`
	Momentum    float64 `json:"momentum" yaml:"momentum"`
	// Schedule is constant, linear or cosine (decaying to 0 at Steps), after WarmupSteps of linear warm-up.
	Schedule    string  `json:"schedule" yaml:"schedule"`
	WarmupSteps int     `json:"warmup_steps" yaml:"warmup_steps"`
	ClipNorm    float64 `json:"clip_norm" yaml:"clip_norm"`

	// Steps is the number of optimizer steps; each takes AccumSteps batches (gradient accumulation).
	Steps      int `json:"steps" yaml:"steps"`
	AccumSteps int `json:"accum_steps" yaml:"accum_steps"`
	// Seed drives every random choice (adapter init, data order).
	Seed uint64 `json:"seed" yaml:"seed"`
	// ComputeDType is float32 or bfloat16 (bfloat16 compute with float32 master weights and optimizer state).
	ComputeDType string `json:"compute_dtype" yaml:"compute_dtype"`

	// LogEvery writes a metrics line every this many steps; CheckpointEvery saves a checkpoint every this many
	// steps (0: only at the end).
	LogEvery        int `json:"log_every" yaml:"log_every"`
	CheckpointEvery int `json:"checkpoint_every" yaml:"checkpoint_every"`
	// KeepCheckpoints keeps only the newest this many checkpoints of a run's output folder (0: keep all); the
	// one "latest" names is never removed.
	KeepCheckpoints int `json:"keep_checkpoints" yaml:"keep_checkpoints"`
	// DivergenceFactor stops a run (Fit, ErrDiverged) whose loss, read at a logging step, exceeds this many
	// times its lowest so far and 3 times its first (0: never).
	DivergenceFactor float64 `json:"divergence_factor" yaml:"divergence_factor"`

	// Validation while training (see evaluate.go): EvalEvery evaluates the validation set every this many steps
	// and at the last one (0: at the last step only, when there is a validation set); EvalSplit holds out this
	// fraction of the training data, never trained on, as the validation set (0: none; RunSpec.EvalData gives a
	// separate one); EarlyStoppingPatience stops the run after this many evaluations in a row without a lower
	// validation loss (0: never).
	EvalEvery             int     `json:"eval_every,omitempty" yaml:"eval_every,omitempty"`
	EvalSplit             float64 `json:"eval_split,omitempty" yaml:"eval_split,omitempty"`
	EarlyStoppingPatience int     `json:"early_stopping_patience,omitempty" yaml:"early_stopping_patience,omitempty"`

	// Model options, applied when the model is loaded (they must match on resume).
	ApproxAct bool   `json:"approx_act" yaml:"approx_act"`
	MSNorm    bool   `json:"ms_norm" yaml:"ms_norm"`
	GradCkpt  bool   `json:"grad_ckpt" yaml:"grad_ckpt"`
	Attention string `json:"attention" yaml:"attention"`
	// BatchSize is the number of examples per micro-batch.
	BatchSize int `json:"batch_size" yaml:"batch_size"`
	// Mesa lists the saved-activation kinds stored as int8 (act, norm, softmax, attn, linear; "all"), with
	// running per-group ranges kept in the trainer's state.
	Mesa []string `json:"mesa,omitempty" yaml:"mesa,omitempty"`
	// Objective is what training minimises: "" the model's own loss (language modelling, classification), or a
	// preference objective on prompt/chosen/rejected pairs (package preference): dpo (against a frozen reference,
	// the model as it starts) or orpo (reference-free).
	Objective string `json:"objective,omitempty" yaml:"objective,omitempty"`
	// DPOBeta, DPOLoss (sigmoid or ipo) and DPOLabelSmoothing are DPO's settings, ORPOLambda ORPO's weight of the
	// odds-ratio term (Resolve gives them TRL's defaults for the objective: 0.1, sigmoid, 0; 0.1).
	DPOBeta           float64 `json:"dpo_beta,omitempty" yaml:"dpo_beta,omitempty"`
	DPOLoss           string  `json:"dpo_loss,omitempty" yaml:"dpo_loss,omitempty"`
	DPOLabelSmoothing float64 `json:"dpo_label_smoothing,omitempty" yaml:"dpo_label_smoothing,omitempty"`
	ORPOLambda        float64 `json:"orpo_lambda,omitempty" yaml:"orpo_lambda,omitempty"`
	// PrecomputeRef computes DPO's reference log-likelihoods once per example before the first step (cached in
	// the output folder) instead of running the reference model in every step.
	PrecomputeRef bool `json:"precompute_ref,omitempty" yaml:"precompute_ref,omitempty"`

	// BlockPlan is a per-block memory plan (models.ParseBlockPlan: "grad-ckpt*4,approx-act+mesa-softmax*8", one
	// mode per transformer block in order) applied instead of ApproxAct, GradCkpt and Mesa; MSNorm stays global.
	BlockPlan string `json:"block_plan,omitempty" yaml:"block_plan,omitempty"`
}

// Defaults returns a config with the usual settings: LoRA r=8, alpha=16 on q,v; AdamW lr 1e-4, betas
// (0.9, 0.999), eps 1e-8, no weight decay; constant schedule; no clipping; float32.
func Defaults() Config {
	return Config{Method: MethodLoRA, LoRARank: 8, LoRAAlpha: 16, LoRATarget: []string{"q", "v"},
		Optimizer: "adamw", LR: 1e-4, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8, Schedule: "constant",
		Steps: 100, AccumSteps: 1, ComputeDType: "float32", LogEvery: 10, Attention: "standard", BatchSize: 8,
		KeepCheckpoints: 3, DivergenceFactor: 100}
}

// Validate checks the whole config; every problem names its key. The choices and ranges of single settings come
// from Settings; the checks across settings are here.
func (c Config) Validate() error {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	for _, s := range Settings {
		if problem := s.check(c); problem != "" {
			errs = append(errs, problem)
		}
	}
	switch c.Method {
	case MethodFull:
		if c.LoRARank != 0 || len(c.LoRATarget) != 0 || c.LoRADropout != 0 || c.InitAdapter != "" {
			bad("method %q takes no lora_r / lora_targets / lora_dropout / init_adapter (they apply to lora and lora-fa)", c.Method)
		}
	case MethodLoRA, MethodLoRAFA, MethodQLoRA:
		if err := (lora.Config{Rank: c.LoRARank, Alpha: c.LoRAAlpha, Dropout: c.LoRADropout}).Validate(); err != nil {
			bad("%v", err)
		}
		if len(c.LoRATarget) == 0 && c.InitAdapter == "" {
			bad("lora_targets is empty (use e.g. q,v or all-linear)")
		}
	case MethodCustom:
		if c.LoRARank != 0 || len(c.LoRATarget) != 0 || c.InitAdapter != "" {
			bad("method custom takes its adapters from the caller, not lora_r / lora_targets / init_adapter")
		}
	default:
		bad("method must be %s, got %q", orList(methodChoices), c.Method)
	}
	if _, err := quant.ParseMesa(c.Mesa); err != nil {
		bad("mesa: %v", err)
	}
	switch c.Optimizer {
	case "adamw":
		if !(c.Beta1 >= 0 && c.Beta1 < 1) || !(c.Beta2 >= 0 && c.Beta2 < 1) || !(c.Eps > 0) {
			bad("adamw needs 0 <= beta1, beta2 < 1 and eps > 0 (got %g, %g, %g)", c.Beta1, c.Beta2, c.Eps)
		}
	case "sgd":
		if !(c.Momentum >= 0 && c.Momentum < 1) {
			bad("momentum must be in [0, 1), got %g", c.Momentum)
		}
	}
	if !(c.LR > 0) || math.IsInf(c.LR, 0) {
		bad("lr must be positive, got %g", c.LR)
	}
	if c.WarmupSteps < 0 || c.WarmupSteps > c.Steps {
		bad("warmup_steps must be in [0, steps], got %d", c.WarmupSteps)
	}
	if _, err := attention.ParseKind(c.Attention); err != nil {
		bad("attention: %v", err)
	}
	if c.GradCkpt && c.LoRADropout > 0 {
		bad("lora_dropout cannot be combined with grad_ckpt (the recomputation would draw other dropout masks)")
	}
	if modes, err := models.BlockPlanModes(c.BlockPlan); err != nil {
		bad("block_plan: %v", err)
	} else if modes != nil {
		if c.ApproxAct || c.GradCkpt || len(c.Mesa) > 0 {
			bad("block_plan sets approx_act, grad_ckpt and mesa per block: leave those off")
		}
		for _, m := range modes {
			if m.GradCheckpoint && c.LoRADropout > 0 {
				bad("lora_dropout cannot be combined with a grad-ckpt block (the recomputation would draw other dropout masks)")
				break
			}
		}
	}
	if problem := c.checkObjective(); problem != "" {
		bad("%s", problem)
	}
	if c.EvalSplit >= 0.5 {
		bad("eval_split is the fraction of the training data held out for validation: it must be below 0.5, got %g", c.EvalSplit)
	}
	if c.EarlyStoppingPatience > 0 && c.EvalEvery == 0 {
		bad("early_stopping_patience needs evaluations during the run: give eval_every too")
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid training config: %s", strings.Join(errs, "; "))
	}
	return nil
}

// blockModes returns cfg's per-block plan for a model of the given number of blocks (nil without one).
func (c Config) blockModes(blocks int) ([]models.BlockMode, error) {
	modes, err := models.ParseBlockPlan(c.BlockPlan, blocks)
	if err != nil {
		return nil, fmt.Errorf("block_plan: %w", err)
	}
	return modes, nil
}

// methodChoices are the methods a config file or flag takes (MethodCustom is for Go callers).
var methodChoices = []string{MethodFull, MethodLoRA, MethodLoRAFA, MethodQLoRA}

// LearningRate returns the learning rate for optimizer step (0-based): linear warm-up from lr/warmup over the
// first WarmupSteps steps, then constant, linear decay to 0, or cosine decay to 0 at Steps.
func (c Config) LearningRate(step int) float64 {
	if step < c.WarmupSteps {
		return c.LR * float64(step+1) / float64(c.WarmupSteps)
	}
	span := c.Steps - c.WarmupSteps
	if span <= 0 {
		return c.LR
	}
	progress := float64(step-c.WarmupSteps) / float64(span)
	switch c.Schedule {
	case "linear":
		return c.LR * (1 - progress)
	case "cosine":
		return c.LR * 0.5 * (1 + math.Cos(math.Pi*progress))
	}
	return c.LR
}

// GPUDefaults returns cfg with the defaults a GPU user expects when backendSpec is XLA's CUDA plugin
// ("xla:cuda" or a path to a CUDA PJRT plugin): each setting's GPUDefault (Settings), bfloat16 compute (float32
// master weights and optimizer state) and flash attention (attention.Flash: cuDNN's fused attention), unless
// explicit reports that the user set it (by key, "compute_dtype" or "attention", from a flag or a config file).
// Any other backend keeps cfg's values: on the pure-Go backend float32 and standard attention are the defaults,
// and flash would fall back to memory-efficient attention there anyway.
func GPUDefaults(cfg Config, backendSpec string, explicit func(key string) bool) Config {
	spec, err := engine.ParseSpec(backendSpec)
	if err != nil || spec.Name != "xla" || !engine.IsCUDAPlugin(spec.Plugin) {
		return cfg
	}
	for _, s := range Settings {
		if s.GPUDefault != "" && !explicit(s.Key) {
			*s.Field(&cfg).(*string) = s.GPUDefault
		}
	}
	return cfg
}

// ConfigDiff lists, one entry per setting ("lr: 0.001 here, 0.0001 there"), where a and b differ, by their
// YAML keys in sorted order; Steps is left out (a resume may change it).
func ConfigDiff(a, b Config) []string {
	a.Steps, b.Steps = 0, 0
	am, bm := configMap(a), configMap(b)
	var keys []string
	for k := range am {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var out []string
	for _, k := range keys {
		if fmt.Sprint(am[k]) != fmt.Sprint(bm[k]) {
			out = append(out, fmt.Sprintf("%s: %v here, %v there", k, am[k], bm[k]))
		}
	}
	return out
}

func configMap(c Config) map[string]any {
	b, _ := json.Marshal(c)
	m := map[string]any{}
	_ = json.Unmarshal(b, &m)
	return m
}
