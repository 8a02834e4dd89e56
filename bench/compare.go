package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"text/tabwriter"

	"github.com/memfit/memfit/internal/readfile"
	"github.com/memfit/memfit/memory"
)

// SideResult is one side's figures for one configuration, read from a `finetune bench step` or
// bench/pytorch/peft_compare.py JSON file.
type SideResult struct {
	Model   string `json:"model"`
	Method  string `json:"method"`
	Variant string `json:"variant"`
	// PeakBytes is the step peak (memfit: simulated or compiled sizes; PyTorch: max_memory_allocated) and
	// DevicePeakBytes memfit's device peak on XLA.
	PeakBytes        int64   `json:"peak_bytes"`
	PeakMethod       string  `json:"peak_method"`
	DevicePeakBytes  int64   `json:"device_peak_bytes"`
	DevicePeakMethod string  `json:"device_peak_method"`
	StepSeconds      float64 `json:"step_seconds"`
	PerSecond        float64 `json:"per_second"`
	Unit             string  `json:"unit"`
}

// peak returns the side's best peak figure: the device's own when measured, else the step peak.
func (s SideResult) peak() (int64, string) {
	if s.DevicePeakBytes > 0 {
		return s.DevicePeakBytes, s.DevicePeakMethod
	}
	return s.PeakBytes, s.PeakMethod
}

// ComparedRow is one configuration with both sides and the ratios issue 10 sets goals on.
type ComparedRow struct {
	Model   string      `json:"model"`
	Method  string      `json:"method"`
	Variant string      `json:"variant"`
	Memfit  *SideResult `json:"memfit,omitempty"`
	PyTorch *SideResult `json:"pytorch,omitempty"`
	// MemfitPeakRatio is memfit's peak over memfit plain's (same model and method); PeakVsPyTorch memfit's peak
	// over PyTorch's for the same configuration; ThroughputVsPyTorch memfit's throughput over PyTorch's.
	MemfitPeakRatio     float64 `json:"memfit_peak_x_plain,omitempty"`
	PyTorchPeakRatio    float64 `json:"pytorch_peak_x_plain,omitempty"`
	PeakVsPyTorch       float64 `json:"memfit_peak_x_pytorch,omitempty"`
	ThroughputVsPyTorch float64 `json:"memfit_throughput_x_pytorch,omitempty"`
}

// ReadComparison reads dir's memfit-*.json and pytorch-*.json files and pairs them by model, method and variant,
// with ratios to the plain variant of each side.
func ReadComparison(dir string) ([]ComparedRow, error) {
	rows := map[string]*ComparedRow{}
	var keys []string
	for _, side := range []string{"memfit", "pytorch"} {
		files, err := filepath.Glob(filepath.Join(dir, side+"-*.json"))
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			b, err := readfile.Read(f, readfile.Config)
			if err != nil {
				return nil, err
			}
			var r SideResult
			if err := json.Unmarshal(b, &r); err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if r.Model == "" || r.Method == "" || r.Variant == "" {
				return nil, fmt.Errorf("%s: model, method or variant missing", f)
			}
			key := r.Model + "\x00" + r.Method + "\x00" + r.Variant
			row, ok := rows[key]
			if !ok {
				row = &ComparedRow{Model: r.Model, Method: r.Method, Variant: r.Variant}
				rows[key] = row
				keys = append(keys, key)
			}
			if side == "memfit" {
				row.Memfit = &r
			} else {
				row.PyTorch = &r
			}
		}
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("no memfit-*.json or pytorch-*.json files in %s", dir)
	}
	sort.Slice(keys, func(i, j int) bool {
		a, b := rows[keys[i]], rows[keys[j]]
		if a.Model != b.Model || a.Method != b.Method {
			return a.Model+a.Method < b.Model+b.Method
		}
		return (a.Variant == "plain") && (b.Variant != "plain") || (a.Variant != "plain") == (b.Variant != "plain") && a.Variant < b.Variant
	})
	out := make([]ComparedRow, 0, len(keys))
	for _, k := range keys {
		r := rows[k]
		plain := rows[r.Model+"\x00"+r.Method+"\x00plain"]
		if plain != nil && r.Memfit != nil && plain.Memfit != nil {
			a, _ := r.Memfit.peak()
			b, _ := plain.Memfit.peak()
			r.MemfitPeakRatio = ratio(a, b)
		}
		if plain != nil && r.PyTorch != nil && plain.PyTorch != nil {
			r.PyTorchPeakRatio = ratio(r.PyTorch.PeakBytes, plain.PyTorch.PeakBytes)
		}
		if r.Memfit != nil && r.PyTorch != nil {
			a, _ := r.Memfit.peak()
			r.PeakVsPyTorch = ratio(a, r.PyTorch.PeakBytes)
			if r.PyTorch.PerSecond > 0 {
				r.ThroughputVsPyTorch = r.Memfit.PerSecond / r.PyTorch.PerSecond
			}
		}
		out = append(out, *r)
	}
	return out, nil
}

// WriteComparison prints the side-by-side table and, per approx-act+ms-norm row, issue 10's three goals.
func WriteComparison(w io.Writer, rows []ComparedRow) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "model\tmethod\tvariant\tmemfit peak\tx plain\tPyTorch peak\tx plain\tmemfit/PyTorch\tmemfit\tPyTorch\tmemfit/PyTorch\t\n")
	var methods []string
	note := func(line string) {
		for _, m := range methods {
			if m == line {
				return
			}
		}
		methods = append(methods, line)
	}
	for _, r := range rows {
		mp, pp, mt, pt := "-", "-", "-", "-"
		if r.Memfit != nil {
			b, m := r.Memfit.peak()
			mp, mt = memory.FormatPeakCell(b, m, 3), fmt.Sprintf("%.1f %s", r.Memfit.PerSecond, r.Memfit.Unit)
			note("memfit peak: " + m)
		}
		if r.PyTorch != nil {
			pp, pt = memory.FormatBytes(r.PyTorch.PeakBytes), fmt.Sprintf("%.1f %s", r.PyTorch.PerSecond, r.PyTorch.Unit)
			note("PyTorch peak: " + r.PyTorch.PeakMethod)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r.Model, r.Method, r.Variant, mp, fmtRatio(r.MemfitPeakRatio),
			pp, fmtRatio(r.PyTorchPeakRatio), fmtRatio(r.PeakVsPyTorch), mt, pt, fmtRatio(r.ThroughputVsPyTorch))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, m := range methods {
		fmt.Fprintln(w, m)
	}
	for _, r := range rows {
		if r.Variant != "approx-act+ms-norm" || r.Memfit == nil {
			continue
		}
		fmt.Fprintf(w, "%s %s approx-act+ms-norm: peak %s x memfit plain (goal <= 0.72: %s), %s x PyTorch+PEFT (goal <= 1: %s), throughput %s x PyTorch (goal >= 0.9: %s)\n",
			r.Model, r.Method, fmtRatio(r.MemfitPeakRatio), goal(r.MemfitPeakRatio, 0.72, true), fmtRatio(r.PeakVsPyTorch),
			goal(r.PeakVsPyTorch, 1, true), fmtRatio(r.ThroughputVsPyTorch), goal(r.ThroughputVsPyTorch, 0.9, false))
	}
	return nil
}

func fmtRatio(r float64) string {
	if r == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f", r)
}

// goal says whether ratio meets limit (at most when atMost, else at least), or "n/a" without a figure.
func goal(ratio, limit float64, atMost bool) string {
	switch {
	case ratio == 0:
		return "n/a"
	case atMost && ratio <= limit, !atMost && ratio >= limit:
		return "met"
	}
	return "NOT met"
}
