package decoder

import (
	"fmt"
	"slices"

	"github.com/gomlx/compute"
	"github.com/gomlx/compute/dtypes"
	"github.com/gomlx/compute/shapes"
	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/attention"
	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/models"
)

// Incremental decoding with a key/value cache.
//
// The cache holds, per decoder layer, the keys (after rotary embeddings) and the values of every token written
// so far: 2L tensors (K0, V0, K1, V1, ...), head-major in the layouts attention.Cached reads without copying:
// keys [B, Hkv, Dh, S] (transposed) and values [B, Hkv, S, Dh], S the cache's length. A call of Decode writes T new
// tokens at cache positions start..start+T-1 and attends from them to every cache position that holds a real
// token up to their own: prefill writes the (left-padded) prompts at start 0, each decode step one token per row.
// Each token's rotary position is given separately from its cache position, so rows of different lengths share
// one cache: a row left-padded by p tokens has its real tokens at cache positions p, p+1, ... and rotary
// positions 0, 1, ..., as if it had been run alone; the pad positions are hidden by the key mask.

// CacheShapes returns the shapes of the 2L cache tensors (keys and values of each layer, in that order) for
// batch rows and length positions, in the dtype of the model's embeddings.
func (m *Model) CacheShapes(batch, length int) []shapes.Shape {
	dtype := dtypes.Float32
	if t, ok := m.Params[EmbedTokens]; ok && t.DType().IsFloat() {
		dtype = t.DType()
	}
	h, dh := m.Config.NumKeyValueHeads, m.Config.HeadDim
	out := make([]shapes.Shape, 2*m.Config.NumHiddenLayers)
	for i := 0; i < len(out); i += 2 {
		out[i] = shapes.Make(dtype, batch, h, dh, length)
		out[i+1] = shapes.Make(dtype, batch, h, length, dh)
	}
	return out
}

// cacheAxis is the position axis of cache tensor i (keys 3, values 2).
func cacheAxis(i int) int { return 3 - i%2 }

// Decode runs the causal LM on the tokens ids [B, T] (integers) written into the cache at positions
// start..start+T-1 (start a scalar integer node), with rotary positions positions [B, T] (integers) and keyMask
// [B, S] (non-zero at the cache positions that hold real tokens, the T new ones included). cache is the 2L
// tensors of CacheShapes(B, S), or nil for a cache of zeros (prefill). It returns the logits of the last of the
// T tokens, [B, vocab], and the updated cache. The model's memory modes do not apply (nothing is kept for a
// backward pass); the attention is attention.Cached over the whole cache, its mask causal from start on.
func (m *Model) Decode(b models.Bound, ids, positions, start, keyMask *graph.Node, cache []*graph.Node) (*graph.Node, []*graph.Node) {
	cfg := m.Config
	if cfg.Task != CausalLM {
		panic("decoder: decoding needs a causal LM, the model is a sequence classifier")
	}
	if ids.Rank() != 2 || !ids.DType().IsInt() {
		panic(fmt.Sprintf("decoder: input_ids must be integer [B, T], got %s", ids.Shape()))
	}
	batch, seq := ids.Shape().Dim(0), ids.Shape().Dim(1)
	if keyMask.Rank() != 2 || keyMask.Shape().Dim(0) != batch {
		panic(fmt.Sprintf("decoder: the key mask must be [%d, S], got %s", batch, keyMask.Shape()))
	}
	length := keyMask.Shape().Dim(1)
	want := m.CacheShapes(batch, length)
	g := ids.Graph()
	if cache == nil && length < seq {
		panic(fmt.Sprintf("decoder: a cache of %d positions cannot hold %d tokens", length, seq))
	}
	if cache != nil && len(cache) != len(want) {
		panic(fmt.Sprintf("decoder: the cache has %d tensors, want %d", len(cache), len(want)))
	}
	for i, c := range cache {
		if !c.Shape().Equal(want[i]) {
			panic(fmt.Sprintf("decoder: cache tensor %d is %s, want %s", i, c.Shape(), want[i]))
		}
	}
	start = graph.ConvertDType(start, dtypes.Int32)
	x := m.embed(b, ids)
	ropes := newRotariesAt(g, cfg, length, x.DType(), positions)
	mask := attention.Mask{Causal: true, Offset: start, KeyPadding: keyMask, SoftCap: cfg.AttnSoftCap}
	out := make([]*graph.Node, len(want))
	write := cacheWriter(g, cache, want, seq, start)
	for i := 0; i < cfg.NumHiddenLayers; i++ {
		rope, mask := ropes.layer(cfg, i), m.layerMask(mask, i)
		attend := func(q, k, v *graph.Node) *graph.Node {
			q, k = rope.apply(q, cfg.NumAttentionHeads), rope.apply(k, cfg.NumKeyValueHeads)
			h, dh := cfg.NumKeyValueHeads, cfg.HeadDim
			k4 := graph.Reshape(k, batch, seq, h, dh)
			v4 := graph.Reshape(v, batch, seq, h, dh)
			keys := write(2*i, graph.TransposeAllDims(k4, 0, 2, 3, 1))     // [B, Hkv, Dh, T]
			values := write(2*i+1, graph.TransposeAllDims(v4, 0, 2, 1, 3)) // [B, Hkv, T, Dh]
			out[2*i], out[2*i+1] = keys, values
			keys, values = graph.ConvertDType(keys, q.DType()), graph.ConvertDType(values, q.DType())
			return attention.Cached(m.scaleQuery(q), keys, values, cfg.NumAttentionHeads, cfg.NumKeyValueHeads, mask)
		}
		x = m.layer(b, LayerPrefix(i), x, attend, false)
	}
	last := graph.Reshape(engine.SliceAxis(x, 1, seq-1, seq), batch, x.Shape().Dim(2))
	normed, _ := m.finalNorm(b, last)
	return m.head(b, normed), out
}

// cacheWriter returns the function that writes the new tokens' part x of cache tensor i (its shape with T
// positions on the cache axis) at positions start..start+T-1 and returns the updated tensor. Prefill (cache nil,
// start 0) pads x with zeros to the cache's length. A decode step (cache given) updates it in place with
// DynamicUpdateSlice where the backend has it (XLA); elsewhere (the pure-Go backend has no dynamic slices) it
// selects x at the position start (Where over the cache's positions; T must be 1), which reads and writes the
// whole cache once per step, as the attention reads it anyway.
func cacheWriter(g *graph.Graph, cache []*graph.Node, want []shapes.Shape, seq int, start *graph.Node) func(i int, x *graph.Node) *graph.Node {
	if cache == nil {
		return func(i int, x *graph.Node) *graph.Node {
			x = graph.ConvertDType(x, want[i].DType)
			axis := cacheAxis(i)
			if length := want[i].Dim(axis); length > seq {
				dims := slices.Clone(want[i].Dimensions)
				dims[axis] = length - seq
				x = graph.Concatenate([]*graph.Node{x, graph.Zeros(g, shapes.Make(want[i].DType, dims...))}, axis)
			}
			return x
		}
	}
	if g.Backend().Capabilities().Operations[compute.OpTypeDynamicUpdateSlice] {
		zero := graph.ScalarZero(g, dtypes.Int32)
		return func(i int, x *graph.Node) *graph.Node {
			at := []*graph.Node{zero, zero, zero, zero}
			at[cacheAxis(i)] = start
			return graph.DynamicUpdateSlice(cache[i], graph.ConvertDType(x, cache[i].DType()), at)
		}
	}
	if seq != 1 {
		panic(fmt.Sprintf("decoder: this backend writes one token per row into the cache per step, got %d", seq))
	}
	return func(i int, x *graph.Node) *graph.Node {
		s, axis := want[i], cacheAxis(i)
		dims := []int{1, 1, 1, 1}
		dims[axis] = s.Dim(axis)
		at := graph.Equal(graph.Iota(g, shapes.Make(dtypes.Int32, dims...), axis), start)
		return graph.Where(graph.BroadcastToShape(at, shapes.Make(dtypes.Bool, s.Dimensions...)),
			graph.BroadcastToShape(graph.ConvertDType(x, s.DType), s), cache[i])
	}
}

// newRotariesAt returns the rotary tables of cfg's layers at the given positions [B, T] (each below length):
// [B, T, 1, Dr], the rows of newRotaries' tables, so a token gets bit for bit the angles Forward gives it. Under
// longrope the tables are the long factors' when the call's largest position reaches past the original context,
// as transformers' dynamic update chooses them per forward call (keys written earlier keep their angles).
func newRotariesAt(g *graph.Graph, cfg Config, length int, dtype dtypes.DType, positions *graph.Node) rotaries {
	pos := graph.ConvertDType(positions, dtypes.Int32)
	short := newRotaries(g, cfg, length, 0, dtype).at(pos)
	s := cfg.RopeScaling
	if s == nil || s.kind() != RopeLongRope || length <= s.OriginalMaxPositionEmbeddings {
		return short
	}
	long := newRotaries(g, cfg, length, length, dtype).at(pos)
	useLong := graph.GreaterOrEqual(graph.ReduceAllMax(pos), graph.Scalar(g, dtypes.Int32, s.OriginalMaxPositionEmbeddings))
	pick := func(a, b *rotary) *rotary {
		if a == nil {
			return nil
		}
		sel := func(x, y *graph.Node) *graph.Node {
			return graph.Where(graph.BroadcastToShape(useLong, shapes.Make(dtypes.Bool, x.Shape().Dimensions...)), y, x)
		}
		return &rotary{cos: sel(a.cos, b.cos), sin: sel(a.sin, b.sin), dr: a.dr, dh: a.dh}
	}
	return rotaries{global: pick(short.global, long.global), local: pick(short.local, long.local)}
}
