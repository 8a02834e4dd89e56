package finetune

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/gomlx/compute"

	"github.com/memfit/memfit/attention"
	"github.com/memfit/memfit/engine"
)

// Recipe is one training run from start to end, the way `finetune train` runs it: take the output folder (locked,
// cleared of a killed save's leftovers, refused when it holds another run), open the model and the data, create
// the backend, let the Planner choose the config and the MemoryCheck refuse what cannot fit, make the trainer (or
// resume it from the folder's latest checkpoint), write run.yaml, train with metrics and checkpoints, and
// export. The CLI, the demo, the shipped models' pretraining and the CPU benchmark train through it; Hooks are
// where a caller prints.
//
// Run it with Run. A Recipe without Out writes nothing to disk: the metrics go to Metrics, and the trained
// Trainer is in the Result.
type Recipe struct {
	// Spec is the run: the base model folder, the data and how to read it, and the config. On Resume it is the
	// run's own (ReadRunSpec), with Steps possibly raised.
	Spec RunSpec
	// Out is the output folder: it receives run.yaml, metrics.jsonl, the checkpoints (Config.CheckpointEvery and
	// the last step) and the exports. "" for none.
	Out string
	// Resume continues the run in Out from its latest checkpoint exactly; Overwrite starts a new run in an Out
	// that holds one, deleting its files (CheckFreshRun).
	Resume, Overwrite bool
	// Backend trains the run. When nil, Run creates the backend of BackendSpec (engine.ChooseSpec: "" for
	// $MEMFIT_BACKEND or the pure-Go one) once the model and data are open; Result.Backend holds it.
	Backend     compute.Backend
	BackendSpec string
	// Model, when not nil, is trained instead of loading Spec.Model, which is then only recorded (run.yaml,
	// exports); Data, when not nil, is read instead of opening Spec.Data (a Planner that changes the micro-batch
	// needs Data nil, so that Run can open the data again at its size).
	Model Model
	Data  Iterator
	// Options go to New (or Resume): WithAdapters for a custom adapter.
	Options []Option
	// Plan, when not nil, chooses the config the run trains with once the model and data are open (the memory
	// autopilot of package plan: a per-block plan, a micro-batch). Check, when not nil, then refuses a run that
	// cannot fit (plan.CheckMachine).
	Plan  Planner
	Check MemoryCheck
	// Metrics receives the JSONL metrics of a run without Out (nil: none); with Out they go to
	// Out/metrics.jsonl.
	Metrics io.Writer
	// Export says what Run writes into Out after the last step.
	Export Export
	// Hooks observe the run.
	Hooks RunHooks
}

// Setup is a run once its model and data are open: what a Planner and a MemoryCheck are given.
type Setup struct {
	Backend compute.Backend
	Model   Model
	Config  Config
	// Data is the run's data; one that reads from it must leave it at the position it found.
	Data Iterator
}

// Planner returns the config a run trains with, from the config it was given (package plan's memory autopilot
// sets its block_plan, and may change its batch_size and accum_steps, keeping their product).
type Planner func(s Setup) (Config, error)

// MemoryCheck refuses a run whose step cannot fit where it trains (plan.CheckMachine), before any step.
type MemoryCheck func(s Setup) error

// Export is what a Recipe writes into its output folder after the last step.
type Export struct {
	// Adapter writes the run's PEFT adapter into Out/adapter (runs with adapters; ExportAdapter).
	Adapter bool
	// Merged, when not empty, is a folder that receives the merged model as a complete Hugging Face folder
	// (ExportMergedFolder, with the run's tokenizer).
	Merged string
}

// RunHooks observe a Recipe's run, in the order they are called.
type RunHooks struct {
	// OnDataNote receives each note of opening the data (examples cut or left out).
	OnDataNote func(note string)
	// OnResolved sees the run as it will train (after the Planner; the trainer is ready), before run.yaml is
	// written.
	OnResolved func(spec RunSpec)
	// OnMetricsTrimmed is called on a resume that dropped lines of metrics.jsonl written after the checkpoint
	// of step (or cut short).
	OnMetricsTrimmed func(path string, lines, step int)
	// OnReference follows the scoring of the pairs by the reference model (precompute_ref), once per batch: the
	// pairs done and the total.
	OnReference func(done, total int)
	// OnNote receives what a resume chose or repaired in the output folder, in a line (resumed from best/ of a
	// run without another checkpoint; best/ restored from the resumed checkpoint after a kill).
	OnNote func(note string)
	// OnStart sees the trainer before the first step; an error stops the run there.
	OnStart func(tr *Trainer) error
	// Hooks are the loop's (Trainer.Fit): every step, checkpoint and skipped batch.
	Hooks
	// OnTrained is called after the last step, before the exports.
	OnTrained func(tr *Trainer)
}

// Result is what a Recipe's Run made.
type Result struct {
	// Trainer is the trained run (also after a failed step or a cancellation, to tell its step); nil when Run
	// stopped before making it. Release it when done.
	Trainer *Trainer
	// Spec is the run as it trained (after the Planner).
	Spec RunSpec
	// Backend is the backend the run trained on: Recipe.Backend, or the one Run created (the caller finalizes
	// that one).
	Backend compute.Backend
	// AdapterDir and MergedDir are where the exports were written ("" for none).
	AdapterDir, MergedDir string
}

// RequestError is an error in what a Recipe was asked to do, found before any step: an output folder that holds
// another run, a config the trainer refuses, fewer steps than a resumed checkpoint reached. The CLI reports it as
// a usage error.
type RequestError struct{ Err error }

// Error returns the underlying error's message.
func (e *RequestError) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error.
func (e *RequestError) Unwrap() error { return e.Err }

// Run runs the recipe: see Recipe. ctx cancellation stops the training after the current step, with a
// checkpoint when there is an output folder (the error wraps context.Canceled; Result.Trainer tells the step).
// A run that fails before writing anything into an Out it created leaves no folder behind.
func (r Recipe) Run(ctx context.Context) (res *Result, err error) {
	spec, out := r.Spec, r.Out
	res = &Result{Spec: spec, Backend: r.Backend}
	if r.Resume && out == "" {
		return res, &RequestError{errors.New("a resumed run needs its output folder")}
	}
	if out != "" {
		_, statErr := os.Stat(out)
		created := errors.Is(statErr, fs.ErrNotExist)
		var unlock func()
		if unlock, err = LockRun(out); err != nil {
			return res, err
		}
		defer func() {
			if err != nil && created {
				removeIfOnlyLock(out) // before unlocking: no other process can take the lock in between
			}
			unlock()
		}()
		if err := CleanStale(out); err != nil {
			return res, err
		}
		if !r.Resume {
			inputs := []string{spec.Model, spec.DataOptions.Tokenizer, spec.Config.InitAdapter}
			inputs = append(inputs, strings.Split(spec.Data, ",")...) // an IDX pair is two paths
			if spec.EvalData != "" {
				inputs = append(inputs, strings.Split(spec.EvalData, ",")...)
			}
			if err := CheckFreshRun(out, r.Overwrite, inputs...); err != nil {
				return res, &RequestError{err}
			}
		}
	}
	model, data := r.Model, r.Data
	if model == nil {
		if model, err = LoadModel(spec.Model, spec.Config); err != nil {
			return res, err
		}
	}
	// The data is checked against the model here, before anything is printed (OnResolved) or trained.
	var validation EvalSet
	if data == nil {
		data, validation, err = spec.OpenTraining(model, spec.Config.BatchSize, spec.Config.Seed)
	} else {
		data, validation, err = spec.WithValidation(data, model, spec.Config.BatchSize, spec.Config.Seed)
	}
	if err != nil {
		return res, err
	}
	if r.Hooks.OnDataNote != nil {
		for _, n := range DataNotes(data) {
			r.Hooks.OnDataNote(n)
		}
	}
	if l, ok := data.(*Loader); ok && l.ChatTemplate != "" {
		// run.yaml records the template the conversations took (auto resolved), so a resume renders them alike
		spec.DataOptions.ChatTemplate = l.ChatTemplate
		res.Spec = spec
	}
	if spec.DataOptions.Packing && spec.Config.Attention == attention.KindFlash.String() && r.Hooks.OnDataNote != nil {
		r.Hooks.OnDataNote("--packing with --attention flash: the fused flash op takes a causal mask and sequence lengths, not the block-diagonal mask of packed sequences; their attention runs memory-efficient (the same values, the scores computed in full)")
	}
	backend := r.Backend
	if backend == nil {
		if backend, err = engine.NewBackend(engine.ChooseSpec(r.BackendSpec)); err != nil {
			return res, err
		}
		res.Backend = backend
	}
	if r.Plan != nil {
		cfg, err := r.Plan(Setup{Backend: backend, Model: model, Config: spec.Config, Data: data})
		if err != nil {
			return res, err
		}
		if cfg.BatchSize != spec.Config.BatchSize {
			if r.Data != nil {
				return res, fmt.Errorf("the planner changed the micro-batch from %d to %d, which needs the data opened again: give the data as Spec.Data, not as an Iterator",
					spec.Config.BatchSize, cfg.BatchSize)
			}
			if data, validation, err = spec.OpenTraining(model, cfg.BatchSize, cfg.Seed); err != nil {
				return res, err
			}
		}
		spec.Config = cfg
		res.Spec = spec
	}
	if r.Check != nil {
		if err := r.Check(Setup{Backend: backend, Model: model, Config: spec.Config, Data: data}); err != nil {
			return res, err
		}
	}
	if spec.Config.PrecomputeRef && r.Resume {
		// Before the trainer restores the data position: the data's fingerprint covers them.
		if err := attachReference(out, data, validation); err != nil {
			return res, err
		}
	}
	tr, err := r.trainer(spec, model, backend, data)
	if err != nil {
		return res, err
	}
	res.Trainer = tr
	if spec.Config.PrecomputeRef && !r.Resume {
		if err := precomputeReference(tr, out, data, validation, r.Hooks.OnReference); err != nil {
			return res, err
		}
	}
	tr.Validation = validation
	if err := tr.CheckValidationSet(); err != nil {
		flag := "--eval-data " + spec.EvalData
		if spec.EvalData == "" {
			flag = fmt.Sprintf("--eval-split %g", spec.Config.EvalSplit)
		}
		return res, fmt.Errorf("%s: %w", flag, err)
	}
	if r.Resume {
		note, err := SyncBest(out, tr)
		if err != nil {
			return res, err
		}
		if note != "" && r.Hooks.OnNote != nil {
			r.Hooks.OnNote(note)
		}
	}
	if r.Hooks.OnResolved != nil {
		r.Hooks.OnResolved(spec)
	}
	var metrics io.Writer
	if out != "" {
		if err := WriteRunSpec(out, spec); err != nil {
			return res, err
		}
		path := filepath.Join(out, MetricsFile)
		if r.Resume {
			if n, err := TrimMetrics(path, tr.Step); err != nil {
				return res, err
			} else if n > 0 && r.Hooks.OnMetricsTrimmed != nil {
				r.Hooks.OnMetricsTrimmed(path, n, tr.Step)
			}
		}
		log, err := OpenMetrics(path)
		if err != nil {
			return res, err
		}
		defer log.Close()
		metrics = log
	} else if r.Metrics != nil {
		metrics = r.Metrics
	}
	if r.Hooks.OnStart != nil {
		if err := r.Hooks.OnStart(tr); err != nil {
			return res, err
		}
	}
	if err := tr.Fit(ctx, data, out, metrics, r.Hooks.Hooks); err != nil {
		return res, err
	}
	if r.Hooks.OnTrained != nil {
		r.Hooks.OnTrained(tr)
	}
	if r.Export.Adapter && out != "" && tr.Adapters != nil {
		dir := filepath.Join(out, "adapter")
		if err := tr.ExportAdapterAt(dir, spec.ModelName(), spec.ModelRevision()); err != nil {
			return res, err
		}
		res.AdapterDir = dir
	}
	if r.Export.Merged != "" {
		if err := tr.ExportMergedFolder(r.Export.Merged, spec.Model, spec.DataOptions.Tokenizer); err != nil {
			return res, err
		}
		res.MergedDir = r.Export.Merged
	}
	return res, nil
}

// trainer makes the run's trainer: New, or on Resume the latest checkpoint in Out checked against spec.
func (r Recipe) trainer(spec RunSpec, model Model, backend compute.Backend, data Iterator) (*Trainer, error) {
	if !r.Resume {
		tr, err := New(model, spec.Config, backend, r.Options...)
		if err != nil {
			return nil, &RequestError{err}
		}
		return tr, nil
	}
	from, fromBest, err := ResumeCheckpoint(r.Out)
	if err != nil {
		return nil, err
	}
	tr, err := Resume(from, model, backend, data, r.Options...)
	if err != nil {
		if errors.Is(err, ErrDataChanged) {
			return nil, fmt.Errorf("--data %s: %w", spec.Data, err)
		}
		return nil, err
	}
	if fromBest && r.Hooks.OnNote != nil {
		r.Hooks.OnNote(fmt.Sprintf("%s has no latest checkpoint (the run was stopped before writing one): resuming from its best checkpoint %s (step %d)", r.Out, from, tr.Step))
	}
	if diff := ConfigDiff(spec.Config, tr.Config); len(diff) > 0 {
		return nil, fmt.Errorf("%s does not match the checkpoint it resumes (here = run.yaml, there = the checkpoint): %s",
			filepath.Join(r.Out, RunFile), strings.Join(diff, "; "))
	}
	if spec.Config.Steps < tr.Step {
		have := fmt.Sprintf("export what it reached with finetune export --run %s --out DIR", r.Out)
		if _, err := os.Stat(filepath.Join(r.Out, "adapter", AdapterConfig)); err == nil {
			have = "the run's adapter is in " + filepath.Join(r.Out, "adapter")
		}
		return nil, &RequestError{fmt.Errorf("--steps %d is below the step the checkpoint reached (%d): give more steps to continue; %s",
			spec.Config.Steps, tr.Step, have)}
	}
	if spec.Config.Steps != tr.Config.Steps && tr.Config.Schedule != "" && tr.Config.Schedule != "constant" {
		// The learning rate of a decaying schedule depends on the run's length at every step: another --steps
		// would change the rate of the steps still to come (lr 4.9e-5 at step 12, 3.8e-4 at step 13), and a
		// resume continues the run exactly.
		return nil, &RequestError{fmt.Errorf("--steps %d: the run's %s learning-rate schedule decays over its %d steps, and a resume continues it exactly (another length would change the learning rate of every step to come): resume without --steps, or train further in a new run from this one's weights (LoRA: --init-adapter %s; full: finetune export --run %s --format merged, then --model that folder)",
			spec.Config.Steps, tr.Config.Schedule, tr.Config.Steps, filepath.Join(r.Out, "adapter"), r.Out)}
	}
	tr.Config.Steps = spec.Config.Steps
	if err := tr.Config.Validate(); err != nil {
		return nil, &RequestError{err}
	}
	return tr, nil
}

// removeIfOnlyLock removes the output folder a failed run created when it holds nothing but its lock file: a run
// refused at load (a bad config.json, non-finite weights) leaves no folder behind.
func removeIfOnlyLock(out string) {
	entries, err := os.ReadDir(out)
	if err != nil || len(entries) != 1 || entries[0].Name() != LockFile {
		return
	}
	if os.Remove(filepath.Join(out, LockFile)) == nil {
		_ = os.Remove(out)
	}
}
