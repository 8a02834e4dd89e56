package hfdata

// A dataset card's configs: the YAML front matter of README.md, where the Hub and the `datasets` library read
// which files make each config's splits (datasets' MetadataConfigs and data_files.sanitize_patterns):
//
//	---
//	configs:
//	- config_name: default
//	  default: true
//	  data_files:
//	  - split: train
//	    path: data/train-*
//	  - split: test
//	    path: [data/test-*, extra/test.parquet]
//	---
//
// data_files is also a pattern (the train split), a list of patterns (train), or a mapping split -> pattern(s);
// data_dir prefixes the patterns.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// CardFile is the dataset card, whose front matter may name the configs.
const CardFile = "README.md"

// maxCard bounds the card read (a card's front matter is a few KiB; the text after it is not needed).
const maxCard = 4 << 20

// CardConfig is one config of a dataset card: its name, whether it is the default, and its splits' file
// patterns (relative to the dataset, data_dir applied), in the card's order.
type CardConfig struct {
	Name    string
	Default bool
	Splits  []CardSplit
}

// CardSplit is one split of a card's config and the patterns of its files.
type CardSplit struct {
	Name     string
	Patterns []string
}

// ReadCard reads the configs of the card in fsys (nil, nil when there is no card or it names no configs).
func ReadCard(fsys fs.FS) ([]CardConfig, error) {
	if st, err := fs.Stat(fsys, CardFile); err != nil || !st.Mode().IsRegular() {
		return nil, nil // none, or not a file (a pipe or device is never opened)
	}
	f, err := fsys.Open(CardFile)
	if err != nil {
		return nil, nil
	}
	defer f.Close()
	buf := make([]byte, maxCard)
	n, _ := readFull(f, buf)
	return ParseCard(buf[:n])
}

func readFull(f fs.File, buf []byte) (int, error) {
	n := 0
	for n < len(buf) {
		k, err := f.Read(buf[n:])
		n += k
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// ParseCard parses a card's front matter for its configs (nil when it has none).
func ParseCard(card []byte) ([]CardConfig, error) {
	text := strings.ReplaceAll(string(card), "\r\n", "\n")
	rest, ok := strings.CutPrefix(text, "---\n")
	if !ok {
		return nil, nil
	}
	end := strings.Index(rest, "\n---")
	if end < 0 {
		return nil, nil
	}
	var meta struct {
		Configs []struct {
			ConfigName string    `yaml:"config_name"`
			Default    bool      `yaml:"default"`
			DataDir    string    `yaml:"data_dir"`
			DataFiles  yaml.Node `yaml:"data_files"`
		} `yaml:"configs"`
	}
	if err := yaml.Unmarshal([]byte(rest[:end+1]), &meta); err != nil {
		return nil, fmt.Errorf("%s: its YAML front matter does not parse: %v", CardFile, firstLine(err.Error()))
	}
	var out []CardConfig
	for i, c := range meta.Configs {
		name := c.ConfigName
		if name == "" {
			name = "default"
		}
		splits, err := dataFiles(&c.DataFiles)
		if err != nil {
			return nil, fmt.Errorf("%s: config %q (configs[%d]): data_files %v", CardFile, name, i, err)
		}
		if len(splits) == 0 && c.DataDir != "" {
			splits = []CardSplit{{Name: DefaultSplit, Patterns: []string{"**"}}}
		}
		for j := range splits {
			for k, p := range splits[j].Patterns {
				if c.DataDir != "" {
					p = path.Join(strings.Trim(c.DataDir, "/"), p)
				}
				splits[j].Patterns[k] = strings.TrimPrefix(p, "./")
			}
		}
		out = append(out, CardConfig{Name: name, Default: c.Default, Splits: splits})
	}
	return out, nil
}

// dataFiles reads data_files in the forms datasets' sanitize_patterns takes.
func dataFiles(n *yaml.Node) ([]CardSplit, error) {
	patterns := func(n *yaml.Node) ([]string, error) {
		switch n.Kind {
		case yaml.ScalarNode:
			return []string{n.Value}, nil
		case yaml.SequenceNode:
			var out []string
			for _, c := range n.Content {
				if c.Kind != yaml.ScalarNode {
					return nil, errors.New("is a list holding something other than path patterns")
				}
				out = append(out, c.Value)
			}
			return out, nil
		}
		return nil, errors.New("is neither a path pattern nor a list of them")
	}
	switch n.Kind {
	case 0:
		return nil, nil
	case yaml.ScalarNode:
		return []CardSplit{{Name: DefaultSplit, Patterns: []string{n.Value}}}, nil
	case yaml.MappingNode:
		var out []CardSplit
		for i := 0; i+1 < len(n.Content); i += 2 {
			p, err := patterns(n.Content[i+1])
			if err != nil {
				return nil, err
			}
			out = append(out, CardSplit{Name: n.Content[i].Value, Patterns: p})
		}
		return out, nil
	case yaml.SequenceNode:
		if !slices.ContainsFunc(n.Content, func(c *yaml.Node) bool { return c.Kind == yaml.MappingNode }) {
			p, err := patterns(n)
			if err != nil {
				return nil, err
			}
			return []CardSplit{{Name: DefaultSplit, Patterns: p}}, nil
		}
		var out []CardSplit
		for _, c := range n.Content {
			var item struct {
				Split string    `yaml:"split"`
				Path  yaml.Node `yaml:"path"`
			}
			if c.Kind != yaml.MappingNode || c.Decode(&item) != nil || item.Split == "" {
				return nil, errors.New("has an item that is not {split: NAME, path: PATTERN(S)}")
			}
			p, err := patterns(&item.Path)
			if err != nil {
				return nil, err
			}
			if slices.ContainsFunc(out, func(s CardSplit) bool { return s.Name == item.Split }) {
				return nil, fmt.Errorf("names split %q twice", item.Split)
			}
			out = append(out, CardSplit{Name: item.Split, Patterns: p})
		}
		return out, nil
	}
	return nil, errors.New("is not a pattern, a list or a mapping")
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// globRE turns a data_files pattern into a regular expression as fsspec (>= 2023.12) globs: * and ? within one
// path part, ** across parts (a whole part: "**/" also matches no folder), [...] a class.
func globRE(pattern string) (*regexp.Regexp, error) {
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(pattern); i++ {
		c := pattern[i]
		switch {
		case strings.HasPrefix(pattern[i:], "**/"):
			b.WriteString("(?:.*/)?")
			i += 2
		case strings.HasPrefix(pattern[i:], "**"):
			b.WriteString(".*")
			i++
		case c == '*':
			b.WriteString("[^/]*")
		case c == '?':
			b.WriteString("[^/]")
		case c == '[':
			j := strings.IndexByte(pattern[i:], ']')
			if j < 0 {
				return nil, fmt.Errorf("pattern %q: [ without ]", pattern)
			}
			class := pattern[i+1 : i+j]
			if strings.HasPrefix(class, "!") {
				class = "^" + class[1:]
			}
			b.WriteString("[" + strings.ReplaceAll(class, `\`, `\\`) + "]")
			i += j
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString("$")
	return regexp.Compile(b.String())
}

// hiddenOK says whether a matched file is hidden (a part starting with . or __) without the pattern naming that
// part so (datasets ignores such files unless asked).
func hiddenOK(file, pattern string) bool {
	count := func(p string) int {
		n := 0
		for _, part := range strings.Split(p, "/") {
			if strings.HasPrefix(part, ".") && strings.Trim(part, ".") != "" || strings.HasPrefix(part, "__") {
				n++
			}
		}
		return n
	}
	return count(file) == count(pattern)
}

// matchFiles lists the files of fsys that the patterns match, sorted, without duplicates (the card itself and
// hidden files excepted, as datasets does).
func matchFiles(fsys fs.FS, patterns []string) ([]string, error) {
	var all []string
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil // an unreadable folder or a broken link: not a match
		}
		if !d.IsDir() && p != CardFile {
			all = append(all, p)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	for _, pat := range patterns {
		if strings.Contains(pat, "://") {
			return nil, fmt.Errorf("pattern %q is a URL: memfit reads the dataset's own files", pat)
		}
		re, err := globRE(strings.TrimPrefix(pat, "/"))
		if err != nil {
			return nil, err
		}
		for _, f := range all {
			if !seen[f] && re.MatchString(f) && hiddenOK(f, pat) {
				seen[f] = true
				out = append(out, f)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// ErrNotParquet marks a dataset whose chosen files are not parquet (CSV, JSON, text, ...), or that holds no
// parquet files at all: the Hub keeps a parquet conversion of such a dataset (refs/convert/parquet).
var ErrNotParquet = errors.New("not parquet")

// cardSelect picks a split's files by the card's configs: config ("" for the card's default: the one marked
// default, else the only one, else the one named default) and split ("" for train). Files are paths in fsys;
// where names the dataset in messages.
func cardSelect(fsys fs.FS, where string, configs []CardConfig, config, split string) (c CardConfig, files []string, err error) {
	names := make([]string, len(configs))
	for i, c := range configs {
		names[i] = c.Name
	}
	i := -1
	switch {
	case config != "":
		if i = slices.Index(names, config); i < 0 {
			return c, nil, fmt.Errorf("%s has no config %q: its card (%s) names %s", where, config, CardFile, strings.Join(names, ", "))
		}
	case len(configs) == 1:
		i = 0
	default:
		if i = slices.IndexFunc(configs, func(c CardConfig) bool { return c.Default }); i < 0 {
			i = slices.Index(names, "default")
		}
		if i < 0 {
			return c, nil, fmt.Errorf("%s has several configs (%s) and its card marks none as the default: choose one with --data-config", where, strings.Join(names, ", "))
		}
	}
	c = configs[i]
	if split == "" {
		split = DefaultSplit
	}
	j := slices.IndexFunc(c.Splits, func(s CardSplit) bool { return s.Name == split })
	if j < 0 {
		var have []string
		for _, s := range c.Splits {
			have = append(have, s.Name)
		}
		return c, nil, fmt.Errorf("%s (config %s) has no split %q (it has %s): pass --split with one of them", where, c.Name, split, strings.Join(have, ", "))
	}
	if files, err = matchFiles(fsys, c.Splits[j].Patterns); err != nil {
		return c, nil, fmt.Errorf("%s (config %s, split %s): %v", where, c.Name, split, err)
	}
	if len(files) == 0 {
		return c, nil, fmt.Errorf("%s (config %s, split %s): its card's data_files (%s) match no file", where, c.Name, split, strings.Join(c.Splits[j].Patterns, ", "))
	}
	var other []string
	for _, f := range files {
		if !strings.HasSuffix(strings.ToLower(f), ".parquet") {
			other = append(other, f)
		}
	}
	if len(other) > 0 {
		return c, nil, fmt.Errorf("%s (config %s, split %s) is in files memfit does not read as a dataset folder (%s): %w; name one file, or read the Hub's parquet conversion (hf://datasets/ORG/NAME)", where, c.Name, split, strings.Join(other[:min(3, len(other))], ", "), ErrNotParquet)
	}
	return c, files, nil
}

// SelectListing picks the files of one split of one config of a dataset given as a file list (a Hub
// repository's, as an fs.FS whose files are read only for the card) exactly as OpenConfig picks them in a local
// dataset folder: the list is laid out as empty files in a temporary folder (the card copied whole) and
// OpenConfig resolves it there, so that a dataset downloaded by its selection and read back locally gives the
// same files. name stands for the dataset in messages. The paths returned are fsys's; chosen is the config the
// card chose ("" without a card). A dataset with no parquet file at all is ErrNotParquet.
func SelectListing(fsys fs.FS, name, config, split string) (files []string, chosen string, err error) {
	tmp, err := os.MkdirTemp("", "memfit-listing-")
	if err != nil {
		return nil, "", err
	}
	defer os.RemoveAll(tmp)
	parquet, other := 0, 0
	err = fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		local := filepath.Join(tmp, filepath.FromSlash(p))
		switch {
		case p == ".":
			return nil
		case d.IsDir():
			return os.Mkdir(local, 0o755)
		case p == CardFile:
			data, err := fs.ReadFile(fsys, p)
			if err != nil {
				return err
			}
			return os.WriteFile(local, data, 0o644)
		case strings.HasSuffix(strings.ToLower(p), ".parquet"):
			parquet++
		case !strings.HasPrefix(path.Base(p), "."):
			other++
		}
		return os.WriteFile(local, nil, 0o644)
	})
	if err != nil {
		return nil, "", err
	}
	chosen = config
	if configs, err := ReadCard(os.DirFS(tmp)); err == nil && configs != nil {
		if c, _, err := cardSelect(os.DirFS(tmp), name, configs, config, split); err == nil {
			chosen = c.Name
		}
	}
	ds, err := OpenConfig(tmp, config, split, "")
	if err != nil {
		msg := strings.ReplaceAll(err.Error(), tmp+string(filepath.Separator), name+"/")
		msg = strings.ReplaceAll(msg, tmp, name)
		switch {
		case errors.Is(err, ErrNotParquet):
			return nil, chosen, fmt.Errorf("%s: %w", strings.TrimSuffix(msg, ": "+ErrNotParquet.Error()), ErrNotParquet)
		case parquet == 0 && other > 0:
			return nil, chosen, fmt.Errorf("%s holds no parquet files (%d other files): %w", name, other, ErrNotParquet)
		}
		return nil, chosen, errors.New(msg)
	}
	files = make([]string, len(ds.Files))
	for i, f := range ds.Files {
		rel, err := filepath.Rel(tmp, f)
		if err != nil {
			return nil, chosen, err
		}
		files[i] = filepath.ToSlash(rel)
	}
	return files, chosen, nil
}
