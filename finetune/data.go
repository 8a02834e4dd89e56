package finetune

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"

	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/runner"
)

// Batch is one batch of model inputs by name ("pixel_values", "input_ids", "labels", ...): runner.Batch, which
// evaluation shares.
type Batch = runner.Batch

// Iterator yields batches without end (epochs follow each other) and can save and restore its position, so a
// resumed run sees exactly the batches it would have seen.
type Iterator interface {
	// Next returns the next batch.
	Next() (Batch, error)
	// State returns the iterator's position as JSON.
	State() (json.RawMessage, error)
	// Restore moves the iterator to a position returned by State.
	Restore(json.RawMessage) error
}

// Examples is an in-memory dataset: tensors whose first axis indexes examples (every tensor has the same
// number of examples).
type Examples map[string]*tensors.Tensor

// Len returns the number of examples.
func (e Examples) Len() int { return Batch(e).Size() }

// Loader batches Examples in a shuffled order that is drawn again each epoch from (Seed, epoch): batches of
// BatchSize examples; the last incomplete batch of an epoch is dropped so every batch has the same shape.
type Loader struct {
	Data      Examples
	BatchSize int
	Seed      uint64
	// Shuffle orders each epoch randomly; without it the order is 0..N-1.
	Shuffle bool
	// Notes are what reading the data found worth telling the user (examples cut or left out).
	Notes []string
	// ChatTemplate is the chat template conversations took (chattemplate.Chat's Name: model, llama3, chatml or
	// alpaca; "" for other data): run.yaml records it.
	ChatTemplate string

	epoch, pos  int
	order       []int
	fingerprint string // of Data, computed once (Fingerprint)
}

// NewLoader returns a loader over data.
func NewLoader(data Examples, batchSize int, seed uint64, shuffle bool) (*Loader, error) {
	n := data.Len()
	if n == 0 {
		return nil, fmt.Errorf("the dataset is empty")
	}
	for name, t := range data {
		if t.Rank() == 0 || t.Shape().Dim(0) != n {
			return nil, fmt.Errorf("dataset tensor %q has shape %s: every tensor needs the %d examples on its first axis", name, t.Shape(), n)
		}
	}
	if _, packed := data["position_ids"]; packed && batchSize > n {
		// A batch is of packed sequences: say so, not "the dataset size" in examples the user does not see.
		return nil, fmt.Errorf("--packing made %d examples into %d sequences, fewer than --batch-size %d (a batch is of packed sequences): lower --batch-size to %d or less, or --seq-len (fewer examples in each sequence)",
			examples(Batch(data)), n, batchSize, n)
	}
	if batchSize <= 0 || batchSize > n {
		return nil, fmt.Errorf("batch size %d must be in 1..%d (the dataset size)", batchSize, n)
	}
	l := &Loader{Data: data, BatchSize: batchSize, Seed: seed, Shuffle: shuffle}
	l.startEpoch(0)
	return l, nil
}

func (l *Loader) startEpoch(epoch int) {
	n := l.Data.Len()
	l.epoch, l.pos = epoch, 0
	l.order = make([]int, n)
	for i := range l.order {
		l.order[i] = i
	}
	if l.Shuffle {
		r := rand.New(rand.NewPCG(l.Seed, uint64(epoch)))
		r.Shuffle(n, func(i, j int) { l.order[i], l.order[j] = l.order[j], l.order[i] })
	}
}

// Next returns the next batch.
func (l *Loader) Next() (Batch, error) {
	if l.pos+l.BatchSize > len(l.order) {
		l.startEpoch(l.epoch + 1)
	}
	idx := l.order[l.pos : l.pos+l.BatchSize]
	l.pos += l.BatchSize
	b := Batch{}
	for name, t := range l.Data {
		g, err := gatherRows(t, idx)
		if err != nil {
			return nil, fmt.Errorf("dataset tensor %q: %w", name, err)
		}
		b[name] = g
	}
	return b, nil
}

// ErrDataChanged is returned by a resume whose data is not the data of its checkpoint (data.ErrDataChanged for
// image loaders).
var ErrDataChanged = data.ErrDataChanged

// Epoch returns the current epoch (0-based).
func (l *Loader) Epoch() int { return l.epoch }

type loaderState struct {
	Epoch, Pos int
	Seed       uint64
	// N and Data describe the dataset the position belongs to (absent in checkpoints before 2026-11-24).
	N    int    `json:",omitempty"`
	Data string `json:",omitempty"`
}

// Fingerprint hashes the dataset (SHA-256 of its tensors' names, dtypes, shapes and bytes), so a resume can tell
// that the data changed since its checkpoint. It is computed once.
func (l *Loader) Fingerprint() string {
	if l.fingerprint == "" {
		l.fingerprint = l.Data.Fingerprint()
	}
	return l.fingerprint
}

// Fingerprint hashes the examples (SHA-256 of their tensors' names, dtypes, shapes and bytes; 16 hex digits).
func (e Examples) Fingerprint() string {
	h := sha256.New()
	for _, name := range slices.Sorted(maps.Keys(e)) {
		t := e[name]
		fmt.Fprintf(h, "%s %s %v\n", name, t.DType(), t.Shape().Dimensions)
		_ = t.ConstBytes(func(b []byte) { h.Write(b) })
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// State returns the position (epoch and offset).
func (l *Loader) State() (json.RawMessage, error) {
	return json.Marshal(loaderState{Epoch: l.epoch, Pos: l.pos, Seed: l.Seed, N: l.Data.Len(), Data: l.Fingerprint()})
}

// Restore moves to a saved position.
func (l *Loader) Restore(state json.RawMessage) error {
	var s loaderState
	if err := json.Unmarshal(state, &s); err != nil {
		return fmt.Errorf("data position: %w", err)
	}
	if s.N > 0 { // positions written before 2026-11-24 carry neither count nor fingerprint
		contents := "contents"
		if l.ChatTemplate != "" { // the tokens are the template's rendering: it may be what changed
			contents = fmt.Sprintf("token ids (the conversations as the chat template %s renders them: if the file did not change, the template or the tokenizer did)", l.ChatTemplate)
		}
		if err := data.SameData("examples", contents, s.N, l.Data.Len(), s.Data, l.Fingerprint); err != nil {
			return err
		}
	}
	if s.Seed != l.Seed || s.Pos < 0 || s.Pos > l.Data.Len() {
		return fmt.Errorf("data position %+v does not fit this dataset (seed %d, %d examples)", s, l.Seed, l.Data.Len())
	}
	l.startEpoch(s.Epoch)
	l.pos = s.Pos
	return nil
}

// gatherRows copies rows idx of t (first axis) into a new tensor.
func gatherRows(t *tensors.Tensor, idx []int) (*tensors.Tensor, error) {
	dims := append([]int(nil), t.Shape().Dimensions...)
	rowBytes := t.Shape().Memory() / uintptr(dims[0])
	dims[0] = len(idx)
	out := tensors.FromShape(shapes.Make(t.DType(), dims...))
	if out.Shape().Size() == 0 {
		return out, nil
	}
	var err error
	cerr := t.ConstBytes(func(src []byte) {
		err = out.MutableBytes(func(dst []byte) {
			for i, r := range idx {
				copy(dst[uintptr(i)*rowBytes:uintptr(i+1)*rowBytes], src[uintptr(r)*rowBytes:uintptr(r+1)*rowBytes])
			}
		})
	})
	if cerr != nil {
		return nil, cerr
	}
	return out, err
}
