package runner

import (
	"math"
	"math/rand/v2"
	"sort"
)

// Sample picks the next token from one row of logits.
//
// temperature 0 is greedy: the highest logit, the lowest id among equal ones (torch.argmax's choice). Otherwise,
// as transformers' sampling processors do in this order: the logits are divided by the temperature; only the
// topK highest are kept (topK > 0; ties at the K-th value are kept too); only the smallest set of the most likely
// tokens whose probabilities sum to at least topP is kept (0 < topP < 1; the most likely token always is); the
// token is drawn from the softmax of what is kept, with rng.
func Sample(logits []float32, temperature float64, topK int, topP float64, rng *rand.Rand) int {
	if temperature == 0 {
		return argmax32(logits)
	}
	type cand struct {
		id int
		l  float64
	}
	c := make([]cand, 0, len(logits))
	for i, l := range logits {
		if math.IsInf(float64(l), -1) || math.IsNaN(float64(l)) {
			continue
		}
		c = append(c, cand{i, float64(l) / temperature})
	}
	if len(c) == 0 {
		return argmax32(logits)
	}
	sort.SliceStable(c, func(i, j int) bool { return c[i].l > c[j].l })
	if topK > 0 && topK < len(c) {
		k := topK
		for k < len(c) && c[k].l == c[topK-1].l {
			k++
		}
		c = c[:k]
	}
	// Softmax over what is kept, from the largest logit (no overflow).
	p := make([]float64, len(c))
	var sum float64
	for i, x := range c {
		p[i] = math.Exp(x.l - c[0].l)
		sum += p[i]
	}
	for i := range p {
		p[i] /= sum
	}
	if topP > 0 && topP < 1 {
		var cum float64
		n := len(p)
		for i, q := range p {
			cum += q
			if cum >= topP {
				n = i + 1
				break
			}
		}
		p, c = p[:n], c[:n]
		sum = 0
		for _, q := range p {
			sum += q
		}
		for i := range p {
			p[i] /= sum
		}
	}
	u := rng.Float64()
	var cum float64
	for i, q := range p {
		cum += q
		if u < cum {
			return c[i].id
		}
	}
	return c[len(c)-1].id
}

func argmax32(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}
