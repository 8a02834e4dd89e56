package finetune

// Image data for image classifiers (ImageModel: ViT): image folders, tars and IDX files, preprocessed as the
// model folder's preprocessor_config.json says. A family of image classifiers lists ImageFormats in
// Family.Formats and OpenImageData as its OpenData.

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/memfit/memfit/data"
)

// ImageFormats are the data formats OpenImageData reads.
var ImageFormats = []string{FormatImages, FormatImageTar, FormatIDX}

// ImageSpec is what image data needs to know of an image classifier: the images it takes (channels, and height
// and width both ImageSize) and its classes.
type ImageSpec struct {
	Channels, ImageSize int
	Labels              []string
}

// ImageModel is an image classifier that describes its inputs.
type ImageModel interface {
	ImageSpec() ImageSpec
}

// ErrNoHead is returned when a bare ViTModel (no classification head) is to be trained: it has no loss.
var ErrNoHead = errors.New("the model is a bare ViTModel with no classification head, so it has no loss to train")

// OpenImages opens an image dataset in one of the image formats.
func OpenImages(path, format, split string) (data.ImageSource, error) {
	switch format {
	case FormatImages:
		return data.ImageFolder(filepath.Join(path, split))
	case FormatImageTar:
		return data.ImageTar(path, split)
	case FormatIDX:
		parts := strings.Split(path, ",")
		if len(parts) != 2 {
			return nil, fmt.Errorf("IDX data is \"images.idx[.gz],labels.idx[.gz]\", got %q", path)
		}
		imgs, err := data.ReadIDX(parts[0])
		if err != nil {
			return nil, err
		}
		labs, err := data.ReadIDX(parts[1])
		if err != nil {
			return nil, err
		}
		return data.IDXImages(imgs, labs, nil)
	}
	return nil, fmt.Errorf("%q is not an image format", format)
}

// imageIterator is the Iterator of an image loader, with the notes opening the data gave (DataNotes).
type imageIterator struct {
	l     *data.ImageLoader
	notes []string
}

func wrapImages(l *data.ImageLoader, err error) (Iterator, error) {
	if err != nil {
		return nil, err
	}
	return imageIterator{l: l}, nil
}

func (it imageIterator) Next() (Batch, error) {
	b, err := it.l.Next()
	return Batch(b), err
}

func (it imageIterator) State() (json.RawMessage, error) { return it.l.State() }

func (it imageIterator) Restore(s json.RawMessage) error { return it.l.Restore(s) }

// OpenImageData opens image data (ImageFormats, or parquet of images) for an image classifier (ImageModel): its
// classes must be the model's, and the images are preprocessed as the model folder's preprocessor_config.json
// says (a family's OpenData).
func OpenImageData(src DataSource) (Iterator, error) {
	path, opts, modelDir := src.Path, src.Options, src.ModelDir
	im, ok := src.Model.(ImageModel)
	if !ok {
		return nil, fmt.Errorf("image data needs an image classifier; %s", familyTitle(src.Model))
	}
	spec := im.ImageSpec()
	images, err := openImageSource(path, src.Format, opts)
	if err != nil {
		return nil, err
	}
	if len(spec.Labels) == 0 || len(spec.Labels) != len(images.Classes()) {
		if err := labelsWithin(images, len(spec.Labels)); err != nil && src.Format == FormatIDX {
			return nil, fmt.Errorf("%s: %w", path, err) // the labels are the classes: name the image that has too many
		}
		return nil, fmt.Errorf("%s has %d classes %v but the model classifies %d: give the model a head of %d (finetune init --from %s --num-labels %d --out NEW)",
			path, len(images.Classes()), images.Classes(), len(spec.Labels), len(images.Classes()), modelDir, len(images.Classes()))
	}
	pre, err := data.ReadPreprocessor(modelDir, spec.Channels, spec.ImageSize)
	if err != nil {
		return nil, err
	}
	var aug *data.Augment
	if opts.Augment {
		aug = &data.Augment{Pad: max(1, spec.ImageSize/8), Flip: true}
	}
	return wrapImages(data.NewImageLoader(images, pre, aug, src.BatchSize, src.Seed, true))
}
