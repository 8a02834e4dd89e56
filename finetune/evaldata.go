package finetune

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/data/hfdata"
)

// Opening a run's validation set (RunSpec.EvalData, or the hold-out Config.EvalSplit of its training data) and
// checking every in-memory dataset against the model before the first step.

// CheckValidation refuses validation settings that do not go together: eval_split and eval_data both, or
// eval_every / early_stopping_patience without a validation set.
func (s RunSpec) CheckValidation() error {
	c := s.Config
	switch {
	case c.EvalSplit > 0 && s.EvalData != "":
		return errors.New("--eval-data and --eval-split both give a validation set: choose one")
	case s.EvalDataSplit != "" && s.EvalData == "":
		return errors.New("--eval-data-split picks the split of --eval-data: give --eval-data too")
	case (c.EvalEvery > 0 || c.EarlyStoppingPatience > 0) && c.EvalSplit == 0 && s.EvalData == "":
		return errors.New("eval_every and early_stopping_patience need a validation set: give --eval-data PATH or --eval-split FRACTION (e.g. 0.05)")
	}
	return nil
}

// EvalDataOptions are the options the validation data (EvalData) is read with.
func (s RunSpec) EvalDataOptions() DataOptions { return s.evalOptions() }

// evalOptions are the options the validation data is read with: the training data's, without augmentation, with
// --columns only for parquet validation data, and its split: EvalDataSplit when given; else for a parquet dataset
// folder its first split of hfdata.EvalSplits (validation, then test, ...; train only when it has none of them)
// and for GLUE the dev split, so that a validation set named like the training data is never its training split;
// else (image folders and tars) the training data's --split. Messages name --eval-data-split.
func (s RunSpec) evalOptions() DataOptions {
	opts := s.DataOptions
	opts.Augment = false
	opts.SplitFlag = "--eval-data-split"
	format := DataFormat(s.EvalData, opts)
	if format != FormatParquet {
		opts.Columns = "" // --columns renames the training parquet's columns
		if !strings.HasPrefix(s.EvalData, "hf://") {
			opts.Config = "" // --data-config is the training dataset's (a Hub dataset's is read with it)
		}
	}
	switch {
	case s.EvalDataSplit != "":
		opts.Split = s.EvalDataSplit
	case format == FormatParquet:
		opts.Split = ""
		if st, err := os.Stat(s.EvalData); err == nil && st.IsDir() {
			opts.Split = hfdata.EvalSplit(s.EvalData, opts.Config)
		}
	case strings.HasPrefix(s.EvalData, "hf://"): // a Hub dataset, downloaded by its validation split (cli/hub.go)
		opts.Split, opts.ValidationSplit = "", true
	case format == FormatGLUE:
		opts.Split = "dev"
	case format != FormatImages && format != FormatImageTar:
		opts.Split = "" // the format has no splits: --split was the training data's
	}
	return opts
}

// splitOf is the split that opts reads of data in format, for messages: the split given, or the format's default.
func splitOf(format string, opts DataOptions) string {
	switch {
	case opts.Split != "":
		return opts.Split
	case format == FormatParquet:
		return hfdata.DefaultSplit
	case format == FormatGLUE:
		return "train"
	}
	return ""
}

// sameData returns a note when the validation set is the training data itself (the same file or folder, and
// split), or "".
func (s RunSpec) sameData() string {
	same := func(a, b string) bool {
		ra, err1 := filepath.EvalSymlinks(a)
		rb, err2 := filepath.EvalSymlinks(b)
		return a == b || err1 == nil && err2 == nil && ra == rb
	}
	if s.EvalData == "" || !same(absData(s.Data), absData(s.EvalData)) {
		return ""
	}
	eval := s.evalOptions()
	trainSplit, evalSplit := splitOf(DataFormat(s.Data, s.DataOptions), s.DataOptions), splitOf(DataFormat(s.EvalData, eval), eval)
	if trainSplit != evalSplit {
		return ""
	}
	what := s.EvalData
	if evalSplit != "" {
		what += " (split " + evalSplit + ")"
	}
	return fmt.Sprintf("validation set: --eval-data %s is the training data itself: its loss measures how the model fits what it trains on, not how it generalises (hold out examples with --eval-split, or give another split or file)", what)
}

// OpenTraining opens the run's training data as OpenData does (batches of batchSize, order from seed) and its
// validation set (nil without one), and checks each in-memory dataset against model (CheckData). With
// Config.EvalSplit the validation set is held out of the training data (HoldOut).
func (s RunSpec) OpenTraining(model Model, batchSize int, seed uint64) (Iterator, EvalSet, error) {
	it, err := OpenData(s.Data, s.DataOptions, model, s.Model, batchSize, seed)
	if err != nil {
		return nil, nil, err
	}
	return s.WithValidation(it, model, batchSize, seed)
}

// WithValidation checks the opened training data it against model (CheckData) and returns it with the run's
// validation set: the hold-out of Config.EvalSplit (it is then replaced by the rest of the data), EvalData
// opened and checked, or none.
func (s RunSpec) WithValidation(it Iterator, model Model, batchSize int, seed uint64) (Iterator, EvalSet, error) {
	if err := s.CheckValidation(); err != nil {
		return nil, nil, &RequestError{err}
	}
	if err := CheckData(model, it, "--data "+s.Data); err != nil {
		return nil, nil, err
	}
	if err := checkObjectiveData(s.Config, it, "--data "+s.Data); err != nil {
		return nil, nil, err
	}
	if f := s.Config.EvalSplit; f > 0 {
		return HoldOut(it, f, seed, batchSize)
	}
	if s.EvalData == "" {
		return it, nil, nil
	}
	// Opened with batches of 1: the loader's batch must fit the set, which may be smaller than a training batch;
	// the evaluation makes its own batches.
	ev, err := OpenData(s.EvalData, s.evalOptions(), model, s.Model, 1, seed)
	if err != nil {
		return nil, nil, fmt.Errorf("--eval-data: %w", err)
	}
	if err := CheckData(model, ev, "--eval-data "+s.EvalData); err != nil {
		return nil, nil, err
	}
	if err := checkObjectiveData(s.Config, ev, "--eval-data "+s.EvalData); err != nil {
		return nil, nil, err
	}
	set, err := EvalSetOf(ev)
	if err != nil {
		return nil, nil, fmt.Errorf("--eval-data %s: %w", s.EvalData, err)
	}
	// The validation set's notes (examples cut, left out) are told as the training data's are.
	var notes []string
	for _, n := range DataNotes(ev) {
		notes = append(notes, "validation set: "+n)
	}
	if n := s.sameData(); n != "" {
		notes = append(notes, n)
	}
	return withNotes(it, notes), set, nil
}

// DataNotes are what opening the data it found worth telling the user: examples cut or left out, the reading
// chosen, the validation set's notes.
func DataNotes(it Iterator) []string {
	switch l := it.(type) {
	case *Loader:
		return l.Notes
	case imageIterator:
		return l.notes
	}
	return nil
}

// withNotes returns it with notes added to its DataNotes (it unchanged for an iterator that keeps none).
func withNotes(it Iterator, notes []string) Iterator {
	if len(notes) == 0 {
		return it
	}
	switch l := it.(type) {
	case *Loader:
		l.Notes = append(l.Notes, notes...)
	case imageIterator:
		l.notes = append(slices.Clone(l.notes), notes...)
		return l
	}
	return it
}

// EvalSetOf returns the whole dataset of an opened iterator as a validation set, in its stored order: the
// examples of a Loader, the images of an image loader (decoded a batch at a time, without augmentation).
func EvalSetOf(it Iterator) (EvalSet, error) {
	switch l := it.(type) {
	case *Loader:
		if _, ok := l.Data["labels"]; !ok && !isPairData(l) {
			return nil, errors.New("the data has no labels to score")
		}
		return ExamplesEval{l.Data}, nil
	case imageIterator:
		return ImagesEval{Source: l.l.Source, Pre: l.l.Pre}, nil
	}
	return nil, fmt.Errorf("data read as %T cannot be evaluated whole: give a file memfit reads into memory or an image folder/tar", it)
}

// holdOutStream is the PCG stream of the hold-out permutation (the epochs' shuffles use streams 0, 1, ...).
const holdOutStream = 0x5eed_e7a1_0000_0000

// HoldOut splits the opened training data it into a training part and a validation set: ceil(frac x N) of its N
// examples (at least one), chosen by a permutation drawn from seed, are the validation set and are never
// trained on; the rest, in their stored order, are batched and shuffled as before. The split depends only on
// (seed, N), so a resumed run holds out the same examples. In-memory data (a Loader) is split by example;
// image folders, tars and IDX files by image, before anything is decoded.
func HoldOut(it Iterator, frac float64, seed uint64, batchSize int) (Iterator, EvalSet, error) {
	unit := "examples"
	if l, ok := it.(*Loader); ok {
		if _, packed := l.Data["position_ids"]; packed {
			unit = "packed sequences" // --packing: the hold-out is of the sequences examples were packed into
		}
	}
	split := func(n int) (train, eval []int, err error) {
		k := max(1, int(math.Ceil(frac*float64(n))))
		if n-k < batchSize {
			return nil, nil, fmt.Errorf("--eval-split %g holds out %d of the %d %s, leaving %d to train on, fewer than a batch (%d): lower --eval-split or --batch-size, or give --eval-data", frac, k, n, unit, n-k, batchSize)
		}
		perm := rand.New(rand.NewPCG(seed, holdOutStream)).Perm(n)
		eval, train = slices.Clone(perm[:k]), slices.Clone(perm[k:])
		slices.Sort(eval)
		slices.Sort(train)
		return train, eval, nil
	}
	switch l := it.(type) {
	case *Loader:
		train, eval, err := split(l.Data.Len())
		if err != nil {
			return nil, nil, &RequestError{err}
		}
		trainEx, evalEx := Examples{}, Examples{}
		for name, t := range l.Data {
			if trainEx[name], err = gatherRows(t, train); err != nil {
				return nil, nil, err
			}
			if evalEx[name], err = gatherRows(t, eval); err != nil {
				return nil, nil, err
			}
		}
		nl, err := NewLoader(trainEx, l.BatchSize, l.Seed, l.Shuffle)
		if err != nil {
			return nil, nil, err
		}
		nl.Notes = l.Notes
		if unit != "examples" {
			nl.Notes = append(slices.Clone(nl.Notes), fmt.Sprintf("--eval-split %g holds out %d of the %d %s (%d of the %d examples packed into them) for validation",
				frac, len(eval), len(eval)+len(train), unit, examples(Batch(evalEx)), examples(Batch(l.Data))))
		}
		return nl, ExamplesEval{evalEx}, nil
	case imageIterator:
		src := l.l.Source
		train, eval, err := split(src.Len())
		if err != nil {
			return nil, nil, &RequestError{err}
		}
		nl, err := data.NewImageLoader(data.Pick(src, train), l.l.Pre, l.l.Aug, l.l.BatchSize, l.l.Seed, l.l.Shuffle)
		if err != nil {
			return nil, nil, err
		}
		return imageIterator{l: nl, notes: l.notes}, ImagesEval{Source: data.Pick(src, eval), Pre: l.l.Pre}, nil
	}
	return nil, nil, &RequestError{fmt.Errorf("--eval-split cannot hold out examples of data read as %T (it is streamed, not indexed): give a separate --eval-data", it)}
}

// CheckData checks an opened dataset against model before the first step: every example of in-memory data
// (a Loader: safetensors, text, Alpaca, GLUE) at once (CheckExamples); streamed data is checked batch by batch
// as it is drawn. what names the data in the error ("--data FILE").
func CheckData(model Model, it Iterator, what string) error {
	if l, ok := it.(*Loader); ok {
		if err := CheckExamples(model, l.Data); err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
	}
	return nil
}

// CheckExamples checks a whole in-memory dataset against model: the tensors' shapes against each other
// (attention_mask as input_ids, labels [N] or as input_ids) and, with the model's own batch check, token ids
// within the vocabulary, labels within the classes, masks of 0 and 1, sequences within the model's positions,
// images of its size. The error names the first bad example by its index (0-based).
func CheckExamples(model Model, ex Examples) error {
	if isPairBatch(Batch(ex)) {
		for i, half := range pairHalves(Batch(ex)) {
			if err := CheckExamples(model, Examples(half)); err != nil {
				return fmt.Errorf("the %s completions: %w", [2]string{"chosen", "rejected"}[i], err)
			}
		}
		return nil
	}
	if ids, ok := ex["input_ids"]; ok {
		dims := ids.Shape().Dimensions
		if m, ok := ex["attention_mask"]; ok && !slices.Equal(m.Shape().Dimensions, dims) {
			return fmt.Errorf("attention_mask has shape %v but input_ids %v: they must match (one mask value per token)", m.Shape().Dimensions, dims)
		}
		if l, ok := ex["labels"]; ok && l.Rank() != 1 && !slices.Equal(l.Shape().Dimensions, dims) {
			return fmt.Errorf("labels have shape %v but input_ids %v: token labels must match input_ids, class labels are [%d]", l.Shape().Dimensions, dims, dims[0])
		}
	}
	c, ok := model.(interface{ CheckBatch(Batch) error })
	if !ok {
		return nil
	}
	err := c.CheckBatch(Batch(ex))
	if err == nil {
		return nil
	}
	// Name the example: the first slice of rows that fails, then its first row.
	n := ex.Len()
	const chunk = 256
	for start := 0; start < n; start += chunk {
		end := min(n, start+chunk)
		if rowsPass(c.CheckBatch, ex, start, end) {
			continue
		}
		for i := start; i < end; i++ {
			if !rowsPass(c.CheckBatch, ex, i, i+1) {
				return fmt.Errorf("example %d of %d (0-based): %w; fix or remove that example", i, n, err)
			}
		}
	}
	return err
}

// rowsPass reports whether rows [start, end) of ex pass check.
func rowsPass(check func(Batch) error, ex Examples, start, end int) bool {
	idx := make([]int, 0, end-start)
	for i := start; i < end; i++ {
		idx = append(idx, i)
	}
	b := Batch{}
	for name, t := range ex {
		g, err := gatherRows(t, idx)
		if err != nil {
			return false
		}
		b[name] = g
	}
	defer func() {
		for _, t := range b {
			t.MustFinalizeAll()
		}
	}()
	return check(b) == nil
}

// labelsWithin returns an error naming the first image of src whose label is not one of the model's classes
// classes, or nil (and nil for a model without a head, whose error is the caller's).
func labelsWithin(src data.ImageSource, classes int) error {
	if classes == 0 {
		return nil
	}
	for i := range src.Len() {
		if l := src.Label(i); l >= classes {
			return fmt.Errorf("%s (0-based) has label %d, outside the model's %d classes (num_labels in its config.json): fix or remove that image, or give the model a head of %d",
				src.Name(i), l, classes, len(src.Classes()))
		}
	}
	return nil
}
