package runner

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/internal/readfile"
)

// maxInputValues bounds one input tensor of ReadInputs (16M values: 64 MiB of float32, e.g. 80 ViT-B images).
const maxInputValues = 1 << 24

// maxInputRows bounds the examples of one ReadInputs call (their logits are computed in one batch and printed).
const maxInputRows = 4096

// ReadInputs reads a batch of model inputs from a JSON file: an object with input_ids / attention_mask /
// token_type_ids (integers [batch, tokens]; token types for BERT) and pixel_values (floats [batch, channels, height, width]) as nested lists, or an
// object whose "inputs" field is one (as the golden files are).
func ReadInputs(path string) (Batch, error) {
	data, err := readfile.Read(path, readfile.Data)
	if err != nil {
		return nil, err
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(data, &obj); err != nil {
		return nil, fmt.Errorf("%s: not a JSON object (%v)", path, err)
	}
	if inner, ok := obj["inputs"]; ok {
		obj = nil
		if err := json.Unmarshal(inner, &obj); err != nil {
			return nil, fmt.Errorf("%s: \"inputs\" is not an object (%v)", path, err)
		}
	}
	in := Batch{}
	for key, raw := range obj {
		dims, values, err := parseNested(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %v", path, key, err)
		}
		if slices.Contains(dims, 0) {
			return nil, fmt.Errorf("%s: %q has an empty axis (shape %v): give at least one example of at least one value", path, key, dims)
		}
		if len(dims) > 0 && dims[0] > maxInputRows {
			return nil, fmt.Errorf("%s: %q holds %d examples, more than the %d one call takes: split the inputs into several files", path, key, dims[0], maxInputRows)
		}
		if len(values) > maxInputValues {
			return nil, fmt.Errorf("%s: %q holds %d values, more than the %d one call takes: split the inputs into several files", path, key, len(values), maxInputValues)
		}
		switch key {
		case "input_ids", "attention_mask", "token_type_ids":
			ints := make([]int32, len(values))
			for i, v := range values {
				if v != float64(int32(v)) {
					return nil, fmt.Errorf("%s: %q holds %v, not an integer", path, key, v)
				}
				ints[i] = int32(v)
			}
			if len(dims) != 2 {
				return nil, fmt.Errorf("%s: %q must be [batch, tokens], got %v", path, key, dims)
			}
			in[key] = tensors.FromFlatDataAndDimensions(ints, dims...)
		case "pixel_values":
			fs := make([]float32, len(values))
			for i, v := range values {
				fs[i] = float32(v)
			}
			if len(dims) != 4 {
				return nil, fmt.Errorf("%s: \"pixel_values\" must be [batch, channels, height, width], got %v", path, dims)
			}
			in[key] = tensors.FromFlatDataAndDimensions(fs, dims...)
		default:
			return nil, fmt.Errorf("%s: unknown input %q (expected input_ids, attention_mask, token_type_ids or pixel_values)", path, key)
		}
	}
	for _, name := range []string{"attention_mask", "token_type_ids"} {
		if t, ok := in[name]; ok && (in["input_ids"] == nil || !slices.Equal(t.Shape().Dimensions, in["input_ids"].Shape().Dimensions)) {
			return nil, fmt.Errorf("%s: %s must have the shape of input_ids", path, name)
		}
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
