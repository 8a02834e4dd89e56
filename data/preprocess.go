package data

import (
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/color"
	"math/rand/v2"
	"os"
	"path/filepath"

	"golang.org/x/image/draw"

	"github.com/memfit/memfit/internal/readfile"
)

// Preprocessor turns images into a model's pixel_values as a Hugging Face ViTImageProcessor configured by
// preprocessor_config.json does: resize to Height x Width (bilinear or bicubic), rescale (x RescaleFactor),
// normalise ((x - mean) / std per channel), channels first.
type Preprocessor struct {
	Channels, Height, Width int
	DoResize                bool
	// Resample is PIL's code: 2 bilinear (also used for anything else but 3), 3 bicubic (Catmull-Rom).
	Resample      int
	DoRescale     bool
	RescaleFactor float64
	DoNormalize   bool
	Mean, Std     []float64
}

// ReadPreprocessor reads dir/preprocessor_config.json for a model with the given channels and image size; when
// the file is absent it returns ViTImageProcessor's defaults (resize bilinear, rescale 1/255, mean = std = 0.5).
func ReadPreprocessor(dir string, channels, imageSize int) (Preprocessor, error) {
	p := Preprocessor{Channels: channels, Height: imageSize, Width: imageSize, DoResize: true, Resample: 2,
		DoRescale: true, RescaleFactor: 1.0 / 255, DoNormalize: true}
	for c := 0; c < channels; c++ {
		p.Mean, p.Std = append(p.Mean, 0.5), append(p.Std, 0.5)
	}
	path := filepath.Join(dir, "preprocessor_config.json")
	raw, err := readfile.Read(path, readfile.Config)
	if errors.Is(err, os.ErrNotExist) {
		return p, nil
	}
	if err != nil {
		return p, err
	}
	var j struct {
		DoResize      *bool          `json:"do_resize"`
		Size          map[string]int `json:"size"`
		Resample      *int           `json:"resample"`
		DoRescale     *bool          `json:"do_rescale"`
		RescaleFactor *float64       `json:"rescale_factor"`
		DoNormalize   *bool          `json:"do_normalize"`
		Mean          []float64      `json:"image_mean"`
		Std           []float64      `json:"image_std"`
	}
	if err := json.Unmarshal(raw, &j); err != nil {
		return p, fmt.Errorf("%s: %w", path, err)
	}
	if j.DoResize != nil {
		p.DoResize = *j.DoResize
	}
	if h, ok := j.Size["height"]; ok {
		p.Height = h
	}
	if w, ok := j.Size["width"]; ok {
		p.Width = w
	}
	if s, ok := j.Size["shortest_edge"]; ok {
		p.Height, p.Width = s, s
	}
	if j.Resample != nil {
		p.Resample = *j.Resample
	}
	if j.DoRescale != nil {
		p.DoRescale = *j.DoRescale
	}
	if j.RescaleFactor != nil {
		p.RescaleFactor = *j.RescaleFactor
	}
	if j.DoNormalize != nil {
		p.DoNormalize = *j.DoNormalize
	}
	if j.Mean != nil {
		p.Mean = j.Mean
	}
	if j.Std != nil {
		p.Std = j.Std
	}
	if p.DoNormalize && (len(p.Mean) != channels || len(p.Std) != channels) {
		return p, fmt.Errorf("%s: image_mean and image_std need %d values (the model's channels), got %d and %d",
			path, channels, len(p.Mean), len(p.Std))
	}
	if p.Height != imageSize || p.Width != imageSize {
		return p, fmt.Errorf("%s: size %dx%d differs from the model's image_size %d", path, p.Height, p.Width, imageSize)
	}
	return p, nil
}

// Augment is the training-time augmentation: a random crop of the resized image padded by Pad pixels on each side
// (edge pixels repeated; Pad 0: no crop) and a horizontal flip with probability one half when Flip.
type Augment struct {
	Pad  int
	Flip bool
}

// Pixels returns img as C*H*W float32 values, augmented with r when aug is not nil.
func (p Preprocessor) Pixels(img image.Image, aug *Augment, r *rand.Rand) []float32 {
	b := img.Bounds()
	if p.DoResize && (b.Dx() != p.Width || b.Dy() != p.Height) {
		dst := image.NewRGBA(image.Rect(0, 0, p.Width, p.Height))
		var scaler draw.Scaler = draw.BiLinear
		if p.Resample == 3 {
			scaler = draw.CatmullRom
		}
		scaler.Scale(dst, dst.Bounds(), img, b, draw.Src, nil)
		img, b = dst, dst.Bounds()
	}
	h, w := p.Height, p.Width
	offY, offX, flip := 0, 0, false
	if aug != nil && r != nil {
		if aug.Pad > 0 {
			offY, offX = r.IntN(2*aug.Pad+1)-aug.Pad, r.IntN(2*aug.Pad+1)-aug.Pad
		}
		flip = aug.Flip && r.IntN(2) == 1
	}
	out := make([]float32, p.Channels*h*w)
	clamp := func(v, hi int) int { return min(max(v, 0), hi-1) }
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			sx := x + offX
			if flip {
				sx = w - 1 - x + offX
			}
			sy := y + offY
			c := img.At(b.Min.X+clamp(sx, b.Dx()), b.Min.Y+clamp(sy, b.Dy()))
			var vals [3]float64
			if p.Channels == 1 {
				g := color.GrayModel.Convert(c).(color.Gray)
				vals[0] = float64(g.Y)
			} else {
				r8, g8, b8, _ := c.RGBA()
				vals = [3]float64{float64(r8 >> 8), float64(g8 >> 8), float64(b8 >> 8)}
			}
			for ch := 0; ch < p.Channels; ch++ {
				v := vals[min(ch, 2)]
				if p.DoRescale {
					v *= p.RescaleFactor
				}
				if p.DoNormalize {
					v = (v - p.Mean[ch]) / p.Std[ch]
				}
				out[(ch*h+y)*w+x] = float32(v)
			}
		}
	}
	return out
}
