package finetune

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/memfit/memfit/internal/readfile"
)

// Hooks observe a training run.
type Hooks struct {
	// OnStep is called after every optimizer step.
	OnStep func(StepStats)
	// OnCheckpoint is called after a checkpoint is written.
	OnCheckpoint func(dir string)
	// OnSkip is called when a batch without a target token (every label -100) is skipped, with the step it was
	// drawn for and the number skipped so far in this Fit.
	OnSkip func(step, skipped int)
	// OnEval is called after each evaluation of the validation set (Trainer.Validation).
	OnEval func(EvalStats)
}

// maxSkipsInARow bounds how many batches without a target token Fit skips in a row before it stops: data that
// has none would otherwise be drawn forever.
const maxSkipsInARow = 1000

// Fit trains until Config.Steps optimizer steps are done (continuing from t.Step after a resume), or early
// stopping ends the run (Trainer.Validation, Config.EarlyStoppingPatience: EvalState.Stopped), drawing
// Config.AccumSteps batches from data per step. Every LogEvery steps (and at the last step) a line is appended
// to metrics (JSONL, when metrics is not nil); every CheckpointEvery steps and at the end a checkpoint is
// written to outDir/checkpoint-<step> (when outDir is not empty). With a validation set, every
// Config.EvalEvery steps and at the last step it is evaluated (an "eval" line in metrics, hooks.OnEval) and the
// checkpoint of the lowest validation loss kept in outDir/BestDir (an evaluation that improves writes the step's
// checkpoint-<step>, then copies it to BestDir). ctx cancellation stops after the current step with a checkpoint.
//
// The steps run device-resident (TrainStepAsync): their loss and gradient norm are read back (Sync) only at
// logging, checkpoint and last steps, and at least every syncEvery steps, which is also where a non-finite
// step is found and reported (hooks.OnStep sees every step; StepStats.Synced says which carry a loss).
func (t *Trainer) Fit(ctx context.Context, data Iterator, outDir string, metrics io.Writer, hooks Hooks) error {
	if err := t.CheckValidationSet(); err != nil {
		return err
	}
	enc := (*json.Encoder)(nil)
	if metrics != nil {
		enc = json.NewEncoder(metrics)
	}
	saved := t.Step // the step of the newest checkpoint this call wrote (or resumed from)
	var minLoss, firstLoss float64
	skipped := 0
	targets, _ := t.Model.(targetChecker)
	for t.Step < t.Config.Steps && !t.EvalState.Stopped {
		var pos json.RawMessage
		if outDir != "" {
			var err error
			if pos, err = data.State(); err != nil {
				return fmt.Errorf("reading the data position: %w", err)
			}
		}
		batches := make([]Batch, t.Config.AccumSteps)
		for i, inARow := 0, 0; i < len(batches); {
			b, err := data.Next()
			if err != nil {
				return t.stopOnDataError(fmt.Errorf("reading the data for step %d: %w", t.Step+1, err), outDir, data, pos, saved, hooks)
			}
			if targets != nil && !targets.HasTargets(b) {
				skipped++
				if inARow++; inARow >= maxSkipsInARow {
					return t.stopOnDataError(fmt.Errorf("reading the data for step %d: %d batches in a row have no target token (every label is -100): the data has nothing to learn from", t.Step+1, inARow), outDir, data, pos, saved, hooks)
				}
				if hooks.OnSkip != nil {
					hooks.OnSkip(t.Step+1, skipped)
				}
				continue
			}
			batches[i], inARow = b, 0
			i++
		}
		start := time.Now()
		stats, err := t.TrainStepAsync(batches)
		if err != nil {
			return err
		}
		stats.SkippedBatches = skipped
		last := t.Step == t.Config.Steps
		evalStep := t.Validation != nil && (last || (t.Config.EvalEvery > 0 && t.Step%t.Config.EvalEvery == 0))
		logStep := last || evalStep || (t.Config.LogEvery > 0 && t.Step%t.Config.LogEvery == 0)
		checkpoint := outDir != "" && (last || (t.Config.CheckpointEvery > 0 && t.Step%t.Config.CheckpointEvery == 0))
		if !stats.Synced && (logStep || checkpoint || ctx.Err() != nil || t.Step%t.syncEvery() == 0) {
			if stats.Loss, stats.GradNorm, err = t.Sync(); err != nil {
				return err
			}
			stats.Synced, stats.Metrics = true, t.lastMetrics
			stats.setSeconds(time.Since(start).Seconds() - stats.CompileSeconds)
			if firstLoss == 0 {
				firstLoss, minLoss = stats.Loss, stats.Loss
			}
			minLoss = min(minLoss, stats.Loss)
			if f := t.Config.DivergenceFactor; f > 0 && stats.Loss > max(f*minLoss, 3*firstLoss) {
				return fmt.Errorf("%w: the loss reached %.4g at step %d, more than %g times its lowest (%.4g) and 3 times its first (%.4g): lower the learning rate (the last checkpoint is from step %d)",
					ErrDiverged, stats.Loss, stats.Step, f, minLoss, firstLoss, saved)
			}
		}
		if hooks.OnStep != nil {
			hooks.OnStep(stats)
		}
		if enc != nil && logStep {
			if err := enc.Encode(stats); err != nil {
				// The step is done and its data consumed: a checkpoint here (when the disk still takes one)
				// loses nothing.
				return t.stopWithCheckpoint(fmt.Errorf("writing metrics: %w", err), outDir, data, saved, hooks,
					"free space and continue with --resume")
			}
		}
		improved := false
		if evalStep {
			ev, err := t.validate()
			if err != nil {
				return t.stopWithCheckpoint(err, outDir, data, saved, hooks, "fix it and continue with --resume")
			}
			improved = ev.Best
			if hooks.OnEval != nil {
				hooks.OnEval(ev)
			}
			if enc != nil {
				if err := enc.Encode(ev); err != nil {
					return t.stopWithCheckpoint(fmt.Errorf("writing metrics: %w", err), outDir, data, saved, hooks,
						"free space and continue with --resume")
				}
			}
		}
		stop := ctx.Err() != nil // Save syncs when the hook cancelled after an unsynced step
		// An evaluation that improves writes the step's checkpoint first (it carries the evaluation state), then
		// best/ as a copy of it: a kill between the two leaves latest naming a checkpoint whose best is itself,
		// and resuming restores best/ from it (SyncBest); best/ is never ahead of the run's checkpoints, and a run
		// without --checkpoint-every still has a checkpoint to resume from.
		checkpoint = checkpoint || (outDir != "" && (stop || t.EvalState.Stopped || improved))
		if checkpoint {
			dir := filepath.Join(outDir, fmt.Sprintf("checkpoint-%d", t.Step))
			if err := t.Save(dir, data); err != nil {
				return err
			}
			saved = t.Step
			if err := writeLatest(outDir, filepath.Base(dir)); err != nil {
				return err
			}
			if err := pruneCheckpoints(outDir, t.Config.KeepCheckpoints); err != nil {
				return err
			}
			if hooks.OnCheckpoint != nil {
				hooks.OnCheckpoint(dir)
			}
			if improved {
				if err := copyCheckpoint(dir, filepath.Join(outDir, BestDir)); err != nil {
					return fmt.Errorf("saving the best checkpoint: %w", err)
				}
			}
		}
		if stop {
			return ctx.Err()
		}
	}
	return nil
}

// ErrDiverged is returned by Fit when the loss grows far beyond its lowest value (Config.DivergenceFactor).
var ErrDiverged = errors.New("the run diverged")

// stopOnDataError ends Fit on a data error: with an output folder and steps done since the last checkpoint, it
// first writes a checkpoint of them, with the data position from before the failed step's batches, so a resume
// after the data is fixed retrains nothing and skips nothing.
func (t *Trainer) stopOnDataError(err error, outDir string, data Iterator, pos json.RawMessage, saved int, hooks Hooks) error {
	return t.stopWithCheckpoint(err, outDir, positionAt{data, pos}, saved, hooks, "fix the data and continue with --resume")
}

// stopWithCheckpoint ends Fit with err: with an output folder and steps done since the last checkpoint (saved),
// it first writes a checkpoint of them at data's position; fix tells the user what to do before resuming.
func (t *Trainer) stopWithCheckpoint(err error, outDir string, data Iterator, saved int, hooks Hooks, fix string) error {
	if outDir == "" || t.Step == saved {
		return err
	}
	dir := filepath.Join(outDir, fmt.Sprintf("checkpoint-%d", t.Step))
	if serr := t.Save(dir, data); serr != nil {
		return fmt.Errorf("%w (and the checkpoint failed: %v)", err, serr)
	}
	if serr := writeLatest(outDir, filepath.Base(dir)); serr != nil {
		return fmt.Errorf("%w (and the checkpoint failed: %v)", err, serr)
	}
	if hooks.OnCheckpoint != nil {
		hooks.OnCheckpoint(dir)
	}
	return fmt.Errorf("%w (checkpoint written at step %d: %s)", err, t.Step, fix)
}

// positionAt is an Iterator whose State is a saved position.
type positionAt struct {
	Iterator
	pos json.RawMessage
}

func (p positionAt) State() (json.RawMessage, error) { return p.pos, nil }

// syncEvery is the most steps Fit runs without reading a loss back: LogEvery, or 10 when it is 0 (a
// diverged run must stop in time even without periodic logging).
func (t *Trainer) syncEvery() int {
	if t.Config.LogEvery > 0 {
		return t.Config.LogEvery
	}
	return 10
}

// LatestFile names the file in an output folder that holds the name of the newest checkpoint.
const LatestFile = "latest"

func writeLatest(outDir, name string) error {
	tmp, err := os.CreateTemp(outDir, ".latest-*")
	if err != nil {
		return err
	}
	if _, err := tmp.WriteString(name + "\n"); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	if err := tmp.Chmod(0o644); err != nil { // os.CreateTemp makes it 0600: others who read the run read it too
		tmp.Close()
		os.Remove(tmp.Name())
		return err
	}
	tmp.Close()
	return os.Rename(tmp.Name(), filepath.Join(outDir, LatestFile))
}

// LatestCheckpoint returns the newest complete checkpoint folder under outDir.
func LatestCheckpoint(outDir string) (string, error) {
	data, err := readfile.Read(filepath.Join(outDir, LatestFile), readfile.Small)
	if err != nil {
		return "", fmt.Errorf("no checkpoint in %s: %w", outDir, err)
	}
	name := string(data)
	for len(name) > 0 && (name[len(name)-1] == '\n' || name[len(name)-1] == ' ') {
		name = name[:len(name)-1]
	}
	if name == "" || filepath.Base(name) != name {
		return "", fmt.Errorf("%s: invalid checkpoint name %q", filepath.Join(outDir, LatestFile), name)
	}
	return filepath.Join(outDir, name), nil
}
