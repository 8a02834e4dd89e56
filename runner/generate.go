package runner

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/models"
)

// Decoder is a causal language model that decodes incrementally with a key/value cache (every decoder family:
// the models/decoder methods, promoted through family/lm's Model).
type Decoder interface {
	Model
	// CacheShapes returns the shapes of the cache tensors for batch rows and length positions.
	CacheShapes(batch, length int) []shapes.Shape
	// Decode writes the tokens ids [B, T] at cache positions start..start+T-1 with rotary positions [B, T] and
	// the key mask [B, S], and returns the logits of the last token [B, vocab] and the updated cache (nil cache:
	// zeros).
	Decode(b models.Bound, ids, positions, start, keyMask *graph.Node, cache []*graph.Node) (*graph.Node, []*graph.Node)
}

// GenerateOptions configure Generator.Generate.
type GenerateOptions struct {
	// MaxNewTokens is the most tokens generated per prompt (EOS and stop strings end a row sooner).
	MaxNewTokens int
	// Temperature divides the logits before sampling; 0 decodes greedily (the highest logit, the lowest id on
	// a tie), deterministic without a seed.
	Temperature float64
	// TopK keeps only the K most likely tokens before sampling (0: all).
	TopK int
	// TopP keeps the smallest set of most likely tokens whose probabilities sum to at least P (nucleus
	// sampling; 0 or 1: all).
	TopP float64
	// Seed makes sampling deterministic: each prompt draws from its own generator seeded by (Seed, its index:
	// Indices[r], or r without Indices), so a prompt's output does not depend on the prompts batched with it
	// beyond the numerics.
	Seed uint64
	// Indices, when set, hold each prompt's index in the caller's whole input (one per prompt, distinct and not
	// negative): they key the prompts' random streams, so a prompt file decoded in batches of any size samples
	// the same completions, and errors name them. Without them prompt r of the call has index r.
	Indices []int
	// EOS are the token ids that end a row (not included in its output).
	EOS []int
	// StopStrings end a row as soon as its decoded output contains one of them (the output is cut before it);
	// they need Detokenize.
	StopStrings []string
	// Detokenize turns ids into text (the tokenizer's Decode); when set, Generation.Text is filled.
	Detokenize func(ids []int) string
	// Pad is the token id written at the left-padding positions (hidden by the mask; any valid id).
	Pad int
	// PadTo rounds the padded prompt length up to a multiple of it, so prompts of nearby lengths share a
	// compiled prefill (16 when 0).
	PadTo int
	// MaxPositions, when positive, is the model's number of positions: a prompt whose tokens plus MaxNewTokens
	// exceed it is refused.
	MaxPositions int
	// OnToken, when set, is called with each new token of each row as it is produced (streaming), before the
	// row's stop checks; row indexes the prompts.
	OnToken func(row, token int)
}

// checkSampling refuses sampling settings that would not sample what they say: a temperature that is negative,
// NaN or infinite (NaN gave empty completions), a negative top-k, a top-p outside [0, 1] or NaN (NaN acted as
// 1), an empty stop string (it was ignored).
func (o GenerateOptions) checkSampling() error {
	switch {
	case math.IsNaN(o.Temperature) || math.IsInf(o.Temperature, 0) || o.Temperature < 0:
		return fmt.Errorf("temperature %g: give 0 (greedy) or a finite positive number", o.Temperature)
	case o.TopK < 0:
		return fmt.Errorf("top-k %d: give 0 (no limit) or more", o.TopK)
	case math.IsNaN(o.TopP) || o.TopP < 0 || o.TopP > 1:
		return fmt.Errorf("top-p %g: give a probability in (0, 1] (0: no limit)", o.TopP)
	}
	for i, s := range o.StopStrings {
		if s == "" {
			return fmt.Errorf("stop string %d is empty: a stop string needs at least one character", i)
		}
	}
	return nil
}

// Stop reasons of a Generation.
const (
	StopEOS    = "eos"    // an EOS token
	StopString = "stop"   // a stop string
	StopLength = "length" // MaxNewTokens reached
)

// Generation is one prompt's output.
type Generation struct {
	// Tokens are the generated ids (without the EOS that ended the row; with the tokens of a stop string).
	Tokens []int
	// Text is Detokenize(Tokens), cut before the stop string that ended the row.
	Text string
	// Stop says why the row ended: StopEOS, StopString or StopLength.
	Stop string
}

// GenerateStats times one Generate call.
type GenerateStats struct {
	// Prompts and PromptTokens count the prompts and their tokens (without padding).
	Prompts, PromptTokens int
	// NewTokens counts the tokens generated over all rows (what the outputs hold, EOS included).
	NewTokens int
	// CompileSeconds is the time spent compiling programs this call (0 when they were compiled before).
	CompileSeconds float64
	// PrefillSeconds is the time of the prefill programs (prompts in, first tokens out).
	PrefillSeconds float64
	// DecodeSteps and DecodeSeconds count and time the decode programs (one token per row each); DecodeTokens
	// counts the tokens they produced for rows still running.
	DecodeSteps   int
	DecodeSeconds float64
	DecodeTokens  int
}

// DecodeTokensPerSecond is the decode phase's throughput: tokens produced for running rows per second.
func (s GenerateStats) DecodeTokensPerSecond() float64 {
	if s.DecodeSeconds == 0 {
		return 0
	}
	return float64(s.DecodeTokens) / s.DecodeSeconds
}

// Generator decodes with a causal LM, its parameters and adapters fixed: one compiled prefill program per
// (batch, padded prompt length, cache length) and one decode program per (batch, cache length), reused across
// calls; the key/value cache stays on the backend between steps (each step's cache is donated to the next), only
// the last token's logits come back to the host, where the next tokens are chosen.
type Generator struct {
	Backend compute.Backend
	Model   Decoder
	Params  models.Params
	Set     *adapter.Set
	graphs  map[string]*graph.Graph
	// held are Params with every float linear-layer weight transposed to [in, out] on the backend (names kept),
	// transposed the names so held; made on the first Generate (see engine.TransposedWeight).
	held       models.Params
	transposed map[string]bool
}

// NewGenerator returns a generator over model with params (model.Params() when nil) and adapters (none when
// set is nil).
func NewGenerator(backend compute.Backend, model Decoder, params models.Params, set *adapter.Set) *Generator {
	if params == nil {
		params = model.Params()
	}
	return &Generator{Backend: backend, Model: model, Params: params, Set: set, graphs: map[string]*graph.Graph{}}
}

// holdTransposed makes gen.held: the linear layers' float weights transposed to [in, out] by one program on the
// backend (they stay there), the other parameters as they are. Decoding multiplies one row per sequence by each
// weight; held as [in, out], that is the pure-Go backend's fast non-transposed product with no copy, where the
// Hugging Face [out, in] layout costs a copy of the whole weight, or its slow small transposed kernel, on every
// step (engine.Linear, engine.TransposedWeight).
func (gen *Generator) holdTransposed() error {
	var names []string
	for _, l := range gen.Model.LinearLayers() {
		name := l.Path + ".weight"
		if t, ok := gen.Params[name]; ok && t.Rank() == 2 && t.DType().IsFloat() {
			names = append(names, name)
		}
	}
	held := models.Params{}
	for n, t := range gen.Params {
		held[n] = t
	}
	transposed := map[string]bool{}
	if len(names) > 0 {
		err := engine.Try(func() {
			g := graph.NewGraph(gen.Backend, "hold_transposed")
			defer g.Finalize()
			var outs []*graph.Node
			args := make([]any, len(names))
			for i, n := range names {
				outs = append(outs, graph.Transpose(graph.Parameter(g, n, gen.Params[n].Shape()), 0, 1))
				args[i] = gen.Params[n]
			}
			if err := g.Compile(outs...); err != nil {
				panic(err)
			}
			for i, t := range g.Run(args...) {
				held[names[i]], transposed[names[i]] = t, true
			}
		})
		if err != nil {
			return err
		}
	}
	gen.held, gen.transposed = held, transposed
	return nil
}

// program returns the compiled prefill (prefill true: no cache input, start 0) or decode program for ids of
// [batch, seq] and a cache of length positions; compiled reports the seconds spent compiling it now.
func (gen *Generator) program(prefill bool, batch, seq, length int) (g *graph.Graph, compiled float64, err error) {
	key := fmt.Sprintf("decode b%d t%d s%d", batch, seq, length)
	if prefill {
		key = "pre" + key
	}
	if g, ok := gen.graphs[key]; ok {
		return g, 0, nil
	}
	t0 := time.Now()
	err = engine.Try(func() {
		g = graph.NewGraph(gen.Backend, strings.ReplaceAll(key, " ", "_"))
		ids := graph.Parameter(g, "input_ids", shapes.Make(dtypes.Int32, batch, seq))
		pos := graph.Parameter(g, "positions", shapes.Make(dtypes.Int32, batch, seq))
		keyMask := graph.Parameter(g, "key_mask", shapes.Make(dtypes.Int32, batch, length))
		var start *graph.Node
		var cache []*graph.Node
		if prefill {
			start = graph.ScalarZero(g, dtypes.Int32)
		} else {
			start = graph.Parameter(g, "start", shapes.Make(dtypes.Int32))
			for i, s := range gen.Model.CacheShapes(batch, length) {
				cache = append(cache, graph.Parameter(g, fmt.Sprintf("cache.%d", i), s))
			}
		}
		b := bind(g, gen.Model, gen.held, gen.Set)
		for name := range gen.transposed {
			b.Nodes[name] = engine.TransposedWeight(b.Nodes[name])
		}
		logits, next := gen.Model.Decode(b, ids, pos, start, keyMask, cache)
		if logits.DType() != dtypes.Float32 {
			logits = graph.ConvertDType(logits, dtypes.Float32)
		}
		if cerr := g.Compile(append([]*graph.Node{logits}, next...)...); cerr != nil {
			panic(cerr)
		}
	})
	if err != nil {
		return nil, 0, err
	}
	gen.graphs[key] = g
	return g, time.Since(t0).Seconds(), nil
}

// Generate continues each prompt (token ids, BOS included when the model wants one) with up to MaxNewTokens
// tokens, all prompts in one batch, left-padded to a common length.
func (gen *Generator) Generate(prompts [][]int, o GenerateOptions) ([]Generation, GenerateStats, error) {
	st := GenerateStats{Prompts: len(prompts)}
	if len(prompts) == 0 {
		return nil, st, nil
	}
	if o.MaxNewTokens < 1 {
		return nil, st, fmt.Errorf("max new tokens must be at least 1, got %d", o.MaxNewTokens)
	}
	if len(o.StopStrings) > 0 && o.Detokenize == nil {
		return nil, st, errors.New("stop strings need a detokenizer")
	}
	if err := o.checkSampling(); err != nil {
		return nil, st, err
	}
	index := func(r int) int { return r }
	if o.Indices != nil {
		if len(o.Indices) != len(prompts) {
			return nil, st, fmt.Errorf("%d prompt indices for %d prompts", len(o.Indices), len(prompts))
		}
		seen := map[int]bool{}
		for _, i := range o.Indices {
			if i < 0 || seen[i] {
				return nil, st, fmt.Errorf("prompt indices %v: give distinct indices of 0 or more", o.Indices)
			}
			seen[i] = true
		}
		index = func(r int) int { return o.Indices[r] }
	}
	padTo := o.PadTo
	if padTo <= 0 {
		padTo = 16
	}
	longest := 0
	for i, p := range prompts {
		if len(p) == 0 {
			return nil, st, fmt.Errorf("prompt %d is empty (give at least one token, e.g. BOS)", index(i))
		}
		if o.MaxPositions > 0 && len(p)+o.MaxNewTokens > o.MaxPositions {
			return nil, st, fmt.Errorf("prompt %d has %d tokens; with %d new tokens that is more than the model's %d positions: shorten the prompt or lower the new tokens",
				index(i), len(p), o.MaxNewTokens, o.MaxPositions)
		}
		longest = max(longest, len(p))
		st.PromptTokens += len(p)
	}
	batch := len(prompts)
	plen := (longest + padTo - 1) / padTo * padTo
	// The cache holds the prompt and every generated token but the last (which is never fed back).
	length := plen + o.MaxNewTokens - 1
	if length < plen+1 {
		length = plen + 1 // one spare position keeps the decode program's shapes valid when nothing is decoded
	}
	ids := make([]int32, batch*plen)
	pos := make([]int32, batch*plen)
	keyMask := make([]int32, batch*length)
	pads := make([]int, batch)
	for r, p := range prompts {
		pads[r] = plen - len(p)
		for j := 0; j < plen; j++ {
			if j < pads[r] {
				ids[r*plen+j] = int32(o.Pad)
				continue
			}
			ids[r*plen+j] = int32(p[j-pads[r]])
			pos[r*plen+j] = int32(j - pads[r])
			keyMask[r*length+j] = 1
		}
	}
	rows := make([]rowState, batch)
	for r := range rows {
		rows[r] = rowState{index: index(r), rng: rand.New(rand.NewPCG(o.Seed, uint64(index(r))))}
	}
	eos := map[int]bool{}
	for _, e := range o.EOS {
		eos[e] = true
	}

	if gen.held == nil {
		if err := gen.holdTransposed(); err != nil {
			return nil, st, err
		}
	}
	prefill, sec, err := gen.program(true, batch, plen, length)
	if err != nil {
		return nil, st, err
	}
	st.CompileSeconds += sec
	params := paramArgs(gen.held, gen.Set)
	var outs []*tensors.Tensor
	t0 := time.Now()
	err = engine.Try(func() {
		// In the order the program's parameters were made: ids, positions, key mask, then the weights.
		args := []any{tensors.FromFlatDataAndDimensions(ids, batch, plen), tensors.FromFlatDataAndDimensions(pos, batch, plen),
			tensors.FromFlatDataAndDimensions(keyMask, batch, length)}
		outs = prefill.Run(append(args, params...)...)
	})
	if err != nil {
		return nil, st, err
	}
	next, err := gen.choose(outs[0], rows, o, 1)
	st.PrefillSeconds = time.Since(t0).Seconds()
	if err != nil {
		return nil, st, err
	}
	cache := outs[1:]
	defer func() {
		for _, c := range cache {
			c.FinalizeAll()
		}
	}()
	running := gen.accept(next, rows, o, eos)
	var decode *graph.Graph
	stepIDs := make([]int32, batch)
	stepPos := make([]int32, batch)
	for step := 1; step < o.MaxNewTokens && running > 0; step++ {
		if decode == nil {
			if decode, sec, err = gen.program(false, batch, 1, length); err != nil {
				return nil, st, err
			}
			st.CompileSeconds += sec
		}
		at := plen + step - 1 // cache position of the token fed in
		for r := range rows {
			stepIDs[r] = int32(next[r])
			stepPos[r] = int32(at - pads[r])
			keyMask[r*length+at] = 1
		}
		t1 := time.Now()
		err = engine.Try(func() {
			// ids, positions, key mask, start, the cache (donated: the program may write the new cache into its
			// buffers), then the weights.
			args := []any{tensors.FromFlatDataAndDimensions(stepIDs, batch, 1), tensors.FromFlatDataAndDimensions(stepPos, batch, 1),
				tensors.FromFlatDataAndDimensions(keyMask, batch, length), tensors.FromScalar(int32(at))}
			for _, c := range cache {
				d, derr := graph.DonateTensorBuffer(c, gen.Backend, 0)
				if derr != nil {
					panic(derr)
				}
				args = append(args, d)
			}
			outs = decode.Run(append(args, params...)...)
		})
		if err != nil {
			return nil, st, err
		}
		cache = outs[1:]
		next, err = gen.choose(outs[0], rows, o, step+1)
		st.DecodeSeconds += time.Since(t1).Seconds()
		if err != nil {
			return nil, st, err
		}
		st.DecodeSteps++
		st.DecodeTokens += running
		running = gen.accept(next, rows, o, eos)
	}
	res := make([]Generation, batch)
	for r, row := range rows {
		if row.stop == "" {
			row.stop = StopLength
		}
		res[r] = Generation{Tokens: row.tokens, Stop: row.stop, Text: row.text}
		if o.Detokenize != nil && row.stop != StopString {
			res[r].Text = o.Detokenize(row.tokens)
		}
		st.NewTokens += row.produced
	}
	return res, st, nil
}

// rowState is one prompt's decoding state.
type rowState struct {
	tokens   []int
	text     string // set when a stop string ended the row
	stop     string
	produced int
	index    int // the prompt's index in the caller's input (GenerateOptions.Indices)
	rng      *rand.Rand
}

// NonFiniteError is Generate's error when a running row's logits hold NaN or an infinity: a model or adapter
// with NaN or infinite weights, or one whose activations overflow. Nothing is chosen from such a row (greedy
// decoding picked token 0 every step, sampling an arbitrary one); the call stops.
type NonFiniteError struct {
	// Prompt is the prompt's index (GenerateOptions.Indices), Step the new token being chosen (1: the one after
	// the prompt), Value the first non-finite logit and Token its id.
	Prompt, Step, Token int
	Value               float32
}

func (e *NonFiniteError) Error() string {
	return fmt.Sprintf("prompt index %d, step %d: the logits of new token %d are not finite (%v at token id %d): the model's or adapter's weights hold NaN or infinite values, or its activations overflow; generation stopped",
		e.Prompt, e.Step, e.Step, e.Value, e.Token)
}

// choose reads the last tokens' logits [B, vocab] and picks each running row's next token (finished rows get
// token 0, fed back but never read); step numbers the new token (1: the first). A running row with a
// non-finite logit is a *NonFiniteError.
func (gen *Generator) choose(logits *tensors.Tensor, rows []rowState, o GenerateOptions, step int) ([]int, error) {
	defer logits.FinalizeAll()
	next := make([]int, len(rows))
	dims := logits.Shape().Dimensions
	if len(dims) != 2 || dims[0] != len(rows) {
		return nil, fmt.Errorf("decode logits have shape %v, want [%d, vocab]", dims, len(rows))
	}
	vocab := dims[1]
	var bad error
	err := engine.Try(func() {
		tensors.ConstFlatData[float32](logits, func(f []float32) {
			for r := range rows {
				if rows[r].stop != "" {
					continue
				}
				row := f[r*vocab : (r+1)*vocab]
				for id, v := range row {
					if v-v != 0 { // NaN or an infinity
						bad = &NonFiniteError{Prompt: rows[r].index, Step: step, Token: id, Value: v}
						return
					}
				}
				next[r] = Sample(row, o.Temperature, o.TopK, o.TopP, rows[r].rng)
			}
		})
	})
	if err == nil {
		err = bad
	}
	return next, err
}

// accept appends each running row's next token, streams it, applies the stop rules and returns how many rows
// are still running.
func (gen *Generator) accept(next []int, rows []rowState, o GenerateOptions, eos map[int]bool) int {
	running := 0
	for r := range rows {
		row := &rows[r]
		if row.stop != "" {
			continue
		}
		tok := next[r]
		row.produced++
		if o.OnToken != nil {
			o.OnToken(r, tok)
		}
		if eos[tok] {
			row.stop = StopEOS
			continue
		}
		row.tokens = append(row.tokens, tok)
		if len(o.StopStrings) > 0 {
			text := o.Detokenize(row.tokens)
			if i := firstStop(text, o.StopStrings); i >= 0 {
				row.stop, row.text = StopString, text[:i]
				continue
			}
		}
		running++
	}
	return running
}

// firstStop returns the index in text of the earliest stop string, or -1.
func firstStop(text string, stops []string) int {
	best := -1
	for _, s := range stops {
		if s == "" {
			continue
		}
		if i := strings.Index(text, s); i >= 0 && (best < 0 || i < best) {
			best = i
		}
	}
	return best
}
