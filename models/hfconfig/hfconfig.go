// Package hfconfig reads Hugging Face config.json files strictly: every field is either understood, known to be
// irrelevant to memfit, or reported as unknown, and unsupported values are errors that name the field.
package hfconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"

	"github.com/memfit/memfit/internal/readfile"
)

// Fields is a decoded config.json object.
type Fields map[string]json.RawMessage

// Read reads dir/config.json (or the file itself when path is a file).
func Read(path string) (Fields, string, error) {
	file := path
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		file = filepath.Join(path, "config.json")
	}
	data, err := readfile.Read(file, readfile.Config)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, file, fmt.Errorf("%s: no config.json (is this a Hugging Face model folder?)", file)
		}
		return nil, file, err
	}
	f, err := Parse(data)
	if err != nil {
		return nil, file, fmt.Errorf("%s: %w", file, err)
	}
	return f, file, nil
}

// Parse decodes a config.json object.
func Parse(data []byte) (Fields, error) {
	var f Fields
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&f); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, fmt.Errorf("config is a JSON %s, not a JSON object", te.Value)
		}
		var se *json.SyntaxError
		if errors.As(err, &se) {
			at := min(int(se.Offset), len(data))
			return nil, fmt.Errorf("config is not a JSON object: %v (line %d)", err, 1+bytes.Count(data[:at], []byte("\n")))
		}
		return nil, fmt.Errorf("config is not a JSON object: %v", err)
	}
	if f == nil {
		return nil, errors.New("config is null")
	}
	return f, nil
}

// Decoder reads typed fields out of Fields and remembers which it consumed, so that Unknown can list the rest.
type Decoder struct {
	f    Fields
	used map[string]bool
	err  error
}

// NewDecoder returns a Decoder over f.
func NewDecoder(f Fields) *Decoder { return &Decoder{f: f, used: map[string]bool{}} }

// Has reports whether the field is present and not null.
func (d *Decoder) Has(name string) bool {
	raw, ok := d.f[name]
	return ok && string(bytes.TrimSpace(raw)) != "null"
}

// IsNull reports whether the field is present with the value null (transformers' None: often not the same as
// absent, which means the class's default).
func (d *Decoder) IsNull(name string) bool {
	raw, ok := d.f[name]
	return ok && string(bytes.TrimSpace(raw)) == "null"
}

// Get decodes field name into out if present and not null; it reports whether it did. A type mismatch is
// recorded as the Decoder's error, naming the field, its value and the type wanted in words (`field
// "hidden_size" is "big": want a whole number`), never a Go type.
func (d *Decoder) Get(name string, out any) bool {
	d.used[name] = true
	if !d.Has(name) {
		return false
	}
	if err := json.Unmarshal(d.f[name], out); err != nil {
		d.fail(fmt.Errorf("field %q is %s: want %s", name, Excerpt(d.f[name]), Want(out)))
		return false
	}
	return true
}

// Raw returns field name's JSON (nil when absent or null) and marks it used.
func (d *Decoder) Raw(name string) json.RawMessage {
	d.used[name] = true
	if !d.Has(name) {
		return nil
	}
	return d.f[name]
}

// TokenIDs decodes a token-id field that transformers takes as one id or a list of ids (eos_token_id: every
// Llama-3.x Instruct config lists several); absent or null gives nil. Anything else (a string, an empty list, a
// list of non-integers) is the Decoder's error.
func (d *Decoder) TokenIDs(name string) []int {
	raw := d.Raw(name)
	if raw == nil {
		return nil
	}
	var one int
	if json.Unmarshal(raw, &one) == nil {
		return []int{one}
	}
	var list []int
	if json.Unmarshal(raw, &list) == nil && len(list) > 0 {
		return list
	}
	d.Fail("field %q is %s: want a token id (a whole number) or a list of token ids", name, Excerpt(raw))
	return nil
}

// Excerpt returns a JSON value as it reads in a one-line message: compacted, without HTML escapes, and cut to 60
// characters.
func Excerpt(raw []byte) string {
	var b bytes.Buffer
	var v any
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // "</s>", as the file has it (a file written by Go holds "\u003c/s\u003e")
	if dec.Decode(&v) != nil || enc.Encode(v) != nil {
		b.Reset()
		b.Write(bytes.TrimSpace(raw))
	}
	s := strings.Join(strings.Fields(b.String()), " ")
	if len(s) > 60 {
		s = s[:57] + "..."
	}
	return s
}

// Want names in words the JSON value that decodes into out (a pointer): "a whole number", "a number", "true or
// false", "a string", "a list of strings", "an object".
func Want(out any) string {
	t := reflect.TypeOf(out)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil {
		return "a value"
	}
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		return "a list of " + plural(t.Elem())
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return one(t)
}

func one(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "a whole number"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number, 0 or more"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.String:
		return "a string"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "a value"
}

func plural(t reflect.Type) string {
	switch w := one(t); w {
	case "a whole number":
		return "whole numbers"
	case "a whole number, 0 or more":
		return "whole numbers, 0 or more"
	case "a number":
		return "numbers"
	case "true or false":
		return "true/false values"
	case "a string":
		return "strings"
	case "a list":
		return "lists"
	case "an object":
		return "objects"
	}
	return "values"
}

// Require is Get for a field that must be present.
func (d *Decoder) Require(name string, out any) {
	if !d.Get(name, out) && d.err == nil {
		d.fail(fmt.Errorf("field %q is missing", name))
	}
}

// Ignore marks fields as known but irrelevant to memfit.
func (d *Decoder) Ignore(names ...string) {
	for _, n := range names {
		d.used[n] = true
	}
}

// Fail records err (the first one wins).
func (d *Decoder) Fail(format string, args ...any) { d.fail(fmt.Errorf(format, args...)) }

func (d *Decoder) fail(err error) {
	if d.err == nil {
		d.err = err
	}
}

// Err returns the first error recorded.
func (d *Decoder) Err() error { return d.err }

// Unknown returns the fields neither decoded nor ignored, sorted.
func (d *Decoder) Unknown() []string {
	var out []string
	for name := range d.f {
		if !d.used[name] {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// CommonIgnored are PretrainedConfig fields that describe tooling, generation or export, not the network.
var CommonIgnored = []string{
	"_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache", "return_dict", "output_hidden_states",
	"output_attentions", "torchscript", "chunk_size_feed_forward", "is_encoder_decoder", "is_decoder",
	"add_cross_attention", "tie_encoder_decoder", "tokenizer_class", "prefix", "task_specific_params",
	"problem_type", "finetuning_task", "initializer_range", "initializer_factor", "bad_words_ids",
	"begin_suppress_tokens", "decoder_start_token_id", "diversity_penalty", "do_sample", "early_stopping",
	"encoder_no_repeat_ngram_size", "exponential_decay_length_penalty", "forced_bos_token_id",
	"forced_eos_token_id", "length_penalty", "max_length", "min_length", "no_repeat_ngram_size",
	"num_beam_groups", "num_beams", "num_return_sequences", "output_scores", "remove_invalid_values",
	"repetition_penalty", "return_dict_in_generate", "sep_token_id", "suppress_tokens", "temperature",
	"top_k", "top_p", "typical_p", "pruned_heads", "cross_attention_hidden_size", "tf_legacy_loss",
	"use_bfloat16",
}

// RefuseQuantized makes a config.json with a quantization_config the Decoder's error: transformers saves one
// with a checkpoint whose weights it stored quantized (bitsandbytes 4- and 8-bit, GPTQ, AWQ, FP8, ...), which
// memfit does not read; it quantizes float weights itself (QLoRA's NF4).
func RefuseQuantized(d *Decoder) {
	raw := d.Raw("quantization_config")
	if raw == nil {
		return
	}
	var q struct {
		Method string `json:"quant_method"`
	}
	method := "?"
	if json.Unmarshal(raw, &q) == nil && q.Method != "" {
		method = q.Method
	}
	d.Fail("the checkpoint is pre-quantized (quantization_config: quant_method %q): memfit reads float weights (float32, bfloat16, float16); use the unquantized model (memfit's --method qlora quantizes it to NF4 itself)", method)
}

// MaxLabels is the most classes memfit takes in a config's num_labels or id2label.
const MaxLabels = 1_000_000

// Labels reads id2label / label2id / num_labels and returns the label names in id order (LABEL_i when only
// num_labels is given).
func Labels(d *Decoder) []string {
	var id2label map[string]string
	var numLabels int
	hasMap := d.Get("id2label", &id2label)
	hasNum := d.Get("num_labels", &numLabels)
	d.Ignore("label2id")
	if !hasMap {
		if !hasNum {
			return nil
		}
		if numLabels < 0 || numLabels > MaxLabels {
			d.Fail("field \"num_labels\" is %d: give 0 to %d", numLabels, MaxLabels)
			return nil
		}
		return GenericLabels(numLabels)
	}
	labels := make([]string, len(id2label))
	for k, v := range id2label {
		var i int
		if _, err := fmt.Sscanf(k, "%d", &i); err != nil || i < 0 || i >= len(labels) {
			d.Fail("field \"id2label\": key %q is not an id in 0..%d", k, len(labels)-1)
			return nil
		}
		labels[i] = v
	}
	if hasNum && numLabels != len(labels) {
		d.Fail("field \"num_labels\" is %d but id2label has %d entries", numLabels, len(labels))
	}
	return labels
}

// LabelFields returns the id2label and label2id objects for writing a config.
func LabelFields(labels []string) (map[string]string, map[string]int) {
	id2label := make(map[string]string, len(labels))
	label2id := make(map[string]int, len(labels))
	for i, l := range labels {
		id2label[fmt.Sprint(i)] = l
		label2id[l] = i
	}
	return id2label, label2id
}

// Architecture returns the single entry of "architectures" (empty when absent) and checks it is one of allowed.
func Architecture(d *Decoder, allowed ...string) string {
	var archs []string
	if !d.Get("architectures", &archs) || len(archs) == 0 {
		return ""
	}
	if len(archs) > 1 {
		d.Fail("field \"architectures\" lists %d architectures, memfit supports one", len(archs))
		return ""
	}
	for _, a := range allowed {
		if archs[0] == a {
			return a
		}
	}
	d.Fail("field \"architectures\": %q is not supported (supported: %s)", archs[0], strings.Join(allowed, ", "))
	return ""
}

// Marshal writes fields as indented JSON with sorted keys, as save_pretrained does.
func Marshal(fields map[string]any) ([]byte, error) {
	data, err := json.MarshalIndent(fields, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(data, '\n'), nil
}

// ParseWith decodes a config.json object with decode, a model package's decoder of Fields (llama's, vit's).
func ParseWith[C any](data []byte, decode func(Fields) (C, error)) (C, error) {
	f, err := Parse(data)
	if err != nil {
		var zero C
		return zero, err
	}
	return decode(f)
}

// LoadWith reads path/config.json (or the file path) and decodes it with decode; a decoding error names the file.
func LoadWith[C any](path string, decode func(Fields) (C, error)) (C, error) {
	var zero C
	f, file, err := Read(path)
	if err != nil {
		return zero, err
	}
	c, err := decode(f)
	if err != nil {
		return zero, fmt.Errorf("%s: %w", file, err)
	}
	return c, nil
}

// ModelType decodes the required field "model_type" and checks that it is want. It returns the error to stop
// decoding with (nil when the field is want, or when it is missing or mistyped: that is the Decoder's error).
func ModelType(d *Decoder, want string) error {
	var modelType string
	d.Require("model_type", &modelType)
	if d.Err() == nil && modelType != want {
		return fmt.Errorf("field \"model_type\" is %q, not %q", modelType, want)
	}
	return nil
}

// Size is a config.json size field: its name, its value and the largest value memfit takes.
type Size struct {
	Name       string
	Value, Max int
}

// CheckSizes checks that every size is positive and at most its Max; the first that is not gives the error.
func CheckSizes(sizes ...Size) error {
	for _, s := range sizes {
		if s.Value <= 0 {
			return fmt.Errorf("field %q must be positive, got %d", s.Name, s.Value)
		}
		if s.Value > s.Max {
			return fmt.Errorf("field %q is %d, more than memfit takes (%d): is the config.json right?", s.Name, s.Value, s.Max)
		}
	}
	return nil
}

// Preset returns presets[name]; an unknown name is an error listing the known ones (kind names the family, e.g.
// "LLaMA").
func Preset[C any](presets map[string]C, kind, name string) (C, error) {
	c, ok := presets[name]
	if !ok {
		names := make([]string, 0, len(presets))
		for n := range presets {
			names = append(names, n)
		}
		sort.Strings(names)
		return c, fmt.Errorf("unknown %s preset %q (have: %s)", kind, name, strings.Join(names, ", "))
	}
	return c, nil
}

// GenericLabels returns n class names LABEL_0 .. LABEL_{n-1}, as transformers names the classes of a config that
// gives only num_labels.
func GenericLabels(n int) []string {
	labels := make([]string, n)
	for i := range labels {
		labels[i] = fmt.Sprintf("LABEL_%d", i)
	}
	return labels
}

// GenerationEOS returns the eos_token_id of dir's generation_config.json (one id or a list, as transformers takes
// it; transformers' generate stops at any of them, and Llama-3 Instruct lists <|eot_id|> there and not in
// config.json), nil when the file or the field is absent. An id outside [0, vocab) or a field of another type is an
// error naming the file.
func GenerationEOS(dir string, vocab int) ([]int, error) {
	path := filepath.Join(dir, "generation_config.json")
	b, err := readfile.Read(path, readfile.Config)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	f, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	d := NewDecoder(f)
	ids := d.TokenIDs("eos_token_id")
	if err := d.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, id := range ids {
		if id < 0 || id >= vocab {
			return nil, fmt.Errorf("%s: field \"eos_token_id\" holds %d, outside the vocabulary [0, %d) (vocab_size)", path, id, vocab)
		}
	}
	return ids, nil
}
