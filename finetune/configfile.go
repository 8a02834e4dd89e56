package finetune

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/memfit/memfit/internal/readfile"
)

// ReadConfigFile reads a YAML (or JSON) training config over base: the keys present in the file replace base's
// values. It reads strictly, and every problem is one line naming the file, the line and the key: a syntax error,
// an unknown key (with the known one meant, when near), a key given twice, a value of the wrong type (`steps:
// "ten" is not a whole number`), a second YAML document (after ---), a file that is not a mapping of keys.
func ReadConfigFile(path string, base Config) (Config, error) {
	cfg, _, err := readConfigFile(path, base)
	return cfg, err
}

// readConfigFile is ReadConfigFile that also returns the keys the file gives.
func readConfigFile(path string, base Config) (Config, map[string]bool, error) {
	data, err := readfile.Read(path, readfile.Config)
	if err != nil {
		return base, nil, err
	}
	return ParseConfigFile(path, data, base)
}

// ParseConfigFile is ReadConfigFile of a config file's bytes (path names it in errors); it also returns the keys
// the file gives (for the settings whose defaults depend on whether the user gave them).
func ParseConfigFile(path string, data []byte, base Config) (Config, map[string]bool, error) {
	root, err := yamlDocument(path, data)
	if err != nil || root == nil {
		return base, map[string]bool{}, err // an empty file gives nothing
	}
	return configFromNode(path, root, base)
}

// configFromNode decodes a mapping node of Settings' keys over base.
func configFromNode(path string, root *yaml.Node, base Config) (Config, map[string]bool, error) {
	given := map[string]bool{}
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return base, given, nil
	}
	if root.Kind != yaml.MappingNode {
		return base, nil, fmt.Errorf("%s:%d: the config is %s, not a mapping of settings (key: value, one per line)", path, root.Line, describeNode(root))
	}
	cfg := base
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		s, ok := SettingByKey(k.Value)
		if !ok {
			return base, nil, fmt.Errorf("%s:%d: unknown key %q%s", path, k.Line, k.Value, nearestKey(k.Value))
		}
		if err := setFromNode(s.Field(&cfg), resolveAlias(v)); err != nil {
			return base, nil, fmt.Errorf("%s:%d: %s%s", path, v.Line, k.Value, err)
		}
		given[k.Value] = true
	}
	return cfg, given, nil
}

// yamlDocument parses data as one YAML document and returns its top node (nil for an empty file). A syntax error
// (with its line), a second document and a mapping key given twice, at any depth, are errors naming path.
func yamlDocument(path string, data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("%s: %s", path, yamlMessage(err))
	}
	for {
		// A later document that holds anything is refused (it was silently ignored); an empty one (a --- at
		// the end) is not.
		var next yaml.Node
		err := dec.Decode(&next)
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("%s: %s", path, yamlMessage(err))
		}
		if len(next.Content) > 0 && !(next.Content[0].Kind == yaml.ScalarNode && next.Content[0].Tag == "!!null") {
			return nil, fmt.Errorf("%s:%d: a second YAML document (after ---): a config file holds one; merge them or remove the ---", path, next.Content[0].Line)
		}
	}
	if len(doc.Content) == 0 {
		return nil, nil
	}
	if err := checkDuplicateKeys(path, doc.Content[0]); err != nil {
		return nil, err
	}
	return doc.Content[0], nil
}

// checkDuplicateKeys returns an error naming the first mapping key given twice under n.
func checkDuplicateKeys(path string, n *yaml.Node) error {
	if n.Kind == yaml.MappingNode {
		seen := map[string]int{}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			if first, dup := seen[k.Value]; dup && k.Kind == yaml.ScalarNode {
				return fmt.Errorf("%s:%d: key %q is given twice (first on line %d): keep one", path, k.Line, k.Value, first)
			}
			seen[k.Value] = k.Line
		}
	}
	for _, c := range n.Content {
		if err := checkDuplicateKeys(path, c); err != nil {
			return err
		}
	}
	return nil
}

// yamlMessage is a YAML parser error as one line, without the package's "yaml: " prefix.
func yamlMessage(err error) string {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	return strings.Join(strings.Fields(msg), " ")
}

func resolveAlias(n *yaml.Node) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

// describeNode names a value for a message: a string in quotes, a number or word as written, "a list", "a
// mapping", "empty".
func describeNode(n *yaml.Node) string {
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	case yaml.ScalarNode:
		switch {
		case n.Tag == "!!null":
			return "empty"
		case n.Tag == "!!str":
			v := n.Value
			if len(v) > 40 {
				v = v[:37] + "..."
			}
			return strconv.Quote(v)
		}
		return n.Value
	}
	return "a value"
}

// yaml11Bools are the words YAML 1.1 (which memfit's earlier YAML reader followed) reads as booleans.
var yaml11Bools = map[string]bool{"y": true, "yes": true, "on": true, "true": true, "n": false, "no": false, "off": false, "false": false}

// setFromNode sets the setting field ptr (Setting.Field) from a YAML value; the error starts with ": " or " "
// and says what the value is and what the field takes, in words.
func setFromNode(ptr any, n *yaml.Node) error {
	scalar := n.Kind == yaml.ScalarNode
	null := scalar && n.Tag == "!!null"
	notA := func(want string) error {
		if null {
			return fmt.Errorf(" has no value: give %s", want)
		}
		hint := ""
		if scalar && n.Tag == "!!str" && want != "a string" {
			_, isBool := yaml11Bools[strings.ToLower(n.Value)]
			if _, err := strconv.ParseFloat(n.Value, 64); err == nil || isBool {
				hint = " (it is in quotes: write it without them)"
			}
		}
		return fmt.Errorf(": %s is not %s%s", describeNode(n), want, hint)
	}
	switch p := ptr.(type) {
	case *string:
		if null {
			*p = ""
			return nil
		}
		if !scalar {
			return notA("a string")
		}
		*p = n.Value
	case *bool:
		if !scalar {
			return notA("true or false")
		}
		switch {
		case n.Tag == "!!bool":
			return n.Decode(p)
		case n.Tag == "!!str" && n.Style == 0:
			if b, ok := yaml11Bools[strings.ToLower(n.Value)]; ok {
				*p = b
				return nil
			}
		}
		return notA("true or false")
	case *int:
		x, ok := wholeNumber(n, math.MinInt, math.MaxInt)
		if !ok {
			if f, err := strconv.ParseFloat(n.Value, 64); scalar && n.Tag != "!!str" && err == nil && f == math.Trunc(f) {
				return fmt.Errorf(": %s is too large a number", n.Value)
			}
			return notA("a whole number")
		}
		*p = int(x)
	case *uint64:
		if !scalar || n.Tag != "!!int" || n.Decode(p) != nil {
			return notA("a whole number, 0 or more")
		}
	case *float64:
		if !scalar || (n.Tag != "!!int" && n.Tag != "!!float") || n.Decode(p) != nil {
			return notA("a number")
		}
	case *[]string:
		switch {
		case null:
			*p = nil
		case scalar:
			// One string: comma-separated, as the flag takes it (lora_targets: q,v).
			var items []string
			for _, s := range strings.Split(n.Value, ",") {
				if s = strings.TrimSpace(s); s != "" {
					items = append(items, s)
				}
			}
			*p = items
		case n.Kind == yaml.SequenceNode:
			items := make([]string, len(n.Content))
			for i, c := range n.Content {
				c = resolveAlias(c)
				if c.Kind != yaml.ScalarNode || c.Tag == "!!null" {
					return fmt.Errorf(": item %d is %s, not a string", i+1, describeNode(c))
				}
				items[i] = c.Value
			}
			*p = items
		default:
			return notA("a list of strings")
		}
	default:
		return fmt.Errorf(": a setting of type %T cannot be read from a config file", ptr)
	}
	return nil
}

// wholeNumber reads an integer scalar (or a float with no fraction, such as 1e3) within [lo, hi].
func wholeNumber(n *yaml.Node, lo, hi int64) (int64, bool) {
	if n.Kind != yaml.ScalarNode {
		return 0, false
	}
	switch n.Tag {
	case "!!int":
		var x int64
		if n.Decode(&x) != nil || x < lo || x > hi {
			return 0, false
		}
		return x, true
	case "!!float":
		var f float64
		if n.Decode(&f) != nil || f != math.Trunc(f) || f < float64(lo) || f >= float64(hi) {
			return 0, false
		}
		return int64(f), true
	}
	return 0, false
}

// nearestKey suggests the setting a mistyped key meant: the key of a flag spelling (lora-r: lora_r), or a key
// at most two edits away; "" when none.
func nearestKey(key string) string {
	if s, ok := SettingByFlag(key); ok {
		return fmt.Sprintf(": keys use underscores (%s)", s.Key)
	}
	best, bestD := "", 3
	for _, s := range Settings {
		if d := editDistance(strings.ToLower(key), s.Key); d < bestD {
			best, bestD = s.Key, d
		}
	}
	if best != "" {
		return fmt.Sprintf(" (did you mean %s?)", best)
	}
	return " (the keys are train's flags in snake_case: lora_r for --lora-r)"
}

// editDistance is the Levenshtein distance of a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
