// Package hfdata reads Hugging Face datasets as they arrive from the hub: parquet files, one file or a dataset
// folder in the hub layout (data/train-00000-of-00002.parquet, or train/*.parquet), whose split --split picks.
// Files are opened with github.com/parquet-go/parquet-go and read row group by row group, a few rows at a time;
// what memfit keeps is only the columns it trains on (texts, Alpaca rows, GLUE rows, conversations, encoded
// images with their labels). Every size a file declares (footer, row groups, column chunks, pages) is checked
// against the file and against memfit's bounds before anything of that size is allocated.
package hfdata

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// DefaultSplit is the split of a dataset folder read when --split is not given.
const DefaultSplit = "train"

// Dataset is parquet data to read: one file, or the files of one split of a dataset folder.
type Dataset struct {
	// Path is the file or folder given (--data); Split the split read from a folder ("" for one file).
	Path, Split string
	// Files are the parquet files, in name order (shards keep their order).
	Files []string
	// Columns renames columns: Columns["text"] = "content" reads the file's "content" column as "text".
	Columns map[string]string
}

// Names memfit reads from parquet columns (the targets of --columns).
var knownColumns = []string{"text", "instruction", "input", "output", "status", "messages", "image", "label",
	"sentence", "sentence1", "sentence2"}

var splitName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.]*$`)

// IsParquet reports whether path is a parquet file by its name, or a folder holding parquet files in the hub
// layout (data/*.parquet, SPLIT/*.parquet or *.parquet).
func IsParquet(path string) bool {
	if strings.HasSuffix(strings.ToLower(path), ".parquet") {
		return true
	}
	st, err := os.Stat(path)
	if err != nil || !st.IsDir() {
		return false
	}
	for _, pat := range []string{"*.parquet", "data/*.parquet", "*/*.parquet", "data/*/*.parquet"} {
		if m, _ := filepath.Glob(filepath.Join(globEscape(path), pat)); len(m) > 0 {
			return true
		}
	}
	return false
}

// Open resolves path and split to the files to read and parses columns ("new=old,..."; "" for none).
//
// A file is read as it is; --split does not apply to it (an error says so). A folder is a dataset in the hub
// layout, its split (default "train") found as the first of these that matches: data/SPLIT-*.parquet (what
// `datasets` and the hub write: data/train-00000-of-00002.parquet), data/SPLIT/*.parquet, SPLIT/*.parquet,
// SPLIT-*.parquet. A split that matches none is refused naming the splits the folder has; a split folder
// without parquet files is refused as empty.
func Open(path, split, columns string) (*Dataset, error) { return OpenConfig(path, "", split, columns) }

// OpenConfig is Open for a dataset folder with configs: config names one of its card's (README.md) configs, or
// a config folder (CONFIG/SPLIT/*.parquet, the layout of the Hub's parquet conversion); "" is the card's
// default config, or the folder itself.
func OpenConfig(path, config, split, columns string) (*Dataset, error) {
	cols, err := ParseColumns(columns)
	if err != nil {
		return nil, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("data %s: no such file or folder", path)
	}
	if !st.IsDir() {
		if split != "" {
			return nil, fmt.Errorf("--split %s picks the files of a dataset folder, but %s is one parquet file: leave --split out, or pass the dataset folder", split, path)
		}
		return &Dataset{Path: path, Files: []string{path}, Columns: cols}, nil
	}
	// A card (README.md) naming configs chooses the files, as the Hub and the datasets library read it.
	if configs, err := ReadCard(os.DirFS(path)); err != nil || configs != nil {
		if err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		_, files, err := cardSelect(os.DirFS(path), path, configs, config, split)
		if err != nil {
			return nil, err
		}
		for i, f := range files {
			files[i] = filepath.Join(path, filepath.FromSlash(f))
		}
		return &Dataset{Path: path, Split: cmp.Or(split, DefaultSplit), Files: files, Columns: cols}, nil
	}
	if config != "" {
		sub := filepath.Join(path, config)
		if st, err := os.Stat(sub); err != nil || !st.IsDir() || strings.ContainsAny(config, `/\`) {
			return nil, fmt.Errorf("%s has no config %q: no card (README.md) naming configs, and no folder %s", path, config, sub)
		}
		return OpenConfig(sub, "", split, columns)
	}
	if split == "" {
		split = DefaultSplit
	}
	if !splitName.MatchString(split) {
		return nil, fmt.Errorf("--split %q: a split is named by letters, digits, _ and . (train, validation, test)", split)
	}
	root := globEscape(path)
	for _, pat := range []string{"data/" + split + "-*.parquet", "data/" + split + "/*.parquet", split + "/*.parquet", split + "-*.parquet"} {
		m, _ := filepath.Glob(filepath.Join(root, pat))
		if len(m) > 0 {
			slices.Sort(m)
			return &Dataset{Path: path, Split: split, Files: m, Columns: cols}, nil
		}
	}
	for _, dir := range []string{filepath.Join(path, "data", split), filepath.Join(path, split)} {
		if st, err := os.Stat(dir); err == nil && st.IsDir() {
			return nil, fmt.Errorf("%s: split %q is empty: its folder %s holds no .parquet files", path, split, dir)
		}
	}
	have := Splits(path)
	if len(have) == 0 {
		return nil, fmt.Errorf("%s holds no parquet files (data/SPLIT-*.parquet, SPLIT/*.parquet): is it a Hugging Face dataset folder?", path)
	}
	return nil, fmt.Errorf("%s has no split %q (it has %s): pass --split with one of them", path, split, strings.Join(have, ", "))
}

// Splits lists the splits a dataset folder holds, sorted: names of data/SPLIT-*.parquet files and of folders
// holding parquet files.
func Splits(path string) []string {
	seen := map[string]bool{}
	root := globEscape(path)
	for _, pat := range []string{"data/*.parquet", "*.parquet"} {
		m, _ := filepath.Glob(filepath.Join(root, pat))
		for _, f := range m {
			name := strings.TrimSuffix(filepath.Base(f), filepath.Ext(f))
			if i := strings.IndexByte(name, '-'); i > 0 {
				seen[name[:i]] = true
			}
		}
	}
	for _, pat := range []string{"data/*/*.parquet", "*/*.parquet"} {
		m, _ := filepath.Glob(filepath.Join(root, pat))
		for _, f := range m {
			if d := filepath.Base(filepath.Dir(f)); d != "data" {
				seen[d] = true
			}
		}
	}
	out := make([]string, 0, len(seen))
	for s := range seen {
		out = append(out, s)
	}
	slices.Sort(out)
	return out
}

// ParseColumns parses --columns: comma-separated new=old pairs, new being a name memfit reads (text, instruction,
// input, output, messages, image, label, sentence, sentence1, sentence2, status) and old the file's column.
func ParseColumns(s string) (map[string]string, error) {
	out := map[string]string{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, pair := range strings.Split(s, ",") {
		newName, old, ok := strings.Cut(strings.TrimSpace(pair), "=")
		newName, old = strings.TrimSpace(newName), strings.TrimSpace(old)
		if !ok || newName == "" || old == "" {
			return nil, fmt.Errorf("--columns %q: give NAME=COLUMN pairs separated by commas (e.g. text=content)", s)
		}
		if !slices.Contains(knownColumns, newName) {
			return nil, fmt.Errorf("--columns %s=%s: memfit reads no column %q (it reads %s)", newName, old, newName, strings.Join(knownColumns, ", "))
		}
		if _, dup := out[newName]; dup {
			return nil, fmt.Errorf("--columns names %q twice", newName)
		}
		out[newName] = old
	}
	return out, nil
}

// column returns the file's name of the column memfit reads as name.
func (d *Dataset) column(name string) string {
	if old, ok := d.Columns[name]; ok {
		return old
	}
	return name
}

// where names the data in messages: the file, or the folder and split.
func (d *Dataset) where() string {
	if d.Split == "" {
		return d.Path
	}
	return fmt.Sprintf("%s (split %s)", d.Path, d.Split)
}

// globEscape escapes the glob metacharacters of a literal path.
func globEscape(p string) string {
	r := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`)
	return r.Replace(p)
}

// Has reports whether the dataset's first file has the column memfit reads as name (after --columns renames).
func (d *Dataset) Has(name string) (bool, error) {
	names, err := d.ColumnNames()
	return slices.Contains(names, d.column(name)), err
}

// ColumnNames returns the top-level columns of the dataset's first file.
func (d *Dataset) ColumnNames() ([]string, error) {
	f, err := openFile(d.Files[0])
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var names []string
	for _, fl := range f.pf.Schema().Fields() {
		names = append(names, fl.Name())
	}
	return names, nil
}

// Describe names the data and the files it resolved to, for the run's notes: "D (split train): 2 parquet
// files".
func (d *Dataset) Describe() string {
	if d.Split == "" {
		return d.Path
	}
	return fmt.Sprintf("%s (split %s): %d parquet file(s)", d.Path, d.Split, len(d.Files))
}
