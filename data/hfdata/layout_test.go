package hfdata

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// layout copies the fixture alpaca.duckdb.parquet to each relative path under a new folder and returns it.
func layout(t *testing.T, paths ...string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "alpaca.duckdb.parquet"))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	for _, p := range paths {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func rel(root string, files []string) []string {
	out := make([]string, len(files))
	for i, f := range files {
		out[i], _ = filepath.Rel(root, f)
	}
	return out
}

// TestSelectLayouts: the layouts of a dataset folder that the hub, `datasets` and its parquet conversion write, and
// which files each (config, split) reads. Issue 36's probe: a config folder (plain_text/train-*, plain_text/test-*)
// was offered as a split, and --split plain_text read train and test together (hf09, hf18); SPLIT.parquet and
// data/SPLIT.parquet were "no parquet files" (hf10, hf11); .PARQUET was not parquet (hf12).
func TestSelectLayouts(t *testing.T) {
	for _, tc := range []struct {
		name         string
		files        []string
		spec         Spec
		config, want string // want: the files read, comma-separated
	}{
		{"hub data shards", []string{"data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet", "data/test-00000-of-00001.parquet"}, Spec{}, "",
			"data/train-00000-of-00002.parquet,data/train-00001-of-00002.parquet"},
		{"split folders", []string{"train/0000.parquet", "train/0001.parquet", "test/0000.parquet"}, Spec{Split: "test"}, "", "test/0000.parquet"},
		{"a split folder of its own shards", []string{"train/train-00000-of-00001.parquet", "test/test-00000-of-00001.parquet"}, Spec{}, "", "train/train-00000-of-00001.parquet"},
		{"SPLIT.parquet (hf10)", []string{"train.parquet", "test.parquet"}, Spec{}, "", "train.parquet"},
		{"data/SPLIT.parquet (hf11)", []string{"data/train.parquet", "data/validation.parquet"}, Spec{Split: "validation"}, "", "data/validation.parquet"},
		{"upper-case .PARQUET (hf12)", []string{"data/train-00000-of-00001.PARQUET"}, Spec{}, "", "data/train-00000-of-00001.PARQUET"},
		{"one config folder (hf09, hf18)", []string{"plain_text/train-00000-of-00001.parquet", "plain_text/test-00000-of-00001.parquet"}, Spec{}, "plain_text",
			"plain_text/train-00000-of-00001.parquet"},
		{"one config folder, its test split", []string{"plain_text/train-00000-of-00001.parquet", "plain_text/test-00000-of-00001.parquet"}, Spec{Split: "test"}, "plain_text",
			"plain_text/test-00000-of-00001.parquet"},
		{"the parquet conversion (CONFIG/SPLIT/0000.parquet)", []string{"default/train/0000.parquet", "default/train/0001.parquet", "default/test/0000.parquet"}, Spec{}, "default",
			"default/train/0000.parquet,default/train/0001.parquet"},
		{"a config chosen among several", []string{"cola/train-00000-of-00001.parquet", "sst2/train-00000-of-00001.parquet", "sst2/validation-00000-of-00001.parquet"},
			Spec{Config: "sst2", Split: "validation"}, "sst2", "sst2/validation-00000-of-00001.parquet"},
		{"the default config beside a config folder", []string{"data/train-00000-of-00001.parquet", "extra/train-00000-of-00001.parquet"}, Spec{}, "",
			"data/train-00000-of-00001.parquet"},
	} {
		root := layout(t, tc.files...)
		if !IsParquet(root) {
			t.Errorf("%s: not recognised as parquet", tc.name)
			continue
		}
		d, err := OpenSpec(root, tc.spec)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if got := strings.Join(rel(root, d.Files), ","); got != tc.want || d.Config != tc.config {
			t.Errorf("%s: config %q files %s; want config %q files %s", tc.name, d.Config, got, tc.config, tc.want)
		}
		if _, err := d.Instructions(); err != nil {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

// TestSelectRefusals: what cannot be chosen is refused naming what there is; a config is never read as a split.
func TestSelectRefusals(t *testing.T) {
	cfg := layout(t, "plain_text/train-00000-of-00001.parquet", "plain_text/test-00000-of-00001.parquet")
	if got := Splits(cfg); len(got) != 0 {
		t.Errorf("Splits lists %v: a config folder is not a split", got)
	}
	if got := Configs(cfg); !slices.Equal(got, []string{"plain_text"}) {
		t.Errorf("Configs: %v", got)
	}
	two := layout(t, "cola/train-00000-of-00001.parquet", "sst2/train-00000-of-00001.parquet")
	loop := t.TempDir()
	os.MkdirAll(filepath.Join(loop, "data"), 0o755)
	if err := os.Symlink("train", filepath.Join(loop, "data", "train")); err != nil {
		t.Fatal(err)
	}
	if !IsParquet(loop) {
		t.Errorf("a data folder with a looping link is not taken for parquet (it would be read as an image folder)")
	}
	for _, tc := range []struct {
		root string
		spec Spec
		want string
	}{
		{cfg, Spec{Split: "plain_text"}, `"plain_text" is a config of this dataset (a folder of splits: test, train), not a split: read it with --data ` + filepath.Join(cfg, "plain_text")},
		{cfg, Spec{Split: "validation"}, `(config plain_text) has no split "validation" (it has test, train): pass --split with one of them`},
		{cfg, Spec{Split: "validation", SplitFlag: "--eval-data-split"}, `pass --eval-data-split with one of them`},
		{cfg, Spec{Config: "default"}, `has no config "default" (it has plain_text)`},
		{two, Spec{}, `holds several configs (cola, sst2), each a folder of splits: choose one, e.g. --data ` + filepath.Join(two, "cola")},
		{two, Spec{ConfigFlag: "--data-config"}, `choose one, e.g. --data-config cola`},
		{loop, Spec{}, `data/train is a symbolic link that loops`},
		{filepath.Join("testdata", "hub-alpaca"), Spec{Split: "validation"}, `hub-alpaca has no split "validation" (it has test, train)`},
		{filepath.Join("testdata", "hub-alpaca"), Spec{Split: "data"}, `hub-alpaca has no split "data" (it has test, train)`},
	} {
		_, err := OpenSpec(tc.root, tc.spec)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v; want %q", tc.spec, err, tc.want)
		}
	}
}
