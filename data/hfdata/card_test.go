package hfdata

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
)

// TestParseCard: the forms of data_files datasets accepts (a pattern, a list, a mapping, split/path items with
// one path or several), data_dir, the default flag; a card without configs has none; a bad one is named.
func TestParseCard(t *testing.T) {
	card := `---
license: mit
configs:
- config_name: plain_text
  default: true
  data_files:
  - split: train
    path: plain_text/train-*
  - split: test
    path: [plain_text/test-*, extra/test.parquet]
- config_name: one
  data_files: "one/*.parquet"
- config_name: listed
  data_files: [a.parquet, b.parquet]
- config_name: mapped
  data_files:
    train: m/train.parquet
    validation: [m/val-*.parquet]
- config_name: dir
  data_dir: sub
  data_files:
  - split: train
    path: "*.parquet"
---
# Title
`
	got, err := ParseCard([]byte(card))
	if err != nil {
		t.Fatal(err)
	}
	want := []CardConfig{
		{Name: "plain_text", Default: true, Splits: []CardSplit{{"train", []string{"plain_text/train-*"}}, {"test", []string{"plain_text/test-*", "extra/test.parquet"}}}},
		{Name: "one", Splits: []CardSplit{{"train", []string{"one/*.parquet"}}}},
		{Name: "listed", Splits: []CardSplit{{"train", []string{"a.parquet", "b.parquet"}}}},
		{Name: "mapped", Splits: []CardSplit{{"train", []string{"m/train.parquet"}}, {"validation", []string{"m/val-*.parquet"}}}},
		{Name: "dir", Splits: []CardSplit{{"train", []string{"sub/*.parquet"}}}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	for _, none := range []string{"# no front matter\n", "---\nlicense: mit\n---\n", ""} {
		if c, err := ParseCard([]byte(none)); c != nil || err != nil {
			t.Errorf("%q: %v %v", none, c, err)
		}
	}
	for _, bad := range []string{"---\nconfigs: [\n---\n", "---\nconfigs:\n- config_name: x\n  data_files:\n  - split: train\n    path: a\n  - split: train\n    path: b\n---\n",
		"---\nconfigs:\n- data_files:\n  - {path: a}\n---\n"} {
		if _, err := ParseCard([]byte(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// TestMatchFiles: patterns glob as fsspec does (* within a part, ** across, classes), hidden files and the card
// are left out unless named, and the result is sorted without duplicates.
func TestMatchFiles(t *testing.T) {
	fsys := fstest.MapFS{}
	for _, f := range []string{"README.md", "data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet", "data/test-00000-of-00001.parquet",
		"deep/a/b/x.parquet", ".hidden/train.parquet", "data/.train-tmp.parquet", "top.parquet"} {
		fsys[f] = &fstest.MapFile{Data: []byte("x")}
	}
	cases := map[string][]string{
		"data/train-*": {"data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"},
		"**/*.parquet": {"data/test-00000-of-00001.parquet", "data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet", "deep/a/b/x.parquet", "top.parquet"},
		"*.parquet":    {"top.parquet"},
		"data/t[er]*":  {"data/test-00000-of-00001.parquet", "data/train-00000-of-00002.parquet", "data/train-00001-of-00002.parquet"},
		".hidden/*":    {".hidden/train.parquet"},
		"deep/**":      {"deep/a/b/x.parquet"},
		"data/x-*":     nil,
	}
	for pat, want := range cases {
		got, err := matchFiles(fsys, []string{pat})
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%s: %v %v, want %v", pat, got, err, want)
		}
	}
	if got, _ := matchFiles(fsys, []string{"data/train-*", "data/*"}); len(got) != 3 {
		t.Errorf("duplicates: %v", got)
	}
}

// TestOpenByCard: a folder whose card names configs is read by them (the default, or --data-config's), a config
// folder without a card by its folder, a card config of CSV files is ErrNotParquet; and SelectListing picks the
// same files in the folder's file list as OpenConfig in the folder.
func TestOpenByCard(t *testing.T) {
	dir := t.TempDir()
	card := "---\nconfigs:\n- config_name: a\n  data_files: [\"x/*.parquet\"]\n- config_name: b\n  default: true\n  data_files:\n  - split: train\n    path: [y/1.parquet, y/2.parquet]\n  - split: test\n    path: y/t.parquet\n- config_name: c\n  data_files: z/*.csv\n---\n"
	files := map[string]string{"README.md": card, "x/1.parquet": "", "x/2.parquet": "", "y/1.parquet": "", "y/2.parquet": "", "y/t.parquet": "", "z/1.csv": ""}
	mapfs := fstest.MapFS{}
	for name, data := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		mapfs[name] = &fstest.MapFile{Data: []byte(data)}
	}
	cases := []struct {
		config, split string
		want          []string
	}{
		{"", "", []string{"y/1.parquet", "y/2.parquet"}},
		{"b", "test", []string{"y/t.parquet"}},
		{"a", "", []string{"x/1.parquet", "x/2.parquet"}},
	}
	for _, c := range cases {
		ds, err := OpenConfig(dir, c.config, c.split, "")
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		var got []string
		for _, f := range ds.Files {
			rel, _ := filepath.Rel(dir, f)
			got = append(got, filepath.ToSlash(rel))
		}
		listed, _, err := SelectListing(mapfs, "hf://datasets/o/n", c.config, c.split)
		if !slices.Equal(got, c.want) || err != nil || !slices.Equal(listed, c.want) {
			t.Errorf("%+v: local %v, listing %v (%v), want %v", c, got, listed, err, c.want)
		}
	}
	if _, err := OpenConfig(dir, "c", "", ""); !errors.Is(err, ErrNotParquet) {
		t.Errorf("CSV config: %v", err)
	}
	if _, _, err := SelectListing(mapfs, "hf://datasets/o/n", "c", ""); !errors.Is(err, ErrNotParquet) || strings.Contains(err.Error(), os.TempDir()) {
		t.Errorf("CSV config in a listing: %v", err)
	}
	if _, err := OpenConfig(dir, "d", "", ""); err == nil || !strings.Contains(err.Error(), `no config "d": its card (README.md) names a, b, c`) {
		t.Errorf("unknown config: %v", err)
	}
	// Without a card, a config is a folder (the Hub's parquet conversion: CONFIG/SPLIT/NNNN.parquet).
	conv := t.TempDir()
	for _, name := range []string{"default/train/0000.parquet", "default/test/0000.parquet"} {
		p := filepath.Join(conv, filepath.FromSlash(name))
		os.MkdirAll(filepath.Dir(p), 0o755)
		os.WriteFile(p, nil, 0o644)
	}
	if ds, err := OpenConfig(conv, "default", "test", ""); err != nil || len(ds.Files) != 1 || !strings.HasSuffix(ds.Files[0], filepath.Join("default", "test", "0000.parquet")) {
		t.Errorf("config folder: %v %v", ds, err)
	}
}
