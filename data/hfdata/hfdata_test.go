package hfdata

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"

	"github.com/memfit/memfit/data"
)

// The fixtures in testdata were written by DuckDB and by parquet-wasm (arrow-rs) from the JSONL files beside
// them (tools/parquet-fixtures/make.mjs): each parquet file must read the rows of its JSONL.

func readJSONL[T any](t *testing.T, name string) []T {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []T
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatal(err)
		}
		out = append(out, v)
	}
	return out
}

func open(t *testing.T, path, split, cols string) *Dataset {
	t.Helper()
	d, err := Open(filepath.Join("testdata", path), split, cols)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestAlpacaParquetReadsItsJSONL(t *testing.T) {
	want, err := data.ReadInstructions("testdata/alpaca.jsonl") // the JSONL path: rows not ok skipped
	if err != nil {
		t.Fatal(err)
	}
	if len(want) < 20 || len(want) == len(readJSONL[map[string]any](t, "alpaca.jsonl")) {
		t.Fatalf("the fixture should mix usable and rejected rows: %d usable", len(want))
	}
	for _, name := range []string{"alpaca.duckdb.parquet", "alpaca.arrow.parquet"} {
		got, err := open(t, name, "", "").Instructions()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %d rows differ from the JSONL's %d", name, len(got), len(want))
		}
	}
	// The hub layout: data/train-0000N-of-00002.parquet in shard order, data/test-*.parquet.
	train, err := open(t, "hub-alpaca", "", "").Instructions()
	if err != nil {
		t.Fatal(err)
	}
	test, err := open(t, "hub-alpaca", "test", "").Instructions()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(append(train, test...), want) {
		t.Errorf("hub-alpaca train+test: %d+%d rows differ from the JSONL's %d", len(train), len(test), len(want))
	}
}

func TestParquetFixturesHaveWhatTheyClaim(t *testing.T) {
	for name, rowGroups := range map[string]int{"alpaca.arrow.parquet": 5, "alpaca.duckdb.parquet": 1, "images.arrow.parquet": 4, "messages.arrow.parquet": 3} {
		f, err := openFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		md := f.pf.Metadata()
		codecs, dict := map[string]bool{}, false
		for _, rg := range md.RowGroups {
			for _, c := range rg.Columns {
				codecs[c.MetaData.Codec.String()] = true
				if c.MetaData.DictionaryPageOffset > 0 {
					dict = true
				}
			}
		}
		f.Close()
		if len(md.RowGroups) < rowGroups || !dict {
			t.Errorf("%s: %d row groups (want %d or more), dictionary pages %v, codecs %v", name, len(md.RowGroups), rowGroups, dict, codecs)
		}
		t.Logf("%s: %d row groups, codecs %v, dictionary %v, by %s", name, len(md.RowGroups), codecs, dict, md.CreatedBy)
	}
}

func TestTextParquetReadsItsJSONL(t *testing.T) {
	var want []string
	for _, r := range readJSONL[struct{ Text string }](t, "text.jsonl") {
		want = append(want, r.Text)
	}
	got, err := open(t, "text.duckdb.parquet", "", "").Texts()
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("text.duckdb.parquet: %d texts, %v; want %d", len(got), err, len(want))
	}
	train, err := open(t, "hub-text", "train", "").Texts()
	if err != nil {
		t.Fatal(err)
	}
	test, err := open(t, "hub-text", "test", "").Texts()
	if err != nil || !reflect.DeepEqual(append(train, test...), want) {
		t.Fatalf("hub-text train+test: %d+%d texts, %v; want %d", len(train), len(test), err, len(want))
	}
}

func TestMessagesParquetReadsItsJSONL(t *testing.T) {
	var want [][]Message
	for _, r := range readJSONL[struct{ Messages []Message }](t, "messages.jsonl") {
		want = append(want, r.Messages)
	}
	for _, name := range []string{"messages.duckdb.parquet", "messages.arrow.parquet"} {
		convs, err := open(t, name, "", "").Conversations()
		got := messagesOf(convs)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %d conversations, %v; want %d", name, len(got), err, len(want))
		}
	}
	// The ShareGPT form of the same conversations (from human/gpt, value) reads as the OpenAI form.
	convs, err := open(t, "sharegpt.duckdb.parquet", "", "messages=conversations").Conversations()
	got := messagesOf(convs)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("sharegpt.duckdb.parquet: %d conversations, %v; want %d", len(got), err, len(want))
	}
}

// messagesOf returns the messages of each conversation.
func messagesOf(convs []data.Conversation) [][]Message {
	out := make([][]Message, len(convs))
	for i, c := range convs {
		out[i] = c.Messages
	}
	return out
}

func TestGLUEParquetReadsItsJSONL(t *testing.T) {
	type row struct {
		Sentence, Sentence1, Sentence2 string
		Label                          float64
	}
	for _, task := range []string{"sst2", "rte", "stsb"} {
		var want []data.GLUEExample
		for _, r := range readJSONL[row](t, task+".jsonl") {
			ex := data.GLUEExample{TextA: r.Sentence + r.Sentence1, TextB: r.Sentence2}
			if task == "stsb" {
				ex.Score = r.Label
			} else {
				ex.Label = int(r.Label)
			}
			want = append(want, ex)
		}
		got, err := open(t, task+".duckdb.parquet", "", "").GLUE(task)
		if err != nil {
			t.Fatal(err)
		}
		if task == "stsb" { // stored as float32 by the fixture
			for i := range got {
				if d := got[i].Score - want[i].Score; d > 1e-6 || d < -1e-6 {
					t.Fatalf("stsb row %d: score %v, want %v", i, got[i].Score, want[i].Score)
				}
				got[i].Score = want[i].Score
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: %d rows differ from the JSONL's %d", task, len(got), len(want))
		}
	}
}

func TestImagesParquetReadsItsJSONL(t *testing.T) {
	type row struct {
		Image struct{ Bytes, Path string }
		Label int
	}
	want := readJSONL[row](t, "images.jsonl")
	for _, name := range []string{"images.duckdb.parquet", "images.arrow.parquet"} {
		imgs, err := open(t, name, "", "").Images()
		if err != nil {
			t.Fatal(err)
		}
		if imgs.Len() != len(want) || len(imgs.Classes()) != 10 || imgs.Classes()[0] != "airplane" || imgs.Classes()[9] != "truck" {
			t.Fatalf("%s: %d images, classes %v", name, imgs.Len(), imgs.Classes())
		}
		for i, w := range want {
			b, _ := base64.StdEncoding.DecodeString(w.Image.Bytes)
			if string(imgs.Bytes(i)) != string(b) || imgs.Label(i) != w.Label {
				t.Fatalf("%s row %d: %d bytes label %d; want %d bytes label %d", name, i, len(imgs.Bytes(i)), imgs.Label(i), len(b), w.Label)
			}
			img, err := imgs.Image(i)
			if err != nil || img.Bounds().Dx() != 32 {
				t.Fatalf("%s row %d: %v", name, i, err)
			}
		}
	}
}

func TestColumnsRename(t *testing.T) {
	// The text fixture read as "instruction"/"output" needs renames; and a text column under another name.
	d := open(t, "sst2.duckdb.parquet", "", "text=sentence")
	got, err := d.Texts()
	if err != nil || len(got) != 40 || got[0] == "" {
		t.Fatalf("text=sentence: %d texts, %v", len(got), err)
	}
	if _, err := open(t, "sst2.duckdb.parquet", "", "").Texts(); err == nil || !strings.Contains(err.Error(), "--columns text=COLUMN") {
		t.Fatalf("missing text column: %v", err)
	}
}

// TestJPEGBinaryImageColumn: JPEG bytes in a plain binary column (no struct) with int32 labels and no datasets
// metadata: the bytes of the JSONL, decoded, classes "0".."9".
func TestJPEGBinaryImageColumn(t *testing.T) {
	want := readJSONL[struct {
		Image string
		Label int
	}](t, "images-jpeg.jsonl")
	imgs, err := open(t, "images-jpeg.duckdb.parquet", "", "").Images()
	if err != nil {
		t.Fatal(err)
	}
	if imgs.Len() != len(want) || len(imgs.Classes()) != 10 || imgs.Classes()[3] != "3" {
		t.Fatalf("%d images, classes %v", imgs.Len(), imgs.Classes())
	}
	for i, w := range want {
		b, _ := base64.StdEncoding.DecodeString(w.Image)
		if string(imgs.Bytes(i)) != string(b) || imgs.Label(i) != w.Label || b[0] != 0xff || b[1] != 0xd8 {
			t.Fatalf("row %d: %d bytes label %d; want %d JPEG bytes label %d", i, len(imgs.Bytes(i)), imgs.Label(i), len(b), w.Label)
		}
		if img, err := imgs.Image(i); err != nil || img.Bounds().Dx() != 32 {
			t.Fatalf("row %d: %v", i, err)
		}
	}
}

// TestConversationsParquetChecked: a conversation row the chat trainer cannot learn from (an unknown role, no
// assistant turn) is refused naming the file and its row (0-based, as hfdata counts rows), as the JSONL reader names the line.
func TestConversationsParquetChecked(t *testing.T) {
	type msg struct {
		Role    string `parquet:"role"`
		Content string `parquet:"content"`
	}
	type convRow struct {
		Messages []msg `parquet:"messages,list"`
	}
	for _, tc := range []struct {
		bad  []msg
		want string
	}{
		{[]msg{{"user", "hi"}, {"bot", "hello"}}, `role "bot"`},
		{[]msg{{"system", "be brief"}, {"user", "hi"}}, "no assistant turn"},
	} {
		path := filepath.Join(t.TempDir(), "chat.parquet")
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		w := parquet.NewGenericWriter[convRow](f)
		good := convRow{Messages: []msg{{"user", "hi"}, {"assistant", "hello"}}}
		if _, err := w.Write([]convRow{good, good, {Messages: tc.bad}}); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		f.Close()
		ds, err := Open(path, "", "")
		if err != nil {
			t.Fatal(err)
		}
		_, err = ds.Conversations()
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "row 2:") {
			t.Errorf("bad conversation in the third row: got %v, want an error naming row 2 (0-based) and %q", err, tc.want)
		}
	}
}
