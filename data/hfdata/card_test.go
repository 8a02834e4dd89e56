package hfdata

import (
	"reflect"
	"slices"
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
