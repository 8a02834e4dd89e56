package demo

import (
	"fmt"
	"image/color"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/memfit/memfit/memory"
)

var runColors = []color.Color{color.RGBA{R: 31, G: 119, B: 180, A: 255}, color.RGBA{R: 214, G: 39, B: 40, A: 255},
	color.RGBA{R: 44, G: 160, B: 44, A: 255}, color.RGBA{R: 148, G: 103, B: 189, A: 255}}

// WritePlot draws the runs' training-loss curves (left) and their memory (right: saved activations and the step
// peak, in MiB) into a PNG file.
func WritePlot(path string, runs []Run) error {
	losses := plot.New()
	losses.Title.Text = "training loss"
	losses.X.Label.Text = "step"
	losses.Y.Label.Text = "loss"
	losses.Legend.Top = true
	for i, r := range runs {
		var pts plotter.XYs
		for _, s := range r.Steps {
			if s.Synced { // the steps whose loss was read back (every LogEvery steps)
				pts = append(pts, plotter.XY{X: float64(s.Step), Y: s.Loss})
			}
		}
		line, err := plotter.NewLine(pts)
		if err != nil {
			return err
		}
		line.Color = runColors[i%len(runColors)]
		line.Width = vg.Points(1.2)
		losses.Add(line)
		losses.Legend.Add(r.Name, line)
	}

	mem := plot.New()
	mem.Title.Text = "memory of one training step (MiB)"
	mem.Y.Label.Text = "MiB"
	w := vg.Points(18)
	var names []string
	for _, r := range runs {
		names = append(names, r.Name)
	}
	series := []struct {
		label string
		value func(Run) float64
	}{
		{"saved activations (exact)", func(r Run) float64 { return float64(r.SavedActivationBytes) / (1 << 20) }},
	}
	peakKnown := true
	for _, r := range runs {
		if _, unavailable := memory.Method(r.PeakMethod).Unavailable(); unavailable {
			peakKnown = false
		}
	}
	if peakKnown {
		series = append(series, struct {
			label string
			value func(Run) float64
		}{"step peak (" + shortMethod(runs) + ")", func(r Run) float64 { return float64(r.PeakBytes) / (1 << 20) }})
	} else {
		// An unavailable peak is no bar of height 0: leave the series out and say so.
		mem.Title.Text += "; step peak unavailable"
	}
	for i, s := range series {
		vals := make(plotter.Values, len(runs))
		for j, r := range runs {
			vals[j] = s.value(r)
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.Color = runColors[(i+2)%len(runColors)]
		bars.LineStyle.Width = 0
		bars.Offset = vg.Length(float64(i)-0.5) * w
		mem.Add(bars)
		mem.Legend.Add(s.label, bars)
	}
	mem.Legend.Top = true
	mem.NominalX(names...)

	const width, height = 11 * vg.Inch, 4.5 * vg.Inch
	img := vgimg.New(width, height)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 1, Cols: 2, PadX: vg.Millimeter * 6, PadY: vg.Millimeter * 4,
		PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2}
	canvases := plot.Align([][]*plot.Plot{{losses, mem}}, tiles, dc)
	losses.Draw(canvases[0][0])
	mem.Draw(canvases[0][1])
	return writePNG(path, img)
}

func shortMethod(runs []Run) string {
	if len(runs) == 0 {
		return "peak"
	}
	m := runs[0].PeakMethod
	switch {
	case strings.HasPrefix(m, "measured"):
		return "measured"
	case strings.HasPrefix(m, "estimate"):
		return "simulated"
	case strings.HasPrefix(m, "XLA"):
		return "XLA compiled"
	}
	return m
}

func writePNG(path string, img *vgimg.Canvas) error {
	png := vgimg.PngCanvas{Canvas: img}
	return writeAtomic(path, func(w interface{ Write([]byte) (int, error) }) error {
		_, err := png.WriteTo(w)
		if err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
		return nil
	})
}
