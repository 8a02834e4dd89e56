package models

import (
	"fmt"
	"slices"
	"sort"

	"github.com/gomlx/gomlx/pkg/core/dtypes"
)

// CheckShapes checks that p has exactly the names of want, each float32 with the wanted dimensions. The error
// names the first offending parameter.
func CheckShapes(p Params, want map[string][]int) error {
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		t, ok := p[n]
		if !ok {
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
		if _, ok := want[n]; !ok {
			return fmt.Errorf("checkpoint has an unexpected tensor %q (not part of this model's config)", n)
		}
	}
	return nil
}
