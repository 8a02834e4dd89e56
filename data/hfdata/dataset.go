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
	"maps"
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
	// Path is the file or folder given (--data); Config the config folder read ("" for the default config, and
	// for one file); Split the split read from a folder ("" for one file).
	Path, Config, Split string
	// Files are the parquet files, in name order (shards keep their order).
	Files []string
	// Columns renames columns: Columns["text"] = "content" reads the file's "content" column as "text".
	Columns map[string]string
}

// Names memfit reads from parquet columns (the targets of --columns).
var knownColumns = []string{"text", "instruction", "input", "output", "status", "messages", "prompt", "chosen", "rejected", "image", "label",
	"sentence", "sentence1", "sentence2"}

var splitName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.]*$`)

// Open resolves path and split to the files to read and parses columns ("new=old,..."; "" for none): OpenSpec
// with the default config.
func Open(path, split, columns string) (*Dataset, error) {
	return OpenSpec(path, Spec{Split: split, Columns: columns})
}

// OpenConfig is Open for a dataset folder with configs (train's --data-config): config names one of its card's
// (README.md) configs, or a config folder (CONFIG/SPLIT-*.parquet, CONFIG/SPLIT/*.parquet, the layout of the
// Hub's parquet conversion); "" is the card's default config, or the folder's (Select).
func OpenConfig(path, config, split, columns string) (*Dataset, error) {
	return OpenSpec(path, Spec{Config: config, Split: split, Columns: columns, ConfigFlag: "--data-config"})
}

// OpenSpec resolves path to the files to read and parses s's column renames. A file is read as it is; a split or
// config does not apply to it (an error says so). A folder whose card (README.md) names configs is read by them,
// as the Hub and the datasets library read it (cardSelect); any other folder by its layout (Select: config
// folders, then the split's files).
func OpenSpec(path string, s Spec) (*Dataset, error) {
	cols, err := ParseColumns(s.Columns)
	if err != nil {
		return nil, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("data %s: no such file or folder", path)
	}
	if !st.IsDir() {
		if s.Split != "" {
			return nil, fmt.Errorf("%s %s picks the files of a dataset folder, but %s is one parquet file: leave %s out, or pass the dataset folder", s.splitFlag(), s.Split, path, s.splitFlag())
		}
		if s.Config != "" {
			return nil, fmt.Errorf("config %s picks a folder of a dataset folder, but %s is one parquet file: leave it out, or pass the dataset folder", s.Config, path)
		}
		return &Dataset{Path: path, Files: []string{path}, Columns: cols}, nil
	}
	// A card (README.md) naming configs chooses the files, as the Hub and the datasets library read it.
	if configs, err := ReadCard(os.DirFS(path)); err != nil || configs != nil {
		if err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		c, files, err := cardSelect(os.DirFS(path), path, configs, s.Config, s.Split)
		if err != nil {
			return nil, err
		}
		for i, f := range files {
			files[i] = filepath.Join(path, filepath.FromSlash(f))
		}
		return &Dataset{Path: path, Config: c.Name, Split: cmp.Or(s.Split, DefaultSplit), Files: files, Columns: cols}, nil
	}
	sel, err := Select(path, s)
	if err != nil {
		return nil, err
	}
	return &Dataset{Path: path, Config: sel.Config, Split: sel.Split, Files: sel.Files, Columns: cols}, nil
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

// where names the data in messages: the file, or the folder, config and split.
func (d *Dataset) where() string {
	if d.Split == "" {
		return d.Path
	}
	if d.Config != "" {
		return fmt.Sprintf("%s (config %s, split %s)", d.Path, d.Config, d.Split)
	}
	return fmt.Sprintf("%s (split %s)", d.Path, d.Split)
}

// Has reports whether the dataset's first file has the column memfit reads as name (after --columns renames).
func (d *Dataset) Has(name string) (bool, error) {
	names, err := d.ColumnNames()
	return slices.Contains(names, d.column(name)), err
}

// CheckRenames refuses a --columns rename whose column the dataset's first file lacks (the readers check every
// file; this is for choosing what the data holds by its columns).
func (d *Dataset) CheckRenames() error {
	names, err := d.ColumnNames()
	if err != nil {
		return err
	}
	return d.renamesIn(d.Files[0], names)
}

// renamesIn refuses a --columns rename whose column is not among the columns names of the file path.
func (d *Dataset) renamesIn(path string, names []string) error {
	for _, newName := range slices.Sorted(maps.Keys(d.Columns)) {
		if old := d.Columns[newName]; !slices.Contains(names, old) {
			return fmt.Errorf("%s: --columns %s=%s: the file has no column %q (it has %s)", path, newName, old, old, quoteList(names))
		}
	}
	return nil
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
	return fmt.Sprintf("%s: %d parquet file(s)", d.where(), len(d.Files))
}
