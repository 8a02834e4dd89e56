package data

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/gomlx/gomlx/core/tensors"
)

// ImageLoader yields batches of an ImageSource without end, decoding one batch at a time (memory is bounded by a
// batch whatever the dataset's size): "pixel_values" float32 [B, C, H, W] and "labels" int32 [B]. The order of
// each epoch is drawn from (Seed, epoch) and the augmentation of each example from (Seed, epoch, position), so
// State/Restore reproduce the exact next batch. The last incomplete batch of an epoch is dropped.
type ImageLoader struct {
	Source    ImageSource
	Pre       Preprocessor
	Aug       *Augment
	BatchSize int
	Seed      uint64
	Shuffle   bool

	epoch, pos  int
	order       []int
	fingerprint string
}

// NewImageLoader returns a loader positioned at the start of epoch 0.
func NewImageLoader(src ImageSource, pre Preprocessor, aug *Augment, batchSize int, seed uint64, shuffle bool) (*ImageLoader, error) {
	if batchSize <= 0 || batchSize > src.Len() {
		return nil, fmt.Errorf("batch size %d does not fit %d images", batchSize, src.Len())
	}
	l := &ImageLoader{Source: src, Pre: pre, Aug: aug, BatchSize: batchSize, Seed: seed, Shuffle: shuffle}
	l.startEpoch(0)
	return l, nil
}

func (l *ImageLoader) startEpoch(epoch int) {
	l.epoch, l.pos = epoch, 0
	n := l.Source.Len()
	l.order = make([]int, n)
	for i := range l.order {
		l.order[i] = i
	}
	if l.Shuffle {
		r := rand.New(rand.NewPCG(l.Seed, uint64(epoch)))
		r.Shuffle(n, func(i, j int) { l.order[i], l.order[j] = l.order[j], l.order[i] })
	}
}

// Next decodes and returns the next batch.
func (l *ImageLoader) Next() (map[string]*tensors.Tensor, error) {
	if l.pos+l.BatchSize > len(l.order) {
		l.startEpoch(l.epoch + 1)
	}
	idx := l.order[l.pos : l.pos+l.BatchSize]
	var r *rand.Rand
	if l.Aug != nil {
		r = rand.New(rand.NewPCG(l.Seed^0x9e3779b97f4a7c15, uint64(l.epoch)<<32|uint64(l.pos)))
	}
	b, err := pixelBatch(l.Source, l.Pre, idx, l.Aug, r)
	if err != nil {
		return nil, err
	}
	l.pos += l.BatchSize
	return b, nil
}

func pixelBatch(src ImageSource, pre Preprocessor, idx []int, aug *Augment, r *rand.Rand) (map[string]*tensors.Tensor, error) {
	per := pre.Channels * pre.Height * pre.Width
	px := make([]float32, 0, len(idx)*per)
	labels := make([]int32, len(idx))
	for k, i := range idx {
		img, err := src.Image(i)
		if err != nil {
			return nil, err
		}
		px = append(px, pre.Pixels(img, aug, r)...)
		labels[k] = int32(src.Label(i))
	}
	return map[string]*tensors.Tensor{
		"pixel_values": tensors.FromFlatDataAndDimensions(px, len(idx), pre.Channels, pre.Height, pre.Width),
		"labels":       tensors.FromFlatDataAndDimensions(labels, len(idx)),
	}, nil
}

// LoadImages decodes every image of src without augmentation, in order (for evaluation sets).
func LoadImages(src ImageSource, pre Preprocessor) (map[string]*tensors.Tensor, error) {
	idx := make([]int, src.Len())
	for i := range idx {
		idx[i] = i
	}
	return pixelBatch(src, pre, idx, nil, nil)
}

type loaderState struct {
	Epoch, Pos int
	Seed       uint64
	N          int
	// Data is the source's Fingerprint (absent in checkpoints before 2026-11-24).
	Data string `json:",omitempty"`
}

// Fingerprint hashes the source's class names and each image's name and label (SHA-256), so that a resume can
// tell images added, removed, renamed or relabelled since its checkpoint (not pixels edited in place: that would
// mean decoding every image). It is computed once.
func (l *ImageLoader) Fingerprint() string {
	if l.fingerprint == "" {
		l.fingerprint = SourceFingerprint(l.Source)
	}
	return l.fingerprint
}

// SourceFingerprint hashes an image source's class names and each image's name and label (SHA-256, 16 hex
// digits): what ImageLoader.Fingerprint and a validation set of images are told apart by.
func SourceFingerprint(src ImageSource) string {
	h := sha256.New()
	fmt.Fprintf(h, "%q\n", src.Classes())
	for i := range src.Len() {
		fmt.Fprintf(h, "%s\x00%d\n", src.Name(i), src.Label(i))
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// State returns the position (epoch, offset) with the seed and dataset it belongs to.
func (l *ImageLoader) State() (json.RawMessage, error) {
	return json.Marshal(loaderState{Epoch: l.epoch, Pos: l.pos, Seed: l.Seed, N: l.Source.Len(), Data: l.Fingerprint()})
}

// ErrDataChanged is returned by Restore when the data is not the data the position was taken on.
var ErrDataChanged = errors.New("the data differs from the checkpoint's")

// SameData compares a saved position's dataset (wasN items of unit, fingerprint was; "" when the position has
// none) with the data now (nowN items, fingerprint now, called only when needed) and returns an ErrDataChanged
// naming the difference (contents: what the fingerprint covers), or nil.
func SameData(unit, contents string, wasN, nowN int, was string, now func() string) error {
	if wasN != nowN {
		return fmt.Errorf("%w: it had %d %s, the data now has %d: resume with the data the run started with, or start a new run", ErrDataChanged, wasN, unit, nowN)
	}
	if was != "" && was != now() {
		return fmt.Errorf("%w: the same number of %s (%d) but other %s (fingerprint %s, now %s): resume with the data the run started with, or start a new run", ErrDataChanged, unit, wasN, contents, was, now())
	}
	return nil
}

// Restore moves to a position returned by State.
func (l *ImageLoader) Restore(state json.RawMessage) error {
	var s loaderState
	if err := json.Unmarshal(state, &s); err != nil {
		return fmt.Errorf("data position: %w", err)
	}
	if err := SameData("images", "names, labels or classes", s.N, l.Source.Len(), s.Data, l.Fingerprint); err != nil {
		return err
	}
	if s.Seed != l.Seed || s.Pos < 0 || s.Pos > s.N {
		return fmt.Errorf("data position %+v does not fit this dataset (seed %d, %d images)", s, l.Seed, l.Source.Len())
	}
	l.startEpoch(s.Epoch)
	l.pos = s.Pos
	return nil
}
