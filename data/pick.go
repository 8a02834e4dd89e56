package data

import (
	"image"

	"github.com/gomlx/gomlx/core/tensors"
)

// Pick returns the images of src at the given indices, in that order, with src's labels and classes (a hold-out
// split of an image dataset: nothing is decoded).
func Pick(src ImageSource, index []int) ImageSource {
	return &picked{src: src, index: append([]int(nil), index...)}
}

type picked struct {
	src   ImageSource
	index []int
}

func (p *picked) Len() int                         { return len(p.index) }
func (p *picked) Label(i int) int                  { return p.src.Label(p.index[i]) }
func (p *picked) Classes() []string                { return p.src.Classes() }
func (p *picked) Image(i int) (image.Image, error) { return p.src.Image(p.index[i]) }
func (p *picked) Name(i int) string                { return p.src.Name(p.index[i]) }

// ImageBatch decodes the images of src at idx without augmentation: "pixel_values" float32 [len(idx), C, H, W]
// and "labels" int32 [len(idx)], as an ImageLoader's batches (for evaluation passes over a whole set).
func ImageBatch(src ImageSource, pre Preprocessor, idx []int) (map[string]*tensors.Tensor, error) {
	return pixelBatch(src, pre, idx, nil, nil)
}
