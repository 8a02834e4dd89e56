// Package auto dispatches on a checkpoint's model_type: it creates random-init checkpoints of any supported
// architecture and runs any supported model on JSON inputs.
package auto

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/gomlx/compute"
	"github.com/gomlx/gomlx/core/graph"
	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/engine"
	"github.com/memfit/memfit/internal/readfile"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/hfconfig"
	"github.com/memfit/memfit/models/llama"
	"github.com/memfit/memfit/models/vit"
	"github.com/memfit/memfit/safetensors"
)

// Architectures lists the supported model types.
var Architectures = []string{"vit", "llama"}

// ModelType reads config.json's model_type from dir.
func ModelType(dir string) (string, error) {
	f, file, err := hfconfig.Read(dir)
	if err != nil {
		return "", err
	}
	var mt string
	if raw, ok := f["model_type"]; !ok || json.Unmarshal(raw, &mt) != nil || mt == "" {
		return "", fmt.Errorf("%s: field \"model_type\" is missing", file)
	}
	if !slices.Contains(Architectures, mt) {
		return "", fmt.Errorf("%s: field \"model_type\" is %q: memfit supports %v", file, mt, Architectures)
	}
	return mt, nil
}

// Presets returns the preset names of an architecture.
func Presets(arch string) ([]string, error) {
	var names []string
	switch arch {
	case "vit":
		for n := range vit.Presets {
			names = append(names, n)
		}
	case "llama":
		for n := range llama.Presets {
			names = append(names, n)
		}
	default:
		return nil, fmt.Errorf("unknown architecture %q: use one of %v", arch, Architectures)
	}
	slices.Sort(names)
	return names, nil
}

// Init writes a random-init checkpoint (config.json and model.safetensors, or shards above maxShardBytes) of
// the named architecture and preset to dir. numLabels > 0 makes a classifier (ViTForImageClassification,
// LlamaForSequenceClassification); for ViT it defaults to an unlabelled ViTModel, for LLaMA to a causal LM.
func Init(arch, preset string, numLabels int, seed uint64, dir string, maxShardBytes int64) error {
	return InitAs(arch, preset, numLabels, seed, dir, maxShardBytes, "float32")
}

// InitAs is Init with the stored dtype: "float32", or "bfloat16" (the weights drawn in float32, rounded to
// bfloat16 one tensor at a time; half the file, as most Hugging Face checkpoints are stored).
func InitAs(arch, preset string, numLabels int, seed uint64, dir string, maxShardBytes int64, dtype string) error {
	if dtype != "float32" && dtype != "bfloat16" {
		return fmt.Errorf("dtype must be float32 or bfloat16, got %q", dtype)
	}
	if numLabels < 0 {
		return fmt.Errorf("--num-labels must not be negative, got %d", numLabels)
	}
	var config []byte
	var random func() models.Params
	var shapes map[string][]int
	switch arch {
	case "vit":
		cfg, err := vit.Preset(preset, numLabels)
		if err != nil {
			return err
		}
		if config, err = cfg.JSON(); err != nil {
			return err
		}
		shapes, random = vit.Shapes(cfg), func() models.Params { return vit.RandomParams(cfg, seed) }
	case "llama":
		cfg, err := llama.Preset(preset, numLabels)
		if err != nil {
			return err
		}
		if config, err = cfg.JSON(); err != nil {
			return err
		}
		shapes, random = llama.Shapes(cfg), func() models.Params { return llama.RandomParams(cfg, seed) }
	default:
		return fmt.Errorf("unknown architecture %q: use one of %v", arch, Architectures)
	}
	if err := initFits(arch, preset, dir, shapes, dtype); err != nil {
		return err
	}
	params := random()
	if dtype == "bfloat16" {
		var err error
		if params, err = params.ToBFloat16(); err != nil {
			return err
		}
	}
	return models.SaveCheckpoint(dir, config, params, maxShardBytes)
}

// initFits refuses an init whose weights cannot fit: the random weights are made in float32 in memory (plus a
// bfloat16 copy when asked), then written to dir's disk.
func initFits(arch, preset, dir string, shapes map[string][]int, dtype string) error {
	var n int64
	for _, s := range shapes {
		k := int64(1)
		for _, d := range s {
			k *= int64(d)
		}
		n += k
	}
	need, file := 4*n, 4*n
	if dtype == "bfloat16" {
		need, file = 6*n, 2*n
	}
	if limit, ok, err := memory.MachineBytes(); err != nil {
		return err
	} else if ok && need > limit {
		return fmt.Errorf("%s %s has %.3g parameters: making its random weights takes %s of memory (%s) but this machine has %s: choose a smaller --preset",
			arch, preset, float64(n), memory.FormatBytes(need), dtype, memory.FormatBytes(limit))
	}
	where := dir
	for {
		if _, err := os.Stat(where); err == nil || filepath.Dir(where) == where {
			break
		}
		where = filepath.Dir(where)
	}
	if free, ok := memory.FreeDiskBytes(where); ok && file > free {
		return fmt.Errorf("%s %s takes %s on disk (%s) but %s has %s free: free space or choose another --out",
			arch, preset, memory.FormatBytes(file), dtype, where, memory.FormatBytes(free))
	}
	return nil
}

// Inputs are a model's inputs read from JSON: input_ids (and optionally attention_mask) for LLaMA,
// pixel_values for ViT, as nested lists.
type Inputs struct {
	InputIDs, AttentionMask, PixelValues *tensors.Tensor
}

// maxInputValues bounds one input tensor of ReadInputs (16M values: 64 MiB of float32, e.g. 80 ViT-B images).
const maxInputValues = 1 << 24

// maxInputRows bounds the examples of one ReadInputs call (their logits are computed in one batch and printed).
const maxInputRows = 4096

// ReadInputs reads an inputs JSON file: an object with input_ids / attention_mask / pixel_values, or an object
// whose "inputs" field is one (as the golden files are).
func ReadInputs(path string) (Inputs, error) {
	data, err := readfile.Read(path, readfile.Data)
	if err != nil {
		return Inputs{}, err
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil {
		return Inputs{}, fmt.Errorf("%s: not a JSON object (%v)", path, err)
	}
	if inner, ok := obj["inputs"]; ok {
		obj = nil
		if err := json.Unmarshal(inner, &obj); err != nil {
			return Inputs{}, fmt.Errorf("%s: \"inputs\" is not an object (%v)", path, err)
		}
	}
	var in Inputs
	for key, raw := range obj {
		dims, values, err := parseNested(raw)
		if err != nil {
			return Inputs{}, fmt.Errorf("%s: %q: %v", path, key, err)
		}
		if slices.Contains(dims, 0) {
			return Inputs{}, fmt.Errorf("%s: %q has an empty axis (shape %v): give at least one example of at least one value", path, key, dims)
		}
		if len(dims) > 0 && dims[0] > maxInputRows {
			return Inputs{}, fmt.Errorf("%s: %q holds %d examples, more than the %d one call takes: split the inputs into several files", path, key, dims[0], maxInputRows)
		}
		if len(values) > maxInputValues {
			return Inputs{}, fmt.Errorf("%s: %q holds %d values, more than the %d one call takes: split the inputs into several files", path, key, len(values), maxInputValues)
		}
		switch key {
		case "input_ids", "attention_mask":
			ints := make([]int32, len(values))
			for i, v := range values {
				if v != float64(int32(v)) {
					return Inputs{}, fmt.Errorf("%s: %q holds %v, not an integer", path, key, v)
				}
				ints[i] = int32(v)
			}
			if len(dims) != 2 {
				return Inputs{}, fmt.Errorf("%s: %q must be [batch, tokens], got %v", path, key, dims)
			}
			t := tensors.FromFlatDataAndDimensions(ints, dims...)
			if key == "input_ids" {
				in.InputIDs = t
			} else {
				in.AttentionMask = t
			}
		case "pixel_values":
			fs := make([]float32, len(values))
			for i, v := range values {
				fs[i] = float32(v)
			}
			if len(dims) != 4 {
				return Inputs{}, fmt.Errorf("%s: \"pixel_values\" must be [batch, channels, height, width], got %v", path, dims)
			}
			in.PixelValues = tensors.FromFlatDataAndDimensions(fs, dims...)
		default:
			return Inputs{}, fmt.Errorf("%s: unknown input %q (expected input_ids, attention_mask or pixel_values)", path, key)
		}
	}
	if in.AttentionMask != nil && (in.InputIDs == nil || !slices.Equal(in.AttentionMask.Shape().Dimensions, in.InputIDs.Shape().Dimensions)) {
		return Inputs{}, fmt.Errorf("%s: attention_mask must have the shape of input_ids", path)
	}
	return in, nil
}

// parseNested flattens a nested JSON list of numbers.
func parseNested(raw json.RawMessage) ([]int, []float64, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, nil, err
	}
	var dims []int
	var values []float64
	var walk func(v any, depth int) error
	walk = func(v any, depth int) error {
		switch x := v.(type) {
		case json.Number:
			if depth != len(dims) {
				return fmt.Errorf("ragged nested list")
			}
			f, err := strconv.ParseFloat(x.String(), 64)
			if err != nil {
				return err
			}
			values = append(values, f)
			return nil
		case []any:
			if depth == len(dims) && len(values) == 0 {
				dims = append(dims, len(x))
			} else if depth >= len(dims) || dims[depth] != len(x) {
				return fmt.Errorf("ragged nested list")
			}
			for _, e := range x {
				if err := walk(e, depth+1); err != nil {
					return err
				}
			}
			return nil
		}
		return fmt.Errorf("expected numbers in nested lists, found %T", v)
	}
	if err := walk(v, 0); err != nil {
		return nil, nil, err
	}
	if len(dims) == 0 {
		return nil, nil, fmt.Errorf("expected a nested list, got a number")
	}
	return dims, values, nil
}

// Logits loads the model at dir and returns its logits for in, computed on backend (for a ViTModel without a
// classifier, its last hidden state).
func Logits(backend compute.Backend, dir string, in Inputs) (*tensors.Tensor, error) {
	mt, err := ModelType(dir)
	if err != nil {
		return nil, err
	}
	var build func(g *graph.Graph) (*graph.Node, []*tensors.Tensor)
	switch mt {
	case "vit":
		if in.PixelValues == nil {
			return nil, fmt.Errorf("a ViT model needs \"pixel_values\" in the inputs file")
		}
		m, err := vit.Load(dir, vit.Options{})
		if err != nil {
			return nil, err
		}
		build = func(g *graph.Graph) (*graph.Node, []*tensors.Tensor) {
			px := graph.Parameter(g, "pixel_values", in.PixelValues.Shape())
			b := models.Bind(g, m.Params)
			o := m.Forward(b, px)
			out := o.Logits
			if out == nil {
				out = o.LastHidden
			}
			return out, append([]*tensors.Tensor{in.PixelValues}, b.Inputs(m.Params)...)
		}
	case "llama":
		if in.InputIDs == nil {
			return nil, fmt.Errorf("a LLaMA model needs \"input_ids\" in the inputs file")
		}
		m, err := llama.Load(dir, llama.Options{})
		if err != nil {
			return nil, err
		}
		if max := in.InputIDs.Shape().Dim(1); max > m.Config.MaxPositionEmbeddings {
			return nil, fmt.Errorf("%d tokens exceed the model's max_position_embeddings (%d)", max, m.Config.MaxPositionEmbeddings)
		}
		if err := models.CheckRange(in.InputIDs, "input_ids", 0, m.Config.VocabSize,
			fmt.Sprintf("the model's vocabulary has %d tokens (vocab_size)", m.Config.VocabSize)); err != nil {
			return nil, err
		}
		build = func(g *graph.Graph) (*graph.Node, []*tensors.Tensor) {
			ids := graph.Parameter(g, "input_ids", in.InputIDs.Shape())
			inputs := []*tensors.Tensor{in.InputIDs}
			var mask *graph.Node
			if in.AttentionMask != nil {
				mask = graph.Parameter(g, "attention_mask", in.AttentionMask.Shape())
				inputs = append(inputs, in.AttentionMask)
			}
			b := models.Bind(g, m.Params)
			return m.Forward(b, ids, mask).Logits, append(inputs, b.Inputs(m.Params)...)
		}
	}
	var logits *tensors.Tensor
	err = engine.Try(func() {
		g := graph.NewGraph(backend, "logits")
		out, inputs := build(g)
		if err := g.Compile(out); err != nil {
			panic(err) // engine.Try returns it: the backend's cause
		}
		args := make([]any, len(inputs))
		for i, t := range inputs {
			args[i] = t
		}
		logits = g.Run(args...)[0]
	})
	return logits, err
}

// NestedJSON writes a float tensor as nested JSON lists.
func NestedJSON(t *tensors.Tensor) ([]byte, error) {
	var flat []float32
	if err := tensors.ConstFlatData[float32](t, func(f []float32) { flat = append([]float32(nil), f...) }); err != nil {
		return nil, err
	}
	dims := t.Shape().Dimensions
	var buf bytes.Buffer
	var write func(depth, offset int) int
	write = func(depth, offset int) int {
		if depth == len(dims) {
			buf.WriteString(strconv.FormatFloat(float64(flat[offset]), 'g', -1, 32))
			return offset + 1
		}
		buf.WriteByte('[')
		for i := 0; i < dims[depth]; i++ {
			if i > 0 {
				buf.WriteByte(',')
			}
			offset = write(depth+1, offset)
		}
		buf.WriteByte(']')
		return offset
	}
	write(0, 0)
	return buf.Bytes(), nil
}

// NewHead writes to dir a copy of the model in from with a freshly initialised classification head of numLabels
// classes (as transformers does when a checkpoint is loaded into ...ForSequenceClassification /
// ...ForImageClassification with a new num_labels): LLaMA gets score.weight [labels, hidden] drawn from
// normal(0, 0.02) and loses lm_head; ViT gets classifier.weight (normal(0, 0.02)) and classifier.bias (zero).
// Tokenizer and preprocessor files are copied along. numLabels 1 makes a LLaMA regression head (STS-B).
func NewHead(from string, numLabels int, seed uint64, dir string) error {
	if numLabels <= 0 {
		return fmt.Errorf("--num-labels must be positive to make a classifier, got %d", numLabels)
	}
	mt, err := ModelType(from)
	if err != nil {
		return err
	}
	labels := make([]string, numLabels)
	for i := range labels {
		labels[i] = fmt.Sprintf("LABEL_%d", i)
	}
	r := rand.New(rand.NewPCG(seed, 0x4ead))
	normal := func(n int) []float32 {
		out := make([]float32, n)
		for i := range out {
			out[i] = float32(0.02 * r.NormFloat64())
		}
		return out
	}
	var config []byte
	var params models.Params
	switch mt {
	case "llama":
		m, err := llama.Load(from, llama.Options{})
		if err != nil {
			return err
		}
		c := m.Config
		params = m.Params
		delete(params, llama.LMHead)
		delete(params, llama.Score)
		if c.PadTokenID < 0 {
			return fmt.Errorf("%s has no pad_token_id: a sequence classifier needs one to find each row's last token", from)
		}
		c.Architecture, c.Labels = llama.ArchClassification, labels
		if c.TieWordEmbeddings {
			c.TieWordEmbeddings = false
		}
		params[llama.Score] = tensors.FromFlatDataAndDimensions(normal(numLabels*c.HiddenSize), numLabels, c.HiddenSize)
		if config, err = c.JSON(); err != nil {
			return err
		}
	case "vit":
		m, err := vit.Load(from, vit.Options{})
		if err != nil {
			return err
		}
		c := m.Config
		params = m.Params
		c.Architecture, c.Labels = vit.ArchClassification, labels
		params[vit.ClassifierWeight] = tensors.FromFlatDataAndDimensions(normal(numLabels*c.HiddenSize), numLabels, c.HiddenSize)
		params[vit.ClassifierBias] = tensors.FromFlatDataAndDimensions(make([]float32, numLabels), numLabels)
		if config, err = c.JSON(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("model type %q has no classification head", mt)
	}
	if err := models.SaveCheckpoint(dir, config, params, 0); err != nil {
		return err
	}
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json", "tokenizer.model", "preprocessor_config.json"} {
		b, err := readfile.Read(filepath.Join(from, name), readfile.Tokenizer)
		if err != nil {
			continue
		}
		if err := safetensors.WriteAtomic(filepath.Join(dir, name), func(w *bufio.Writer) error {
			_, err := w.Write(b)
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}
