package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"

	"github.com/gomlx/compute"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/safetensors"
)

// CPUCase is one configuration of the side-by-side CPU benchmark (`finetune bench cpu`, bench/cpu/compare.sh):
// a checkpoint folder that both sides load, a method and the batch shape.
type CPUCase struct {
	// Key is the label ("a", "b", "c"); Name a short name used in file names.
	Key      string `json:"key"`
	Name     string `json:"name"`
	Describe string `json:"describe"`
	// Model is the checkpoint folder (Hugging Face layout) that memfit trains and the reference loads.
	Model string `json:"model"`
	// Method is a grid method name: "full" or "lora-all" (the reference implements these two).
	Method string `json:"method"`
	Batch  int    `json:"batch"`
	Seq    int    `json:"seq,omitempty"`
	// StepGoal is the largest memfit-plain / PyTorch step-time ratio the issue accepts for this case.
	StepGoal float64 `json:"step_goal"`
}

// Tag returns the case's file-name tag, e.g. "a-vit-ti-full".
func (c CPUCase) Tag() string { return c.Key + "-" + c.Name }

// Unit is "tokens/s" for a sequence model, "images/s" otherwise.
func (c CPUCase) Unit() string {
	if c.Seq > 0 {
		return "tokens/s"
	}
	return "images/s"
}

// PerStep is the number of examples (images) or tokens one step processes.
func (c CPUCase) PerStep() int {
	if c.Seq > 0 {
		return c.Batch * c.Seq
	}
	return c.Batch
}

// QLoRAPrefix marks a memfit-only variant of a LoRA case trained as QLoRA (NF4 base weights, the same adapters):
// "qlora/plain" is plain QLoRA. The reference has no QLoRA (no bitsandbytes on the CPU), so such a row is
// compared with memfit's LoRA row only.
const QLoRAPrefix = "qlora/"

// CPUCaseNames are the names of CPUCases' cases by key.
var CPUCaseNames = map[string]string{"a": "vit-ti-full", "b": "llama-tiny-lora", "c": "llama-256-lora", "d": "roberta-tiny-full"}

// CPUCases writes the CPU grid's scaled ViT and LLaMA (ScaledModels, random weights) into workDir and returns
// the three cases: (a) the ViT-Ti-shaped encoder, full fine-tuning, batch 16; (b) llamaTiny (memfit's
// pretrained/llama-tiny) LoRA r on every linear layer, batch 8 x 256; (c) the grid's hidden-256 LLaMA, LoRA on
// every linear layer, batch 4 x 256.
func CPUCases(workDir, llamaTiny string) ([]CPUCase, error) {
	if _, err := os.Stat(filepath.Join(llamaTiny, "config.json")); err != nil {
		return nil, fmt.Errorf("llama-tiny checkpoint: %w (run from the repository root or pass its folder)", err)
	}
	tms, err := ScaledModels(workDir)
	if err != nil {
		return nil, err
	}
	return []CPUCase{
		{Key: "a", Name: CPUCaseNames["a"], Model: tms[0].Dir, Method: "full", Batch: 16, StepGoal: 0.8,
			Describe: "ViT-Ti-shaped encoder (hidden 192, 3 heads, MLP 768, patch 16 at 224 = 197 tokens, 4 layers, 10 classes), full fine-tuning, batch 16"},
		{Key: "b", Name: CPUCaseNames["b"], Model: llamaTiny, Method: "lora-all", Batch: 8, Seq: 256, StepGoal: 0.8,
			Describe: "pretrained/llama-tiny (hidden 128, 4 heads / 2 kv heads of 32, MLP 352, 4 layers, vocabulary 4096, tied embeddings), LoRA on every linear layer, batch 8 x 256"},
		{Key: "c", Name: CPUCaseNames["c"], Model: tms[1].Dir, Method: "lora-all", Batch: 4, Seq: 256, StepGoal: 0.8,
			Describe: "the CPU grid's LLaMA (hidden 256, 4 heads / 2 kv heads of 64, MLP 688, 4 layers, vocabulary 1024), LoRA on every linear layer, batch 4 x 256"},
	}, nil
}

// RobertaCPUCase returns the encoder case: (d) robertaTiny (memfit's pretrained/roberta-tiny, a RobertaForMaskedLM:
// hidden 128, 4 post-LN layers, 4 heads, GELU MLP 512, vocabulary 4096, decoder tied to the word embeddings),
// full fine-tuning on masked-LM batches of 32 x 128 (the family's random batch: 15% of the positions labelled,
// -100 elsewhere). Full fine-tuning because the reference then needs no adapter target set of its own.
func RobertaCPUCase(robertaTiny string) (CPUCase, error) {
	if _, err := os.Stat(filepath.Join(robertaTiny, "config.json")); err != nil {
		return CPUCase{}, fmt.Errorf("roberta-tiny checkpoint: %w (run from the repository root or pass its folder)", err)
	}
	return CPUCase{Key: "d", Name: CPUCaseNames["d"], Model: robertaTiny, Method: "full", Batch: 32, Seq: 128, StepGoal: 0.8,
		Describe: "pretrained/roberta-tiny (RobertaForMaskedLM: hidden 128, 4 post-LN layers, 4 heads, GELU MLP 512, vocabulary 4096, tied decoder), full fine-tuning, masked LM, batch 32 x 128"}, nil
}

// CPUSettings are the training settings both sides use.
type CPUSettings struct {
	// Warmup steps (the first builds and compiles memfit's step) and timed Steps.
	Warmup int `json:"warmup"`
	Steps  int `json:"steps"`
	// Attention is memfit's attention kind (the reference computes softmax(q k^T / sqrt(d)) v and keeps the
	// probabilities, as memfit's "standard").
	Attention string  `json:"attention"`
	LoRARank  int     `json:"lora_r"`
	LoRAAlpha float64 `json:"lora_alpha"`
	LR        float64 `json:"lr"`
	Beta1     float64 `json:"beta1"`
	Beta2     float64 `json:"beta2"`
	Eps       float64 `json:"eps"`
	// WeightDecay of AdamW (0: memfit's default; torch's AdamW default of 0.01 is overridden).
	WeightDecay float64 `json:"weight_decay"`
	DType       string  `json:"dtype"`
	Seed        uint64  `json:"seed"`
}

// DefaultCPUSettings returns the benchmark's defaults: 3 warm-up and 20 timed steps (about 5 minutes for the four cases on a 2-core VM), standard attention, LoRA r=8
// alpha 16, AdamW lr 1e-4 (0.9, 0.999, 1e-8, no weight decay), float32.
func DefaultCPUSettings() CPUSettings {
	d := finetune.Defaults()
	return CPUSettings{Warmup: 3, Steps: 20, Attention: "standard", LoRARank: 8, LoRAAlpha: 16, LR: d.LR,
		Beta1: d.Beta1, Beta2: d.Beta2, Eps: d.Eps, WeightDecay: d.WeightDecay, DType: "float32", Seed: 1}
}

// Validate checks the settings.
func (s CPUSettings) Validate() error {
	switch {
	case s.Warmup < 1:
		return fmt.Errorf("warmup must be at least 1 (the first step compiles), got %d", s.Warmup)
	case s.Steps < 1:
		return fmt.Errorf("steps must be positive, got %d", s.Steps)
	case s.DType != "float32":
		return fmt.Errorf("the CPU comparison runs float32 only, got %q", s.DType)
	}
	return nil
}

// Config returns memfit's training config for case c in variant (a finetune.Variants name, optionally with
// QLoRAPrefix).
func (s CPUSettings) Config(c CPUCase, variant string) (finetune.Config, error) {
	method, err := GridMethodByName(c.Method)
	if err != nil {
		return finetune.Config{}, err
	}
	if c.Method != "full" && c.Method != "lora-all" {
		return finetune.Config{}, fmt.Errorf("case %s: the reference implements methods full and lora-all, not %q", c.Key, c.Method)
	}
	if rest, ok := strings.CutPrefix(variant, QLoRAPrefix); ok {
		// memfit's QLoRA row of a LoRA case: the same adapters over NF4 base weights (no reference).
		if c.Method != "lora-all" {
			return finetune.Config{}, fmt.Errorf("case %s: a %s row needs a LoRA case, not %q", c.Key, QLoRAPrefix, c.Method)
		}
		if method, err = GridMethodByName("qlora"); err != nil {
			return finetune.Config{}, err
		}
		variant = rest
	}
	v, err := finetune.VariantByName(variant)
	if err != nil {
		return finetune.Config{}, err
	}
	base := finetune.Defaults()
	base.LoRARank, base.LoRAAlpha, base.Attention, base.ComputeDType = s.LoRARank, s.LoRAAlpha, s.Attention, s.DType
	base.LR, base.Beta1, base.Beta2, base.Eps, base.WeightDecay = s.LR, s.Beta1, s.Beta2, s.Eps, s.WeightDecay
	base.Seed, base.BatchSize, base.Steps = s.Seed, c.Batch, s.Warmup+s.Steps
	return v.Apply(method.Apply(base)), nil
}

// WriteCPUBatch writes one batch of random inputs for case c (the family's random batch with seed: normal pixels
// and uniform labels; uniform token ids with labels equal to them and a full attention mask for a causal LM;
// uniform non-pad token ids, a full attention mask and labels equal to the ids at a random 15% of the positions,
// -100 elsewhere, for a masked LM) to path as safetensors, for both sides to read.
func WriteCPUBatch(c CPUCase, s CPUSettings, path string) error {
	cfg, err := s.Config(c, "plain")
	if err != nil {
		return err
	}
	model, err := finetune.LoadModel(c.Model, cfg)
	if err != nil {
		return fmt.Errorf("case %s: %w", c.Key, err)
	}
	b := finetune.RandomBatch(model, finetune.Shape{Batch: c.Batch, Seq: c.Seq}, s.Seed)
	if b == nil {
		return fmt.Errorf("case %s: no random batch for this model", c.Key)
	}
	return safetensors.WriteTensors(path, b, "", map[string]string{"case": c.Tag()})
}

// ReadCPUBatch reads a batch written by WriteCPUBatch.
func ReadCPUBatch(path string) (finetune.Batch, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := finetune.Batch{}
	for _, n := range f.Names() {
		t, err := f.Tensor(n)
		if err != nil {
			return nil, err
		}
		b[n] = t
	}
	return b, nil
}

// CPUSideResult is one process's result: one case on one side (memfit in one variant, or the PyTorch
// reference). bench/pytorch/cpu_compare.py writes the same fields.
type CPUSideResult struct {
	Side    string `json:"side"` // "memfit" or "pytorch"
	Case    string `json:"case"` // CPUCase.Tag()
	Variant string `json:"variant"`
	// Losses are every step's loss before its update, warm-up steps included, in order: Losses[0] is the
	// first step's loss (the model's loss on the batch at its initial weights).
	Losses []float64 `json:"losses"`
	Warmup int       `json:"warmup"`
	// StepSeconds are the timed steps' wall times (forward, loss, backward and AdamW update); MedianSeconds
	// their median and PerSecond the throughput at the median in Unit.
	StepSeconds   []float64 `json:"step_seconds"`
	MedianSeconds float64   `json:"median_step_seconds"`
	// RoundMedians, for a row run in several rounds (CPUCompareOptions.Rounds), are each round's median;
	// MedianSeconds is then their median and StepSeconds every round's steps.
	RoundMedians []float64 `json:"round_medians,omitempty"`
	PerSecond    float64   `json:"per_second"`
	Unit         string    `json:"unit"`
	Threads      int       `json:"threads"`
	// RSSBeforeTrainBytes is the process's high-water resident set (VmHWM, /proc/self/status) once the model,
	// the batch and the optimizer are set up, before the first step.
	RSSBeforeTrainBytes int64 `json:"rss_before_train_bytes"`
	// SavedActivationBytes (exact, training-graph walk) and PeakBytes (PeakMethod) are memfit's own figures
	// for its gradient step.
	SavedActivationBytes int64  `json:"saved_activation_bytes,omitempty"`
	PeakBytes            int64  `json:"peak_bytes,omitempty"`
	PeakMethod           string `json:"peak_method,omitempty"`
	// CompileSeconds is the time memfit's first step spent building and compiling its programs (not counted in
	// its step time).
	CompileSeconds float64           `json:"compile_seconds,omitempty"`
	Versions       map[string]string `json:"versions,omitempty"`
	// MaxRSSBytes is the process's maximum resident set size: its VmHWM (/proc/self/status), the high-water mark
	// of the resident memory of the process's own address space, read by the process after its last step.
	MaxRSSBytes int64 `json:"max_rss_bytes"`
	// Filled by the driver: Wait4MaxRSSBytes is ru_maxrss from wait4 on the process and DriverHWMBytes the
	// driver's own VmHWM when it started the process. On Linux ru_maxrss is at least the latter: the child runs
	// in the parent's address space between Go's vfork-style clone and its exec, and exec carries that
	// address space's high-water mark into ru_maxrss; it is the child's own peak only when larger. WallSeconds is
	// the process's run time and Command its command line.
	Wait4MaxRSSBytes int64    `json:"wait4_maxrss_bytes,omitempty"`
	DriverHWMBytes   int64    `json:"driver_hwm_bytes,omitempty"`
	WallSeconds      float64  `json:"wall_seconds,omitempty"`
	Command          []string `json:"command,omitempty"`
}

// FirstLoss returns the first step's loss (NaN if there is none).
func (r *CPUSideResult) FirstLoss() float64 {
	if r == nil || len(r.Losses) == 0 {
		return math.NaN()
	}
	return r.Losses[0]
}

// CPUStepOptions choose what one memfit process of the CPU benchmark runs.
type CPUStepOptions struct {
	Case     CPUCase
	Settings CPUSettings
	Variant  string
	// BatchFile is the batch written by WriteCPUBatch.
	BatchFile string
	// InitFile, when set, receives the trainable adapter tensors before the first step (LoRA only), so that the
	// reference starts from the same adapters.
	InitFile string
	// Profile, when set, receives a CPU profile (pprof) of the timed steps.
	Profile io.Writer
}

// RunCPUStep trains case c in one variant on backend: Warmup steps (the first compiles the step), then Steps
// timed ones, all on the same batch.
func RunCPUStep(backend compute.Backend, o CPUStepOptions) (CPUSideResult, error) {
	s := o.Settings
	if err := s.Validate(); err != nil {
		return CPUSideResult{}, err
	}
	cfg, err := s.Config(o.Case, o.Variant)
	if err != nil {
		return CPUSideResult{}, err
	}
	batch, err := ReadCPUBatch(o.BatchFile)
	if err != nil {
		return CPUSideResult{}, err
	}
	// Every step's loss is read back (the loop syncs at its logging steps) and timed; a benchmark does not judge
	// the run, so it never stops it as diverged.
	cfg.LogEvery, cfg.DivergenceFactor = 1, 0
	r := CPUSideResult{Side: "memfit", Case: o.Case.Tag(), Variant: o.Variant, Warmup: s.Warmup, Unit: o.Case.Unit(),
		Threads: runtime.GOMAXPROCS(0), Versions: MemfitVersions()}
	profiling := false
	var profErr error
	defer func() {
		if profiling {
			pprof.StopCPUProfile()
		}
	}()
	// The library's recipe, without an output folder, on the one batch; the loop's step times are the timings
	// (each step's wall time from its start to its loss read back, less any compile time).
	_, err = finetune.Recipe{Spec: finetune.RunSpec{Model: o.Case.Model, Config: cfg}, Data: sameBatch{batch}, Backend: backend,
		Hooks: finetune.RunHooks{
			OnStart: func(tr *finetune.Trainer) error {
				if o.InitFile != "" && tr.Adapters != nil {
					if err := safetensors.WriteTensors(o.InitFile, tr.Train, "", nil); err != nil {
						return err
					}
				}
				r.RSSBeforeTrainBytes = ProcHWM()
				return nil
			},
			Hooks: finetune.Hooks{OnStep: func(st finetune.StepStats) {
				r.Losses = append(r.Losses, st.Loss)
				if st.Step == 1 {
					r.SavedActivationBytes, r.PeakBytes, r.PeakMethod = st.SavedActivationBytes, st.PeakBytes, st.PeakMethod
					r.CompileSeconds = st.CompileSeconds
				}
				if st.Step > s.Warmup {
					r.StepSeconds = append(r.StepSeconds, st.Seconds)
				}
				if st.Step == s.Warmup && o.Profile != nil && !profiling && profErr == nil {
					profErr = pprof.StartCPUProfile(o.Profile)
					profiling = profErr == nil
				}
			}},
		}}.Run(context.Background())
	if err != nil {
		return r, err
	}
	if profErr != nil {
		return r, profErr
	}
	if profiling {
		pprof.StopCPUProfile()
		profiling = false
	}
	// A high-water mark cannot fall, but the kernel's VmHWM is max(hiwater_rss, the current RSS) where the
	// current RSS is read from per-CPU counters that are only approximately summed (Linux 6.2 and later): a
	// CI run read 21069824 bytes before the steps and 20963328 after. The later reading is held to the earlier.
	r.MaxRSSBytes = max(ProcHWM(), r.RSSBeforeTrainBytes)
	r.MedianSeconds = median(r.StepSeconds)
	r.PerSecond = float64(o.Case.PerStep()) / r.MedianSeconds
	return r, nil
}

// sameBatch is data that is one batch, again and again.
type sameBatch struct{ b finetune.Batch }

func (s sameBatch) Next() (finetune.Batch, error) { return s.b, nil }
func (sameBatch) State() (json.RawMessage, error) { return json.RawMessage("null"), nil }
func (sameBatch) Restore(json.RawMessage) error   { return nil }

// median returns the median of xs (the mean of the middle two for an even count).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

// ProcHWM returns this process's resident-set high-water mark (VmHWM in /proc/self/status) in bytes, or 0 where
// there is no such file.
func ProcHWM() int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			fields := strings.Fields(v)
			if len(fields) > 0 {
				kb, _ := strconv.ParseInt(fields[0], 10, 64)
				return kb << 10
			}
		}
	}
	return 0
}

// MemfitVersions names this binary's Go, GoMLX and compute versions and its matmul kernels.
func MemfitVersions() map[string]string {
	v := map[string]string{"go": runtime.Version(), "gomlx": "?", "compute": "?"}
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			switch dep.Path {
			case "github.com/gomlx/gomlx":
				v["gomlx"] = dep.Version
			case "github.com/gomlx/compute":
				v["compute"] = dep.Version
			}
		}
		for _, s := range info.Settings {
			if s.Key == "GOEXPERIMENT" {
				v["goexperiment"] = s.Value
			}
		}
	}
	v["kernels"] = "plain Go"
	if k := engine.SIMD(); k != "" {
		v["kernels"] = k
	}
	v["godebug"] = os.Getenv("GODEBUG")
	return v
}
