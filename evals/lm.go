package evals

import (
	"fmt"
	"math"

	"github.com/gomlx/compute"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/runner"
)

// ModelLM scores next tokens with a memfit causal LM of any family (optionally with adapters). Contexts are padded on
// the right to a multiple of PadTo tokens (so a few graph shapes serve a whole evaluation) and the log-softmax is
// taken at each context's last token.
type ModelLM struct {
	Runner *runner.LogitsRunner
	// Generator decodes with the same model and adapters (MMLU scored by generation).
	Generator *runner.Generator
	Pad       int
	PadTo     int
	// MaxLen is the model's positions (max_position_embeddings): padding stops there.
	MaxLen int
}

// NewModelLM wraps a loaded causal-LM model (models.TextModel with a causal-LM task: a decoder family's model,
// say; adapters from finetune.ImportAdapter when set is not nil).
func NewModelLM(backend compute.Backend, model runner.Model, set *adapter.Set) (*ModelLM, error) {
	m, ok := model.(models.TextModel)
	if !ok || !m.TextSpec().CausalLM() {
		return nil, fmt.Errorf("MMLU needs a causal LM (a ...ForCausalLM model)")
	}
	spec := m.TextSpec()
	var params = model.Params()
	lm := &ModelLM{Runner: runner.NewLogitsRunner(backend, model, params, set), Pad: max(spec.PadID, 0), PadTo: 64,
		MaxLen: spec.MaxPositions}
	if d, ok := model.(runner.Decoder); ok {
		lm.Generator = runner.NewGenerator(backend, d, params, set)
	}
	return lm, nil
}

// Greedy implements Generator: each context continued by up to maxNew tokens, greedily, with the key/value
// cache (runner.Generator).
func (m *ModelLM) Greedy(contexts [][]int, maxNew int) ([][]int, error) {
	if m.Generator == nil {
		return nil, fmt.Errorf("the model cannot decode incrementally")
	}
	out, _, err := m.Generator.Generate(contexts, runner.GenerateOptions{MaxNewTokens: maxNew, Pad: m.Pad, MaxPositions: m.MaxLen})
	if err != nil {
		return nil, err
	}
	ids := make([][]int, len(out))
	for i, g := range out {
		ids[i] = g.Tokens
	}
	return ids, nil
}

// NextLogProbs implements LM.
func (m *ModelLM) NextLogProbs(contexts [][]int, candidates [][]int) ([][]float64, error) {
	longest := 0
	for _, c := range contexts {
		if len(c) == 0 {
			return nil, fmt.Errorf("empty context")
		}
		longest = max(longest, len(c))
	}
	if m.PadTo > 1 {
		padded := (longest + m.PadTo - 1) / m.PadTo * m.PadTo
		if m.MaxLen > 0 && longest <= m.MaxLen {
			padded = min(padded, m.MaxLen)
		}
		longest = padded
	}
	b := len(contexts)
	ids := make([]int32, b*longest)
	mask := make([]int32, b*longest)
	for i, c := range contexts {
		for j := 0; j < longest; j++ {
			if j < len(c) {
				ids[i*longest+j], mask[i*longest+j] = int32(c[j]), 1
			} else {
				ids[i*longest+j] = int32(m.Pad)
			}
		}
	}
	batch := runner.Batch{"input_ids": tensors.FromFlatDataAndDimensions(ids, b, longest),
		"attention_mask": tensors.FromFlatDataAndDimensions(mask, b, longest)}
	logits, err := m.Runner.Logits(batch)
	if err != nil {
		return nil, err
	}
	defer logits.MustFinalizeAll()
	dims := logits.Shape().Dimensions
	if len(dims) != 3 {
		return nil, fmt.Errorf("logits have shape %v, want [B, T, vocab]", dims)
	}
	vocab := dims[2]
	out := make([][]float64, b)
	err = tensors.ConstFlatData[float32](logits, func(f []float32) {
		for i, c := range contexts {
			row := f[(i*longest+len(c)-1)*vocab : (i*longest+len(c))*vocab]
			maxV := math.Inf(-1)
			for _, v := range row {
				maxV = math.Max(maxV, float64(v))
			}
			var sum float64
			for _, v := range row {
				sum += math.Exp(float64(v) - maxV)
			}
			lse := maxV + math.Log(sum)
			out[i] = make([]float64, len(candidates[i]))
			for k, id := range candidates[i] {
				out[i][k] = float64(row[id]) - lse
			}
		}
	})
	return out, err
}
