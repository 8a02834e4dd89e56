package finetune

import (
	"fmt"
	"math"
	"reflect"
	"strings"
)

// Range is the range a number setting must lie in, checked by Config.Validate with a message naming its key.
// (models.Bound, the parameters bound into a graph, is unrelated.)
type Range int

// Ranges of number settings.
const (
	Unbounded   Range = iota // any value (or checked by Validate on its own: lr, warmup_steps, lora_r ...)
	Positive                 // > 0 (and finite)
	NonNegative              // >= 0 (and finite)
)

// Setting is one field of Config as a user meets it: its YAML/JSON key, its command-line flag, its help, the
// values it takes and where it lives in Config. Settings lists every field once; the CLI binds its flags, applies
// the flags a user set, and checks the simple ranges and choices from that one table.
type Setting struct {
	// Key is the YAML/JSON key (the field's json tag).
	Key string
	// Help is the flag's one-line help.
	Help string
	// Choices are the values a string setting takes (Validate refuses others); nil when free or checked elsewhere.
	Choices []string
	// Range is the range of a number setting, checked by Validate.
	Range Range
	// GPUDefault is the value GPUDefaults gives the setting on a CUDA backend when the user gave none ("": none).
	GPUDefault string
	// Field returns a pointer to the setting's field in c (*string, *int, *uint64, *float64, *bool or *[]string).
	Field func(c *Config) any
}

// Settings is every field of Config, in the order of the help (a test checks that each field appears once, under
// its json tag).
var Settings = []Setting{
	{Key: "method", Help: "full, lora, lora-fa or qlora (LoRA over an NF4 base)", Field: func(c *Config) any { return &c.Method }},
	{Key: "lora_r", Help: "LoRA rank", Field: func(c *Config) any { return &c.LoRARank }},
	{Key: "lora_alpha", Help: "LoRA alpha (scale alpha/r)", Field: func(c *Config) any { return &c.LoRAAlpha }},
	{Key: "rslora", Help: "rank-stabilised scale alpha/sqrt(r)", Field: func(c *Config) any { return &c.RSLoRA }},
	{Key: "lora_dropout", Help: "dropout on the adapter branch's input", Field: func(c *Config) any { return &c.LoRADropout }},
	{Key: "lora_targets", Help: "layers to adapt: q,k,v,o,gate,up,down,attn,mlp, all-linear or module names",
		Field: func(c *Config) any { return &c.LoRATarget }},
	{Key: "train_modules", Help: "base modules that train next to the adapters (e.g. classifier, score)",
		Field: func(c *Config) any { return &c.TrainModules }},
	{Key: "init_adapter", Help: "start from this PEFT LoRA adapter folder", Field: func(c *Config) any { return &c.InitAdapter }},
	{Key: "approx_act", Help: "ReGELU2/ReSiLU2: exact activation forward, 2-bit backward", Field: func(c *Config) any { return &c.ApproxAct }},
	{Key: "ms_norm", Help: "MS-LN/MS-RMSNorm: fold norm affines into the next linear layers", Field: func(c *Config) any { return &c.MSNorm }},
	{Key: "grad_ckpt", Help: "gradient checkpointing per block (recompute in backward)", Field: func(c *Config) any { return &c.GradCkpt }},
	{Key: "mesa", Help: "store these saved activations as int8 (Mesa): act, norm, softmax, attn, linear or all",
		Field: func(c *Config) any { return &c.Mesa }},
	{Key: "block_plan", Help: "per-block memory plan in block order, e.g. grad-ckpt*4,approx-act+mesa-softmax*8 (instead of --approx-act, --grad-ckpt, --mesa)",
		Field: func(c *Config) any { return &c.BlockPlan }},
	{Key: "attention", Help: "standard, memory-efficient or flash (the backend's fused attention; memory-efficient where it has none)",
		GPUDefault: "flash", Field: func(c *Config) any { return &c.Attention }},
	{Key: "objective", Help: "dpo or orpo: preference tuning on prompt/chosen/rejected pairs (default: the model's own loss)",
		Field: func(c *Config) any { return &c.Objective }},
	{Key: "dpo_beta", Help: "DPO's beta: how far the policy may move from the reference (default 0.1 with --objective dpo)",
		Field: func(c *Config) any { return &c.DPOBeta }},
	{Key: "dpo_loss", Help: "DPO's loss: sigmoid (the DPO paper's) or ipo (default sigmoid with --objective dpo)",
		Field: func(c *Config) any { return &c.DPOLoss }},
	{Key: "dpo_label_smoothing", Help: "DPO's label smoothing: the probability that a pair's preference is flipped (conservative DPO, sigmoid loss)",
		Field: func(c *Config) any { return &c.DPOLabelSmoothing }},
	{Key: "orpo_lambda", Help: "ORPO's weight of the odds-ratio term against the SFT loss (default 0.1 with --objective orpo)",
		Field: func(c *Config) any { return &c.ORPOLambda }},
	{Key: "precompute_ref", Help: "DPO: compute the reference log-likelihoods once per example before training (cached in --out) instead of in every step",
		Field: func(c *Config) any { return &c.PrecomputeRef }},
	{Key: "optimizer", Help: "adamw or sgd", Choices: []string{"adamw", "sgd"}, Field: func(c *Config) any { return &c.Optimizer }},
	{Key: "lr", Help: "learning rate", Field: func(c *Config) any { return &c.LR }},
	{Key: "weight_decay", Help: "weight decay (decoupled for adamw)", Range: NonNegative, Field: func(c *Config) any { return &c.WeightDecay }},
	{Key: "beta1", Help: "adamw's first-moment decay", Field: func(c *Config) any { return &c.Beta1 }},
	{Key: "beta2", Help: "adamw's second-moment decay", Field: func(c *Config) any { return &c.Beta2 }},
	{Key: "eps", Help: "adamw's epsilon", Field: func(c *Config) any { return &c.Eps }},
	{Key: "momentum", Help: "sgd's momentum (0: plain sgd)", Field: func(c *Config) any { return &c.Momentum }},
	{Key: "schedule", Help: "constant, linear or cosine", Choices: []string{"constant", "linear", "cosine"},
		Field: func(c *Config) any { return &c.Schedule }},
	{Key: "warmup_steps", Help: "linear warm-up steps", Field: func(c *Config) any { return &c.WarmupSteps }},
	{Key: "clip_norm", Help: "clip the gradients' global norm (0: off)", Range: NonNegative, Field: func(c *Config) any { return &c.ClipNorm }},
	{Key: "steps", Help: "optimizer steps", Range: Positive, Field: func(c *Config) any { return &c.Steps }},
	{Key: "batch_size", Help: "examples per micro-batch", Range: Positive, Field: func(c *Config) any { return &c.BatchSize }},
	{Key: "accum_steps", Help: "micro-batches per optimizer step (gradient accumulation)", Range: Positive,
		Field: func(c *Config) any { return &c.AccumSteps }},
	{Key: "seed", Help: "random seed (adapter init, data order)", Field: func(c *Config) any { return &c.Seed }},
	{Key: "compute_dtype", Help: "float32 or bfloat16 (float32 master weights)",
		Choices: []string{"float32", "bfloat16"}, GPUDefault: "bfloat16", Field: func(c *Config) any { return &c.ComputeDType }},
	{Key: "log_every", Help: "write a metrics line every N steps", Range: NonNegative, Field: func(c *Config) any { return &c.LogEvery }},
	{Key: "checkpoint_every", Help: "checkpoint every N steps (0: at the end)", Range: NonNegative,
		Field: func(c *Config) any { return &c.CheckpointEvery }},
	{Key: "keep_checkpoints", Help: "keep only the newest N checkpoints (0: all)", Range: NonNegative,
		Field: func(c *Config) any { return &c.KeepCheckpoints }},
	{Key: "divergence_factor", Help: "stop when a logged loss exceeds this many times its lowest and 3 times its first (0: never)",
		Range: NonNegative, Field: func(c *Config) any { return &c.DivergenceFactor }},
	{Key: "eval_every", Help: "evaluate the validation set (--eval-data or --eval-split) every N steps and at the end (0: at the end only)",
		Range: NonNegative, Field: func(c *Config) any { return &c.EvalEvery }},
	{Key: "eval_split", Help: "hold out this fraction of the training data (seeded, never trained on) as the validation set",
		Range: NonNegative, Field: func(c *Config) any { return &c.EvalSplit }},
	{Key: "early_stopping_patience", Help: "stop after N evaluations in a row without a lower validation loss (0: never)",
		Range: NonNegative, Field: func(c *Config) any { return &c.EarlyStoppingPatience }},
}

// Flag returns the setting's command-line flag name: its key with dashes for underscores (lora_r: --lora-r).
func (s Setting) Flag() string { return strings.ReplaceAll(s.Key, "_", "-") }

// SettingByKey returns the setting of a YAML/JSON key.
func SettingByKey(key string) (Setting, bool) {
	for _, s := range Settings {
		if s.Key == key {
			return s, true
		}
	}
	return Setting{}, false
}

// SettingByFlag returns the setting of a command-line flag name (without dashes in front).
func SettingByFlag(flag string) (Setting, bool) {
	for _, s := range Settings {
		if s.Flag() == flag {
			return s, true
		}
	}
	return Setting{}, false
}

// Value returns the setting's value in c.
func (s Setting) Value(c Config) any { return reflect.ValueOf(s.Field(&c)).Elem().Interface() }

// Copy sets the setting's field of dst to its value in src.
func (s Setting) Copy(dst, src *Config) {
	reflect.ValueOf(s.Field(dst)).Elem().Set(reflect.ValueOf(s.Field(src)).Elem())
}

// check returns the problem with the setting's value in c against its Choices and Range, or "".
func (s Setting) check(c Config) string {
	v := reflect.ValueOf(s.Field(&c)).Elem()
	if len(s.Choices) > 0 && v.Kind() == reflect.String {
		for _, ch := range s.Choices {
			if v.String() == ch {
				return ""
			}
		}
		return fmt.Sprintf("%s must be %s, got %q", s.Key, orList(s.Choices), v.String())
	}
	var x float64
	switch v.Kind() {
	case reflect.Int:
		x = float64(v.Int())
	case reflect.Float64:
		x = v.Float()
	default:
		return ""
	}
	switch {
	case s.Range == Positive && !(x > 0 && !math.IsInf(x, 1)):
		return fmt.Sprintf("%s must be positive, got %v", s.Key, v.Interface())
	case s.Range == NonNegative && !(x >= 0 && !math.IsInf(x, 1)):
		return fmt.Sprintf("%s must not be negative, got %v", s.Key, v.Interface())
	}
	return ""
}

// orList writes a, b or c.
func orList(items []string) string {
	if len(items) < 2 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " or " + items[len(items)-1]
}

// Sources are where a command's training config comes from, by rising precedence: Defaults(), the config file,
// the flags the user set, and the backend's defaults for what none of them set.
type Sources struct {
	// File is a YAML (or JSON) config file with Settings' keys; "" for none.
	File string
	// Flags holds the values of the command's flags.
	Flags Config
	// FlagSet reports whether the user set the flag of a setting (by its key); nil: none set.
	FlagSet func(key string) bool
	// Backend is the backend spec (e.g. "xla:cuda"), for GPUDefaults.
	Backend string
	// MSNormByDefault turns MS-norm on unless the file or a flag gave ms_norm: the memory autopilot (package plan)
	// asks for it, since MS-norm is the free model-wide saving and the autopilot chooses only the per-block modes.
	MSNormByDefault bool
	// InitAdapter, when set, turns the init_adapter the file or a flag gave into the folder to read (a Hub id
	// into its snapshot in the cache), before the adapter's settings are read; its error is returned as it is.
	InitAdapter func(value string) (string, error)
}

// Resolve builds a training config from src: Defaults(), then the keys of src.File, then the settings whose flags
// the user set, then GPUDefaults for src.Backend (for compute_dtype and attention when neither the file nor a flag
// gave them), ms_norm on for MSNormByDefault when neither gave it; the LoRA defaults (lora_r, lora_targets) are dropped for method full unless the file or a flag gave
// one. An init_adapter sets lora_r, lora_alpha, rslora and lora_targets from the adapter (a value the file or a
// flag gave must agree). The result is validated: an error is one line naming the problem.
func Resolve(src Sources) (Config, error) {
	flagSet := src.FlagSet
	if flagSet == nil {
		flagSet = func(string) bool { return false }
	}
	cfg := Defaults()
	inFile := map[string]bool{}
	if src.File != "" {
		var err error
		if cfg, inFile, err = readConfigFile(src.File, cfg); err != nil {
			return cfg, err
		}
	}
	for _, s := range Settings {
		if flagSet(s.Key) {
			s.Copy(&cfg, &src.Flags)
		}
	}
	given := func(key string) bool { return inFile[key] || flagSet(key) }
	cfg = GPUDefaults(cfg, src.Backend, given)
	if src.MSNormByDefault && !given("ms_norm") {
		cfg.MSNorm = true
	}
	cfg = objectiveDefaults(cfg, given)
	if cfg.Method == MethodFull && !given("lora_r") && !given("lora_targets") {
		cfg.LoRARank, cfg.LoRATarget = 0, nil // the LoRA defaults do not apply to full fine-tuning
	}
	if cfg.InitAdapter != "" && cfg.Method != MethodFull && cfg.Method != MethodCustom {
		var err error
		if src.InitAdapter != nil {
			if cfg.InitAdapter, err = src.InitAdapter(cfg.InitAdapter); err != nil {
				return cfg, err
			}
		}
		if cfg, err = withInitAdapter(cfg, given); err != nil {
			return cfg, err
		}
	}
	return cfg, cfg.Validate()
}
