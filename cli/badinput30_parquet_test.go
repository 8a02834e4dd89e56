package cli_test

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/encoding/thrift"
	"github.com/parquet-go/parquet-go/format"
)

func abs(p string) string {
	a, _ := filepath.Abs(p)
	return a
}

// withFooter returns the parquet file src with its footer (file metadata) edited by edit.
func withFooter(t *testing.T, src string, edit func(md *format.FileMetaData)) []byte {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	n := int(binary.LittleEndian.Uint32(b[len(b)-8:]))
	var md format.FileMetaData
	if err := thrift.Unmarshal(new(thrift.CompactProtocol), b[len(b)-8-n:len(b)-8], &md); err != nil {
		t.Fatal(err)
	}
	edit(&md)
	footer, err := thrift.Marshal(new(thrift.CompactProtocol), &md)
	if err != nil {
		t.Fatal(err)
	}
	out := append(append([]byte(nil), b[:len(b)-8-n]...), footer...)
	return append(binary.LittleEndian.AppendUint32(out, uint32(len(footer))), "PAR1"...)
}

// TestBadInputSweepParquet: parquet data that cannot be trained on is refused by train with one line naming the
// cause (the file, the column, the type found and the type needed, the split), a non-zero exit, and nothing
// written: missing and wrongly typed columns, files that are not parquet or whose footer is corrupt, row groups
// and column chunks that declare more than the file holds, empty and unknown splits, bad --columns.
func TestBadInputSweepParquet(t *testing.T) {
	tmp := t.TempDir()
	fx := func(name string) string { return filepath.Join(hfTestdata, name) }
	write := func(name string, b []byte) string {
		p := filepath.Join(tmp, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	alpaca, _ := os.ReadFile(fx("alpaca.arrow.parquet"))
	truncated := write("truncated.parquet", alpaca[:len(alpaca)/2])
	notParquet := write("rows.parquet", []byte(`{"instruction": "a", "output": "b"}`+"\n"))
	footer := append([]byte(nil), alpaca...)
	n := int(binary.LittleEndian.Uint32(footer[len(footer)-8:]))
	for i := len(footer) - 8 - n; i < len(footer)-8-n/2; i++ {
		footer[i] = 0xff
	}
	badFooter := write("footer.parquet", footer)
	hugeFooter := write("huge-footer.parquet", append(binary.LittleEndian.AppendUint32(append([]byte(nil), alpaca[:len(alpaca)-8]...), 0xfffffff0), "PAR1"...))
	hugeRows := write("huge-rows.parquet", withFooter(t, fx("alpaca.arrow.parquet"), func(md *format.FileMetaData) { md.RowGroups[0].NumRows = 1 << 40 }))
	hugeChunk := write("huge-chunk.parquet", withFooter(t, fx("alpaca.arrow.parquet"), func(md *format.FileMetaData) {
		md.RowGroups[1].Columns[2].MetaData.TotalUncompressedSize = 1 << 40
	}))
	// A hub folder whose train split is an empty folder, one whose only train shard has no rows, and labels of -1
	// (the hub's unlabelled test rows).
	os.MkdirAll(filepath.Join(tmp, "hub-empty", "data", "train"), 0o755)
	write("hub-empty/data/test-00000-of-00001.parquet", alpaca)
	type textRow struct {
		Text string `parquet:"text"`
	}
	os.MkdirAll(filepath.Join(tmp, "hub-norows", "data"), 0o755)
	if err := parquet.WriteFile(filepath.Join(tmp, "hub-norows", "data", "train-00000-of-00001.parquet"), []textRow{}); err != nil {
		t.Fatal(err)
	}
	type sstRow struct {
		Sentence string `parquet:"sentence"`
		Label    int64  `parquet:"label"`
	}
	unlabelled := filepath.Join(tmp, "test-sst2.parquet")
	if err := parquet.WriteFile(unlabelled, []sstRow{{"a fine film", 1}, {"a dull film", -1}, {"fine", 0}, {"dull", 1}}); err != nil {
		t.Fatal(err)
	}

	llama := filepath.Join("..", "pretrained", "llama-tiny")
	cls := filepath.Join(tmp, "cls")
	mustRun(t, "init", "--from", llama, "--num-labels", "2", "--out", cls)
	vit := filepath.Join(tmp, "vit")
	mustRun(t, "init", "--arch", "vit", "--preset", "tiny", "--num-labels", "10", "--out", vit)
	out := filepath.Join(tmp, "run")
	train := func(model, data string, more ...string) []string {
		return append([]string{"train", "--model", model, "--data", data, "--out", out, "--steps", "1", "--batch-size", "2", "--seq-len", "64"}, more...)
	}
	cases := []struct {
		args []string
		want string
	}{
		// Columns: missing, of the wrong type, renamed wrongly.
		{train(vit, fx("alpaca.duckdb.parquet")), `alpaca.duckdb.parquet: no column "image" (the encoded PNG or JPEG image); the file has "instruction", "input", "output", "status": name the column that holds it with --columns image=COLUMN`},
		{train(llama, fx("sst2.duckdb.parquet")), `sst2.duckdb.parquet has none of the columns a causal LM trains on (instruction + output, messages, text); its columns are sentence, label: name yours with --columns, e.g. --columns text=sentence`},
		{train(llama, fx("sst2.duckdb.parquet"), "--columns", "instruction=sentence,output=label"), `sst2.duckdb.parquet: column "label" is int64, but memfit reads output as a string (the response of an Alpaca row): name a column of that type with --columns output=COLUMN`},
		{train(vit, fx("images.arrow.parquet"), "--columns", "label=image"), `images.arrow.parquet: column "image" is struct{bytes: binary, path: string}, but memfit reads label as an integer (the class index of the image)`},
		{train(vit, fx("images.duckdb.parquet"), "--columns", "image=label"), `column "label" is int64, but memfit reads image as an image struct{bytes, path} (as datasets stores it) or binary (the encoded PNG or JPEG image)`},
		{train(cls, fx("stsb.duckdb.parquet"), "--task", "sst2", "--columns", "sentence=sentence1"), `stsb.duckdb.parquet: column "label" is float, but memfit reads label as an integer (a GLUE sst2 row's class, 0..1)`},
		{train(cls, fx("sst2.duckdb.parquet"), "--task", "rte"), `sst2.duckdb.parquet: no column "sentence1" (the first sentence of a GLUE rte row); the file has "sentence", "label"`},
		{train(cls, fx("sst2.duckdb.parquet")), `parquet data for a sequence classifier is a GLUE task's rows: name it with --task (cola, sst2, mrpc, stsb, rte)`},
		{train(cls, unlabelled, "--task", "sst2"), `test-sst2.parquet: row 1: label -1 is not one of 0..1 (the hub marks unlabelled test rows -1: train on a labelled split)`},
		{train(llama, fx("alpaca.arrow.parquet"), "--columns", "text"), `--columns "text": give NAME=COLUMN pairs separated by commas (e.g. text=content)`},
		{train(llama, fx("alpaca.arrow.parquet"), "--columns", "response=output"), `--columns response=output: memfit reads no column "response"`},
		// Files that are not parquet, corrupt footers, declared sizes past the file or memfit's bounds.
		{train(llama, notParquet), `rows.parquet is not a parquet file (it does not start with PAR1): is it truncated or in another format?`},
		{train(llama, truncated), `truncated.parquet is not a parquet file (it does not end with PAR1, the footer's magic bytes)`},
		{train(llama, badFooter), `footer.parquet is not a parquet file (its footer does not decode`},
		{train(llama, hugeFooter), `huge-footer.parquet is not a parquet file (its footer declares 4294967280 bytes of metadata in a file of`},
		{train(llama, hugeRows), `huge-rows.parquet: row group 0 declares 1099511627776 rows (memfit reads row groups of up to 67108864 rows)`},
		{train(llama, hugeChunk), `huge-chunk.parquet: row group 1, column "output" declares 1099511627776 bytes uncompressed (memfit reads column chunks of up to 1024 MiB)`},
		// Splits.
		{train(llama, filepath.Join(tmp, "hub-empty")), `hub-empty: split "train" is empty: its folder ` + filepath.Join(tmp, "hub-empty", "data", "train") + ` holds no .parquet files`},
		{train(llama, filepath.Join(tmp, "hub-norows")), `hub-norows: split "train" is empty: its parquet files (1) hold no rows`},
		{train(llama, fx("hub-alpaca"), "--split", "validation"), `hub-alpaca has no split "validation" (it has test, train): pass --split with one of them`},
		{train(llama, fx("hub-alpaca"), "--split", "../x"), `--split "../x": a split is named by letters, digits, _ and . (train, validation, test)`},
		{train(llama, fx("alpaca.arrow.parquet"), "--split", "train"), `--split train picks the files of a dataset folder, but ` + abs(fx("alpaca.arrow.parquet")) + ` is one parquet file: leave --split out, or pass the dataset folder`},
	}
	for _, c := range cases {
		_, stderr, code := run(t, c.args...)
		lines := strings.Split(strings.TrimSpace(stderr), "\n")
		last := lines[len(lines)-1]
		t.Logf("exit %d: %s", code, last)
		if code == 0 || len(lines) != 1 || !strings.HasPrefix(last, "finetune: ") || !strings.Contains(last, c.want) {
			t.Errorf("%v: exit %d, %d line(s), last %q; want a non-zero exit and one line naming %q", c.args[4:], code, len(lines), last, c.want)
		}
		for _, bad := range []string{"panic", "goroutine ", "runtime error", ".go:", "Go value", "of type "} {
			if strings.Contains(stderr, bad) {
				t.Errorf("%v: %q in the output:\n%s", c.args, bad, stderr)
			}
		}
		if _, err := os.Stat(out); err == nil {
			t.Errorf("%v: %s was written", c.args[4:], out)
			os.RemoveAll(out)
		}
	}
	t.Logf("%d bad parquet commands, each refused with one line", len(cases))
}
