package finetune

// DPO's reference log-likelihoods computed once (Config.PrecomputeRef), as TRL's precompute_ref_log_probs: before
// the first step, the reference model (the policy as it starts) scores every pair of the training and validation
// data once; the scores join the data as its RefChosen and RefRejected tensors, so no step runs the reference
// model, and they are cached in the output folder (ReferenceFile), where a resumed run reads them back before it
// restores its data position (the data's fingerprint covers them).

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/preference"
	"github.com/memfit/memfit/runner"
	"github.com/memfit/memfit/safetensors"
)

// ReferenceFile is the cache, in a DPO run's output folder, of the reference log-likelihoods precompute_ref
// computed: "<set>.chosen" and "<set>.rejected" [N] float32 for the training set ("train") and the validation
// set ("eval"), with each set's fingerprint in the metadata.
const ReferenceFile = "reference-logps.safetensors"

// referenceSets are the data a run's reference log-likelihoods belong to, by name: the training examples and
// the validation examples (nil without a validation set, or for data that is not in memory).
func referenceSets(data Iterator, validation EvalSet) (map[string]Examples, error) {
	l, ok := data.(*Loader)
	if !ok || !isPairData(l) {
		return nil, fmt.Errorf("precompute_ref scores preference pairs held in memory; the data is %T", data)
	}
	sets := map[string]Examples{"train": l.Data}
	if validation != nil {
		ev, ok := validation.(ExamplesEval)
		if !ok {
			return nil, fmt.Errorf("precompute_ref scores a validation set of preference pairs; it is %T", validation)
		}
		sets["eval"] = ev.Examples
	}
	return sets, nil
}

// pairFingerprint hashes a pair dataset without its reference log-likelihoods.
func pairFingerprint(ex Examples) string {
	own := Examples{}
	for n, t := range ex {
		if !isReferenceInput(n) {
			own[n] = t
		}
	}
	return own.Fingerprint()
}

// referenceSum is the SHA-256 of a set's reference log-likelihoods (chosen, then rejected), written into the
// cache's metadata so that a damaged cache is named as such on resume (it would otherwise change the data's
// fingerprint, and the resume would blame the data).
func referenceSum(ex Examples) string {
	h := sha256.New()
	for _, n := range []string{preference.RefChosen, preference.RefRejected} {
		ex[n].MustConstFlatData(func(flat any) {
			_ = binary.Write(h, binary.LittleEndian, flat)
		})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// attachReference adds the cached reference log-likelihoods of out/ReferenceFile to the data (resume); a cache
// that is missing or was computed for other data is an error.
func attachReference(out string, data Iterator, validation EvalSet) error {
	sets, err := referenceSets(data, validation)
	if err != nil {
		return err
	}
	path := filepath.Join(out, ReferenceFile)
	f, err := safetensors.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s is missing: the run's reference log-likelihoods (precompute_ref) were computed before its first step and kept there; without them it cannot continue: start it again with --overwrite", path)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	meta := f.Metadata()
	for name, ex := range sets {
		if got := meta[name+".fingerprint"]; got != pairFingerprint(ex) {
			return fmt.Errorf("%s holds the reference log-likelihoods of other %s data (fingerprint %q, the data's %q): the data changed since the run started", path, name, got, pairFingerprint(ex))
		}
		for _, side := range []struct{ key, input string }{{"chosen", preference.RefChosen}, {"rejected", preference.RefRejected}} {
			t, err := f.Tensor(name + "." + side.key)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if t.Rank() != 1 || t.Shape().Dim(0) != ex.Len() {
				return fmt.Errorf("%s: %s.%s has shape %v for %d pairs", path, name, side.key, t.Shape().Dimensions, ex.Len())
			}
			ex[side.input] = t
		}
		// Caches written before 2026-11-27 carry no checksum.
		if want, ok := meta[name+".sha256"]; ok && want != referenceSum(ex) {
			return fmt.Errorf("%s: the %s reference log-likelihoods do not match the checksum written with them: the file is corrupt; the run cannot continue without them (start it again with --overwrite)", path, name)
		}
	}
	if l, ok := data.(*Loader); ok {
		l.fingerprint = ""
	}
	return nil
}

// precomputeReference scores every pair of the training and validation data with tr at its first step (the
// policy as it starts: DPO's reference), adds the scores to the data and, with an output folder, writes them to
// out/ReferenceFile. progress (may be nil) is called after each batch with the pairs done and the total.
func precomputeReference(tr *Trainer, out string, data Iterator, validation EvalSet, progress func(done, total int)) error {
	if tr.Step != 0 {
		return fmt.Errorf("the reference log-likelihoods are the starting model's: computing them at step %d would score another model", tr.Step)
	}
	sets, err := referenceSets(data, validation)
	if err != nil {
		return err
	}
	total := 0
	for _, ex := range sets {
		total += ex.Len()
	}
	params, set := tr.Current()
	r := runner.NewOutputsRunner(tr.Backend, tr.Model, func(b models.Bound, batch map[string]*graph.Node) []*graph.Node {
		ids := graph.Concatenate([]*graph.Node{batch[preference.ChosenIDs], batch[preference.RejectedIDs]}, 0)
		mask := graph.Concatenate([]*graph.Node{batch[preference.ChosenMask], batch[preference.RejectedMask]}, 0)
		labels := graph.Concatenate([]*graph.Node{batch[preference.ChosenLabels], batch[preference.RejectedLabels]}, 0)
		return []*graph.Node{preference.SequenceLogProbs(tr.Model.Logits(b, map[string]*graph.Node{"input_ids": ids, "attention_mask": mask}), labels)}
	})
	defer r.Release()
	cache, meta := map[string]*tensors.Tensor{}, map[string]string{}
	done := 0
	for _, name := range []string{"train", "eval"} {
		ex, ok := sets[name]
		if !ok {
			continue
		}
		chosen, rejected := make([]float32, 0, ex.Len()), make([]float32, 0, ex.Len())
		err := ExamplesEval{ex}.Batches(max(1, tr.Config.BatchSize), func(b Batch, first int) error {
			outs, err := r.Run(params, set, b)
			if err != nil {
				return fmt.Errorf("reference log-likelihoods of pairs %d to %d: %w", first, first+b.Size()-1, err)
			}
			defer outs[0].MustFinalizeAll()
			n := b.Size()
			outs[0].MustConstFlatData(func(f any) {
				v := f.([]float32)
				chosen, rejected = append(chosen, v[:n]...), append(rejected, v[n:]...)
			})
			if done += n; progress != nil {
				progress(done, total)
			}
			return nil
		})
		if err != nil {
			return err
		}
		meta[name+".fingerprint"] = pairFingerprint(ex)
		ex[preference.RefChosen] = tensors.FromFlatDataAndDimensions(chosen, len(chosen))
		ex[preference.RefRejected] = tensors.FromFlatDataAndDimensions(rejected, len(rejected))
		meta[name+".sha256"] = referenceSum(ex)
		cache[name+".chosen"], cache[name+".rejected"] = ex[preference.RefChosen], ex[preference.RefRejected]
	}
	if l, ok := data.(*Loader); ok {
		l.fingerprint = ""
	}
	if out == "" {
		return nil
	}
	return safetensors.WriteTensors(filepath.Join(out, ReferenceFile), cache, "", meta)
}
