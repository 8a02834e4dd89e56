package plan

import (
	"fmt"
	"strings"

	"github.com/gomlx/compute"

	"github.com/memfit/memfit/finetune"
)

// Capacity is, for one variant, the largest batch size or sequence length whose training step fits a memory
// budget (Capacities).
type Capacity struct {
	Variant string `json:"variant"`
	// Max is the largest value that fits (0: not even 1 fits); Bytes is TotalBytes at Max.
	Max   int   `json:"max"`
	Bytes int64 `json:"total_bytes"`
}

// CapacityRequest is what Capacities searches: the model (a folder or a preset name, see ShapeModel, with Labels
// classes for a preset's classifier head) trained with Config, the largest batch size (Axis "batch") or sequence
// length (Axis "seq", LLaMA only) up to Limit whose step's TotalBytes (peak + optimizer state) is at most
// Budget, the other dimension as in Shape, in each of Variants (finetune.Variants when empty).
type CapacityRequest struct {
	Model    string
	Config   finetune.Config
	Labels   int
	Shape    finetune.Shape
	Axis     string
	Budget   int64
	Limit    int
	Variants []finetune.Variant
}

// Capacities finds, for each variant of the request, the largest batch size or sequence length that fits its
// budget: it doubles until the budget is exceeded (or the limit reached), then bisects.
func Capacities(backend compute.Backend, r CapacityRequest) ([]Capacity, error) {
	axis, budget, limit := r.Axis, r.Budget, r.Limit
	if axis != "batch" && axis != "seq" {
		return nil, fmt.Errorf("axis must be batch or seq, got %q", axis)
	}
	if budget <= 0 || limit <= 0 {
		return nil, fmt.Errorf("budget and limit must be positive")
	}
	if axis == "seq" && limit > MaxSeq {
		return nil, fmt.Errorf("--max-seq %d: memfit plans sequences up to %d tokens", limit, MaxSeq)
	}
	variants := r.Variants
	if len(variants) == 0 {
		variants = finetune.Variants
	}
	var out []Capacity
	for _, v := range variants {
		vc := v.Apply(r.Config)
		model, shp, err := ShapeModel(r.Model, vc, r.Labels)
		if err != nil {
			return nil, err
		}
		if fam, _ := finetune.FamilyOf(model); axis == "seq" && !fam.Sequence {
			var titles []string
			for _, f := range finetune.Families() {
				if f.Sequence {
					titles = append(titles, f.Title)
				}
			}
			return nil, fmt.Errorf("--max-seq applies to %s models; %s", strings.Join(titles, " and "), fam.FixedSequence)
		}
		cache := map[int]int64{}
		bytesAt := func(n int) (int64, error) {
			if b, ok := cache[n]; ok {
				return b, nil
			}
			s := r.Shape
			if axis == "batch" {
				s.Batch = n
			} else {
				s.Seq = n
			}
			mv, err := Step(backend, model, shp, vc, s)
			if err != nil {
				return 0, err
			}
			cache[n] = mv.TotalBytes
			return mv.TotalBytes, nil
		}
		fit := Capacity{Variant: v.Name}
		// Double until the budget is exceeded (or the limit reached), then bisect.
		// A causal LM needs two tokens at least (one prediction); batches start at one example.
		start := 1
		if axis == "seq" {
			start = 2
		}
		lo, hi := 0, min(start, limit)
		for {
			b, err := bytesAt(hi)
			if err != nil {
				return nil, err
			}
			if b > budget {
				break
			}
			lo, fit.Bytes = hi, b
			if hi == limit {
				break
			}
			hi = min(2*hi, limit)
		}
		if lo > 0 && lo < hi && lo != limit {
			for hi-lo > 1 {
				mid := (lo + hi) / 2
				b, err := bytesAt(mid)
				if err != nil {
					return nil, err
				}
				if b <= budget {
					lo, fit.Bytes = mid, b
				} else {
					hi = mid
				}
			}
		}
		fit.Max = lo
		out = append(out, fit)
	}
	return out, nil
}
