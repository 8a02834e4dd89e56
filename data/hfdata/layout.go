package hfdata

// The layouts of a dataset folder, and the choice of a config and a split in it: the one function (Select) that
// --data, --eval-data and --data-config go through.

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// isParquetName reports whether a file name ends in .parquet, in any case (FILE.PARQUET is parquet too).
func isParquetName(name string) bool {
	return strings.HasSuffix(strings.ToLower(name), ".parquet")
}

// stem is a parquet file's name without the .parquet ending.
func stem(name string) string { return name[:len(name)-len(".parquet")] }

// shardName is the name `datasets` and the hub give a split's shard: SPLIT-00000-of-00002.parquet, optionally
// with a hash after it (SPLIT-00000-of-00002-0123abcd.parquet).
var shardName = regexp.MustCompile(`^([A-Za-z0-9][A-Za-z0-9_.]*)-\d{5}-of-\d{5}(-[0-9a-f]+)?$`)

// knownSplits are split names `datasets` recognises in file names (its keywords for train, validation and test).
var knownSplits = []string{"train", "training", "validation", "valid", "val", "dev", "test", "testing", "eval", "evaluation"}

// entry is one name in a folder: whether it is a folder (links followed) and, for a link that cannot be
// followed (it loops, or points at nothing), why.
type entry struct {
	name   string
	dir    bool
	broken error
}

// readDir lists a folder's entries, sorted by name, links followed; nil when it is not a readable folder.
func readDir(dir string) []entry {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil
	}
	out := make([]entry, 0, len(des))
	for _, de := range des {
		e := entry{name: de.Name(), dir: de.IsDir()}
		if de.Type()&fs.ModeSymlink != 0 {
			st, err := os.Stat(filepath.Join(dir, de.Name()))
			if err != nil {
				e.broken = brokenLink(err)
			} else {
				e.dir = st.IsDir()
			}
		}
		out = append(out, e)
	}
	return out
}

// brokenLink names why a link cannot be followed.
func brokenLink(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) && strings.Contains(pe.Err.Error(), "too many levels of symbolic links") {
		return errors.New("a symbolic link that loops (it leads back to itself)")
	}
	if errors.Is(err, fs.ErrNotExist) {
		return errors.New("a symbolic link to nothing (its target does not exist)")
	}
	return err
}

// parquetIn lists the parquet files directly in dir (broken links named *.parquet included: opening one names
// what is wrong with it), in name order.
func parquetIn(dir string) []string {
	var out []string
	for _, e := range readDir(dir) {
		if !e.dir && isParquetName(e.name) {
			out = append(out, filepath.Join(dir, e.name))
		}
	}
	return out
}

// splitOfFile returns the split a parquet file directly in a dataset's (or a config's) folder belongs to, by
// its name: SPLIT-*.parquet (shards) or SPLIT.parquet.
func splitOfFile(name string) (string, bool) {
	s := stem(name)
	if i := strings.IndexByte(s, '-'); i > 0 {
		s = s[:i]
	}
	return s, splitName.MatchString(s)
}

// isConfigDir reports whether the folder dir (named name, directly in a dataset folder) is a config's folder,
// holding splits, rather than a split's folder, holding shards: it has folders of parquet files (the hub's
// parquet conversion: CONFIG/SPLIT/0000.parquet), or parquet files named by a split other than its own name
// (CONFIG/SPLIT-00000-of-00001.parquet, CONFIG/SPLIT.parquet for the split names `datasets` knows).
func isConfigDir(dir, name string) bool {
	if name == "data" {
		return false
	}
	for _, e := range readDir(dir) {
		if e.dir && e.broken == nil && len(parquetIn(filepath.Join(dir, e.name))) > 0 {
			return true
		}
		if e.dir || !isParquetName(e.name) {
			continue
		}
		s := stem(e.name)
		if m := shardName.FindStringSubmatch(s); m != nil && m[1] != name {
			return true
		}
		if slices.Contains(knownSplits, s) && s != name {
			return true
		}
	}
	return false
}

// Configs lists the configs of a dataset folder: its folders that hold splits (isConfigDir), sorted. A dataset
// whose files are not in config folders has none (its one config is the default).
func Configs(path string) []string {
	var out []string
	for _, e := range readDir(path) {
		if e.dir && e.broken == nil && isConfigDir(filepath.Join(path, e.name), e.name) {
			out = append(out, e.name)
		}
	}
	return out
}

// splitFiles returns the files of split in the folder base (a dataset folder, or a config's folder), as the
// first of these layouts that has any: data/SPLIT-*.parquet (what `datasets` and the hub write:
// data/train-00000-of-00002.parquet), data/SPLIT.parquet, data/SPLIT/*.parquet, SPLIT-*.parquet, SPLIT.parquet,
// SPLIT/*.parquet (a split's folder, not a config's). An error names a split folder that is a broken link.
func splitFiles(base, split string) ([]string, error) {
	byName := func(dir string) []string {
		var out []string
		for _, f := range parquetIn(dir) {
			name := filepath.Base(f)
			if s := stem(name); s == split || strings.HasPrefix(s, split+"-") {
				out = append(out, f)
			}
		}
		return out
	}
	inFolder := func(dir string, mayBeConfig bool) ([]string, error) {
		for _, e := range readDir(filepath.Dir(dir)) {
			if e.name != filepath.Base(dir) {
				continue
			}
			if e.broken != nil {
				return nil, fmt.Errorf("%s is %v: point it at the split's folder, or remove it", dir, e.broken)
			}
			if e.dir && !(mayBeConfig && isConfigDir(dir, split)) {
				return parquetIn(dir), nil
			}
		}
		return nil, nil
	}
	data := filepath.Join(base, "data")
	if m := byName(data); len(m) > 0 {
		return m, nil
	}
	if m, err := inFolder(filepath.Join(data, split), false); err != nil || len(m) > 0 {
		return m, err
	}
	if m := byName(base); len(m) > 0 {
		return m, nil
	}
	if split == "data" {
		return nil, nil // data/ holds the splits' files: it is never one split
	}
	return inFolder(filepath.Join(base, split), true)
}

// splitsIn lists the splits of the folder base (a dataset folder, or a config's folder), sorted: the names of
// data/SPLIT-*.parquet and SPLIT-*.parquet files (SPLIT.parquet included) and of folders of parquet files that
// are not configs.
func splitsIn(base string) []string {
	seen := map[string]bool{}
	for _, dir := range []string{filepath.Join(base, "data"), base} {
		for _, f := range parquetIn(dir) {
			if s, ok := splitOfFile(filepath.Base(f)); ok {
				seen[s] = true
			}
		}
		for _, e := range readDir(dir) {
			if dir == base && e.name == "data" {
				continue // the hub layout's folder of split files, not a split
			}
			if e.dir && e.broken == nil && len(parquetIn(filepath.Join(dir, e.name))) > 0 && !isConfigDir(filepath.Join(dir, e.name), e.name) {
				seen[e.name] = true
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

// Splits lists the splits of a dataset folder's default config (its files outside config folders), sorted.
func Splits(path string) []string { return splitsIn(path) }

// Spec says what to read of parquet data: the config and split of a dataset folder and the column renames
// (ParseColumns), with the flags that set them, which messages name.
type Spec struct {
	Config, Split, Columns string
	// SplitFlag names the flag that sets Split (default "--split"; "--eval-data-split" for validation data).
	SplitFlag string
	// ConfigFlag names the flag that sets Config ("": none; messages then say to pass the config's folder).
	ConfigFlag string
}

func (s Spec) splitFlag() string {
	if s.SplitFlag == "" {
		return "--split"
	}
	return s.SplitFlag
}

// pickConfig says how to choose config of the dataset folder path.
func (s Spec) pickConfig(path, config string) string {
	if s.ConfigFlag != "" {
		return s.ConfigFlag + " " + config
	}
	return "--data " + filepath.Join(path, config)
}

// EvalSplits are the splits validation data is read from when none is named, in order of preference: the
// validation split under its names, then the test split.
var EvalSplits = []string{"validation", "valid", "val", "dev", "test"}

// EvalSplit returns the first of EvalSplits that the dataset folder path has (in config, "" for the default; by
// its card's configs, else its layout), or "" (then its default split) when it has none of them.
func EvalSplit(path, config string) string {
	for _, s := range EvalSplits {
		if _, err := OpenSpec(path, Spec{Config: config, Split: s}); err == nil {
			return s
		}
	}
	return ""
}

// Selection is what Select resolved in a dataset folder: the config ("" for the default one: files outside
// config folders), the split and its files, in name order (shards keep their order).
type Selection struct {
	Config, Split string
	Files         []string
}

// Select resolves the files of one split of a dataset folder, in one config. Config "" is the default config (the
// files outside config folders), or, when the folder has none and exactly one config folder, that config (a
// dataset whose only files are plain_text/train-*.parquet and plain_text/test-*.parquet reads
// plain_text/train-*.parquet as split train); split "" is DefaultSplit. A config folder is never read as a split
// (its splits would be mixed), a split name that is a config is refused naming the config's splits, and a split
// that matches nothing is refused naming the splits there are.
func Select(path string, s Spec) (Selection, error) {
	split, config := s.Split, s.Config
	if split == "" {
		split = DefaultSplit
	}
	if !splitName.MatchString(split) {
		return Selection{}, fmt.Errorf("%s %q: a split is named by letters, digits, _ and . (train, validation, test)", s.splitFlag(), split)
	}
	configs := Configs(path)
	if config != "" {
		isFolder := false
		if st, err := os.Stat(filepath.Join(path, config)); err == nil && st.IsDir() && splitName.MatchString(config) {
			isFolder = true // named as a config: its folder is read as one, whatever its files are named
		}
		if !slices.Contains(configs, config) && !isFolder {
			if len(configs) == 0 {
				return Selection{}, fmt.Errorf("%s has no config %q: it has no config folders (its splits: %s)", path, config, listOr(splitsIn(path), "none"))
			}
			return Selection{}, fmt.Errorf("%s has no config %q (it has %s)", path, config, strings.Join(configs, ", "))
		}
		return s.selectIn(path, config, split)
	}
	files, err := splitFiles(path, split)
	if err != nil {
		return Selection{}, err
	}
	if len(files) > 0 {
		return Selection{Split: split, Files: files}, nil
	}
	if slices.Contains(configs, split) {
		return Selection{}, fmt.Errorf("%s: %q is a config of this dataset (a folder of splits: %s), not a split: read it with %s (and %s with one of its splits)",
			path, split, listOr(splitsIn(filepath.Join(path, split)), "none"), s.pickConfig(path, split), s.splitFlag())
	}
	have := splitsIn(path)
	switch {
	case len(have) == 0 && len(configs) == 1:
		return s.selectIn(path, configs[0], split)
	case len(have) == 0 && len(configs) > 1:
		return Selection{}, fmt.Errorf("%s holds several configs (%s), each a folder of splits: choose one, e.g. %s",
			path, strings.Join(configs, ", "), s.pickConfig(path, configs[0]))
	}
	return Selection{}, s.missingSplit(path, path, split, have, configs)
}

// selectIn resolves split in the folder of config (of the dataset folder path).
func (s Spec) selectIn(path, config, split string) (Selection, error) {
	base := filepath.Join(path, config)
	files, err := splitFiles(base, split)
	if err != nil {
		return Selection{}, err
	}
	if len(files) == 0 {
		return Selection{}, s.missingSplit(path, base, split, splitsIn(base), nil)
	}
	return Selection{Config: config, Split: split, Files: files}, nil
}

// missingSplit is the error for a split that matches no files in base (the dataset folder path, or its config's
// folder): an empty split folder, or the splits there are (and the configs, for a dataset folder).
func (s Spec) missingSplit(path, base, split string, have, configs []string) error {
	for _, dir := range []string{filepath.Join(base, "data", split), filepath.Join(base, split)} {
		if st, err := os.Stat(dir); err == nil && st.IsDir() && dir != filepath.Join(base, "data") {
			return fmt.Errorf("%s: split %q is empty: its folder %s holds no .parquet files", path, split, dir)
		}
	}
	where := path
	if base != path {
		where = fmt.Sprintf("%s (config %s)", path, filepath.Base(base))
	}
	if len(have) == 0 {
		if len(configs) > 0 {
			return fmt.Errorf("%s holds no split %q; its configs are %s", where, split, strings.Join(configs, ", "))
		}
		if bad := brokenIn(base); bad != "" {
			return fmt.Errorf("%s holds no parquet files that can be read: %s", where, bad)
		}
		return fmt.Errorf("%s holds no parquet files (data/SPLIT-*.parquet, data/SPLIT.parquet, SPLIT/*.parquet, SPLIT.parquet): is it a Hugging Face dataset folder?", where)
	}
	return fmt.Errorf("%s has no split %q (it has %s): pass %s with one of them", where, split, strings.Join(have, ", "), s.splitFlag())
}

// brokenIn names the first broken link among a dataset folder's entries and its data folder's ("" when none).
func brokenIn(base string) string {
	for _, dir := range []string{base, filepath.Join(base, "data")} {
		for _, e := range readDir(dir) {
			if e.broken != nil {
				return fmt.Sprintf("%s is %v", filepath.Join(dir, e.name), e.broken)
			}
		}
	}
	return ""
}

func listOr(xs []string, none string) string {
	if len(xs) == 0 {
		return none
	}
	return strings.Join(xs, ", ")
}

// IsParquet reports whether path is a parquet file by its name (.parquet in any case), or a folder in the hub
// layout: parquet files in it, in its data folder, or one folder down (SPLIT/, CONFIG/, data/SPLIT/), or two
// (CONFIG/SPLIT/); a data folder whose entries are broken links counts too, so that the error names the link.
func IsParquet(path string) bool {
	if isParquetName(path) {
		return true
	}
	st, err := os.Stat(path)
	if err != nil || !st.IsDir() {
		return false
	}
	for _, e := range readDir(path) {
		sub := filepath.Join(path, e.name)
		switch {
		case !e.dir && isParquetName(e.name):
			return true
		case e.name == "data" && e.dir:
			for _, d := range readDir(sub) {
				if d.broken != nil || !d.dir && isParquetName(d.name) || d.dir && len(parquetIn(filepath.Join(sub, d.name))) > 0 {
					return true
				}
			}
		case e.dir && e.broken == nil: // SPLIT/*.parquet, CONFIG/*.parquet, CONFIG/SPLIT/*.parquet: one listing of each folder
			for _, d := range readDir(sub) {
				if !d.dir && isParquetName(d.name) || d.dir && d.broken == nil && len(parquetIn(filepath.Join(sub, d.name))) > 0 {
					return true
				}
			}
		}
	}
	return false
}
