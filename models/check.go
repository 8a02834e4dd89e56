package models

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/gomlx/compute/dtypes"

	"github.com/memfit/memfit/quant"
)

// CheckShapes checks that p has exactly the names of want, each float32 with the wanted dimensions. The error
// names the first offending parameter. A weight may be stored quantised instead (its NF4 tensors,
// quant.QuantizeWeights), as QLoRA's models are.
func CheckShapes(p Params, want map[string][]int) error {
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t, ok := p[n]
		if !ok {
			if codes, isNF4 := p[n+quant.SuffixCodes]; isNF4 && len(want[n]) == 2 {
				if 2*codes.Shape().Size() < want[n][0]*want[n][1] {
					return fmt.Errorf("NF4 tensor %q holds fewer codes than the config's %v", n+quant.SuffixCodes, want[n])
				}
				continue
			}
			return fmt.Errorf("checkpoint has no tensor %q", n)
		}
		if !slices.Equal(t.Shape().Dimensions, want[n]) {
			return fmt.Errorf("tensor %q has shape %v, the config implies %v", n, t.Shape().Dimensions, want[n])
		}
		if t.DType() != dtypes.Float32 {
			return fmt.Errorf("tensor %q is %s, want float32 (load it converted)", n, t.DType())
		}
	}
	for _, n := range p.Names() {
		if i := strings.Index(n, ".weight.nf4_"); i >= 0 && quant.IsNF4Tensor(n) {
			if _, ok := want[n[:i+len(".weight")]]; ok {
				continue
			}
		}
		if _, ok := want[n]; !ok {
			return fmt.Errorf("checkpoint has an unexpected tensor %q (not part of this model's config)", n)
		}
	}
	return nil
}

// LinearLayer describes one linear layer of a model: its module path (parameters <Path>.weight [Out, In] and,
// when HasBias, <Path>.bias [Out]).
type LinearLayer struct {
	Path    string
	In, Out int
	HasBias bool
	// Head marks the output projection (lm_head, score, classifier), which "all-linear" adapter targets leave
	// out, as PEFT does.
	Head bool
}

// LinearLayers lists the linear layers among shapes (2-D weights named <path>.weight that the model applies
// through Bound.ApplyLinear), sorted by path; heads are the paths in heads, and skip lists 2-D weights that are
// not linear layers (embeddings, convolutions reshaped).
func LinearLayers(shapes map[string][]int, heads []string, skip ...string) []LinearLayer {
	var out []LinearLayer
	for name, dims := range shapes {
		if len(dims) != 2 || !strings.HasSuffix(name, ".weight") || slices.Contains(skip, name) {
			continue
		}
		path := strings.TrimSuffix(name, ".weight")
		_, hasBias := shapes[path+".bias"]
		out = append(out, LinearLayer{Path: path, Out: dims[0], In: dims[1], HasBias: hasBias, Head: slices.Contains(heads, path)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}
