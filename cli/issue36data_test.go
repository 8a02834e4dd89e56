package cli_test

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"

	"github.com/memfit/memfit/internal/golden"
)

// Issue 36, the data half: the probe's (../shared/notes/probe-2026-11-27.md) parquet, hub-folder, conversation and
// validation-data cases, each by its id. Every refusal is one line on stderr naming the cause, a non-zero exit,
// and no output folder.

// refused36 runs args and checks that train refused them with exactly one line holding want, and wrote nothing
// at out.
func refused36(t *testing.T, out string, args []string, want string) {
	t.Helper()
	_, stderr, code := run(t, args...)
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	last := lines[len(lines)-1]
	if code == 0 || len(lines) != 1 || !strings.HasPrefix(last, "finetune: ") || !strings.Contains(last, want) {
		t.Errorf("%v: exit %d, %d line(s), last %q; want a non-zero exit and one line naming %q", args, code, len(lines), last, want)
	}
	for _, bad := range []string{"panic", "goroutine ", "runtime error", ".go:", "Go value", "of type ", "<nil>"} {
		if strings.Contains(stderr, bad) {
			t.Errorf("%v: %q in the output:\n%s", args, bad, stderr)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("%v: %s was written", args, out)
		os.RemoveAll(out)
	}
}

// probe36 is the folder of the probe's DuckDB-written fixtures (tools/parquet-fixtures/make.mjs).
func probe36(name string) string { return filepath.Join(hfTestdata, "probe", name) }

// TestProbe36MapColumns (pq22, pq24, pq25, mp01, mp02, mp04, mp05): a MAP column (as DuckDB writes one) under each
// name memfit type-checks, through --columns and through --eval-data, is refused naming its type; before, each
// killed the process with a stack overflow.
func TestProbe36MapColumns(t *testing.T) {
	tmp := t.TempDir()
	llama := filepath.Join("..", "pretrained", "llama-tiny")
	cls := filepath.Join(tmp, "cls")
	mustRun(t, "init", "--from", llama, "--num-labels", "2", "--out", cls)
	vit := filepath.Join(tmp, "vit")
	mustRun(t, "init", "--arch", "vit", "--preset", "tiny", "--num-labels", "2", "--out", vit)
	out := filepath.Join(tmp, "run")
	train := func(model string, more ...string) []string {
		return append([]string{"train", "--model", model, "--out", out, "--steps", "1", "--batch-size", "2", "--seq-len", "64"}, more...)
	}
	m := probe36("map.parquet")
	for _, c := range []struct {
		args []string
		want string
	}{
		{train(llama, "--data", m, "--columns", "text=m"), `map.parquet: column "m" is map<string, string>, but memfit reads text as a string`},
		{train(llama, "--data", m, "--columns", "messages=m"), `map.parquet: column "m" is map<string, string>, but memfit reads messages as a list of struct{role, content}`},
		{train(llama, "--data", m, "--columns", "instruction=m,output=sentence"), `map.parquet: column "m" is map<string, string>, but memfit reads instruction as a string`},
		{train(cls, "--data", m, "--task", "sst2", "--columns", "label=m"), `map.parquet: column "m" is map<string, string>, but memfit reads label as an integer`},
		{train(vit, "--data", m, "--columns", "image=m"), `map.parquet: column "m" is map<string, string>, but memfit reads image as an image`},
		{train(llama, "--data", filepath.Join(hfTestdata, "text.duckdb.parquet"), "--eval-data", probe36("map-text.parquet")), `map-text.parquet: column "text" is map<string, string>, but memfit reads text as a string`},
	} {
		refused36(t, out, c.args, c.want)
	}
}

// hubLayout copies the fixture src to each relative path under a new folder and returns the folder.
func hubLayout(t *testing.T, src string, paths ...string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	for _, p := range paths {
		os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755)
		if err := os.WriteFile(filepath.Join(root, p), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// examplesNoted returns the count of examples a train run's notes give ("N of M examples ...": M), or -1.
func examplesNoted(stderr string) int {
	for _, line := range strings.Split(stderr, "\n") {
		var n, m int
		if i := strings.Index(line, " examples are longer than"); i > 0 {
			head := line[:i]
			if j := strings.LastIndex(head, ": "); j >= 0 {
				if _, err := fmt.Sscanf(head[j+2:], "%d of %d", &n, &m); err == nil {
					return m
				}
			}
		}
	}
	return -1
}

// TestProbe36HubLayouts: a hub folder whose splits are in a config folder (plain_text/train-*, plain_text/test-*)
// trains on plain_text's train split alone, and --split plain_text is refused (hf09, hf18: it was offered as a
// split and then read train and test together); SPLIT.parquet, data/SPLIT.parquet and .PARQUET folders train
// (hf10, hf11, hf12: "no parquet files", "image data needs a ViT model"); a looping link is named (hf16).
func TestProbe36HubLayouts(t *testing.T) {
	tmp := t.TempDir()
	out := filepath.Join(tmp, "run")
	llama := filepath.Join("..", "pretrained", "llama-tiny")
	src := filepath.Join(hfTestdata, "alpaca.duckdb.parquet")
	train := func(data string, more ...string) []string {
		return append([]string{"train", "--model", llama, "--data", data, "--out", out, "--steps", "1", "--batch-size", "2", "--seq-len", "64"}, more...)
	}
	trains := func(args []string, note string) string {
		t.Helper()
		os.RemoveAll(out)
		_, stderr, code := run(t, args...)
		if code != 0 || !strings.Contains(stderr, note) {
			t.Errorf("%v: exit %d; want 0 and the note %q:\n%s", args[3:6], code, note, stderr)
		}
		return stderr
	}
	one := examplesNoted(trains(train(src), "read as Alpaca rows"))
	cfg := hubLayout(t, src, "plain_text/train-00000-of-00001.parquet", "plain_text/test-00000-of-00001.parquet")
	if got := examplesNoted(trains(train(cfg), cfg+" (config plain_text, split train): 1 parquet file(s): read as Alpaca rows")); got != one || one <= 0 {
		t.Errorf("config folder: %d examples, one file has %d (train and test mixed?)", got, one)
	}
	os.RemoveAll(out)
	refused36(t, out, train(cfg, "--split", "plain_text"), `"plain_text" is a config of this dataset (a folder of splits: test, train), not a split: read it with --data-config plain_text (and --split with one of its splits)`)
	// --data-config names a config folder: its test split, and several configs are named.
	os.RemoveAll(out)
	trains(train(cfg, "--data-config", "plain_text", "--split", "test"), cfg+" (config plain_text, split test): 1 parquet file(s): read as Alpaca rows")
	two := hubLayout(t, src, "cola/train-00000-of-00001.parquet", "sst2/train-00000-of-00001.parquet")
	os.RemoveAll(out)
	refused36(t, out, train(two), two+" holds several configs (cola, sst2), each a folder of splits: choose one, e.g. --data-config cola")
	for _, l := range []string{"train.parquet", "data/train.parquet", "data/train-00000-of-00001.PARQUET"} {
		root := hubLayout(t, src, l, strings.Replace(l, "train", "test", 1))
		trains(train(root), root+" (split train): 1 parquet file(s): read as Alpaca rows")
	}
	loop := t.TempDir()
	os.MkdirAll(filepath.Join(loop, "data"), 0o755)
	if err := os.Symlink("train", filepath.Join(loop, "data", "train")); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(out)
	refused36(t, out, train(loop), filepath.Join(loop, "data", "train")+" is a symbolic link that loops")
}

// imageRow is an image parquet row as `datasets` stores one: struct{bytes, path} and a nullable label.
type imageRow struct {
	Image struct {
		Bytes []byte `parquet:"bytes"`
		Path  string `parquet:"path"`
	} `parquet:"image"`
	Label *int64 `parquet:"label,optional"`
}

// fixtureImages returns the images of the fixture images.jsonl (CIFAR-10 PNGs, labels 0..9) as parquet rows.
func fixtureImages(t *testing.T) []imageRow {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(hfTestdata, "images.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var rows []imageRow
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var r struct {
			Image struct{ Bytes, Path string }
			Label int64
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		var row imageRow
		row.Image.Bytes, _ = base64.StdEncoding.DecodeString(r.Image.Bytes)
		row.Image.Path = r.Image.Path
		row.Label = &r.Label
		rows = append(rows, row)
	}
	return rows
}

// hugePNG returns the PNG png with its header declaring a width of 100000 pixels (its checksum made right).
func hugePNG(png []byte) []byte {
	out := bytes.Clone(png)
	ihdr := out[8+4 : 8+4+4+13] // after the signature and the IHDR chunk's length: its type and 13 bytes of data
	binary.BigEndian.PutUint32(ihdr[4:8], 100000)
	binary.BigEndian.PutUint32(out[8+4+4+13:], crc32.ChecksumIEEE(ihdr))
	return out
}

// TestProbe36Values: values the range checks let through, or named in Go's words, are refused before the first
// step with the row: a NaN STS-B score in parquet and in the GLUE TSV (gl_stsb_nan, gl_stsb_nan2, gl_tsv_nan: the
// run failed at a later step blaming the learning rate), ClassLabel metadata that names fewer classes than the
// labels reach or is not JSON (img_meta3, img_badmeta: dropped silently), null and huge labels (img_label_null,
// gl_sst2_label_null: "label <nil>"; img_label_int32max, img_label_int64big: "0 or more"), undecodable images and a
// text column named image (img_all_bad, img_trunc_png, img_huge_dims, img_string_col: found at step 1), rows all
// of another status (pq11).
func TestProbe36Values(t *testing.T) {
	tmp := t.TempDir()
	out := filepath.Join(tmp, "run")
	llama := filepath.Join("..", "pretrained", "llama-tiny")
	cls1, cls2, vit := filepath.Join(tmp, "cls1"), filepath.Join(tmp, "cls2"), filepath.Join(tmp, "vit")
	mustRun(t, "init", "--from", llama, "--num-labels", "1", "--out", cls1)
	mustRun(t, "init", "--from", llama, "--num-labels", "2", "--out", cls2)
	mustRun(t, "init", "--arch", "vit", "--preset", "tiny", "--num-labels", "10", "--out", vit)
	type stsbRow struct {
		Sentence1 string  `parquet:"sentence1"`
		Sentence2 string  `parquet:"sentence2"`
		Label     float64 `parquet:"label"`
	}
	stsb := make([]stsbRow, 12)
	for i := range stsb {
		stsb[i] = stsbRow{"a man is playing a guitar", "a man plays the guitar", 2.5}
	}
	stsb[3].Label = math.NaN()
	stsbNaN := filepath.Join(tmp, "stsb-nan.parquet")
	if err := parquet.WriteFile(stsbNaN, stsb); err != nil {
		t.Fatal(err)
	}
	tsv, _ := os.ReadFile(filepath.Join(golden.SharedDir(t), "glue", "STS-B", "train.tsv"))
	tsvLines := strings.SplitN(string(tsv), "\n", 14)[:13]
	cols := strings.Split(tsvLines[4], "\t")
	cols[len(cols)-1] = "nan"
	tsvLines[4] = strings.Join(cols, "\t")
	os.MkdirAll(filepath.Join(tmp, "glue", "STS-B"), 0o755)
	os.WriteFile(filepath.Join(tmp, "glue", "STS-B", "train.tsv"), []byte(strings.Join(tsvLines, "\n")+"\n"), 0o644)

	type sstRow struct {
		Sentence string `parquet:"sentence"`
		Label    *int64 `parquet:"label,optional"`
	}
	one := int64(1)
	sst := []sstRow{{"a fine film", &one}, {"dull", &one}, {"no label", nil}, {"fine", &one}}
	sstNull := filepath.Join(tmp, "sst2-null.parquet")
	if err := parquet.WriteFile(sstNull, sst); err != nil {
		t.Fatal(err)
	}

	images := func(name string, edit func(rows []imageRow), opts ...parquet.WriterOption) string {
		rows := fixtureImages(t)
		edit(rows)
		p := filepath.Join(tmp, name)
		f, err := os.Create(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := parquet.Write(f, rows, opts...); err != nil {
			t.Fatal(err)
		}
		f.Close()
		return p
	}
	meta := func(v string) parquet.WriterOption { return parquet.KeyValueMetadata("huggingface", v) }
	meta3 := images("meta3.parquet", func([]imageRow) {}, meta(`{"info":{"features":{"image":{"_type":"Image"},"label":{"names":["a","b","c"],"_type":"ClassLabel"}}}}`))
	badMeta := images("badmeta.parquet", func([]imageRow) {}, meta(`{"info": {"features": `))
	labelNull := images("label-null.parquet", func(r []imageRow) { r[6].Label = nil })
	big32, big64 := int64(math.MaxInt32), int64(math.MaxInt64)
	label32 := images("label-int32max.parquet", func(r []imageRow) { r[6].Label = &big32 })
	label64 := images("label-int64big.parquet", func(r []imageRow) { r[6].Label = &big64 })
	allBad := images("all-bad.parquet", func(r []imageRow) {
		for i := range r {
			r[i].Image.Bytes = []byte("notanimage")
		}
	})
	truncated := images("truncated.parquet", func(r []imageRow) {
		for i := range r {
			r[i].Image.Bytes = r[i].Image.Bytes[:len(r[i].Image.Bytes)/2] // the header intact, the pixels cut
		}
	})
	huge := images("huge.parquet", func(r []imageRow) { r[5].Image.Bytes = hugePNG(r[5].Image.Bytes) })
	type textImageRow struct {
		Image string `parquet:"image"`
		Label int64  `parquet:"label"`
	}
	stringImage := filepath.Join(tmp, "string-image.parquet")
	if err := parquet.WriteFile(stringImage, []textImageRow{{"abc", 0}, {"abc", 1}, {"abc", 2}}); err != nil {
		t.Fatal(err)
	}
	type alpacaRow struct {
		Instruction string `parquet:"instruction"`
		Output      string `parquet:"output"`
		Status      string `parquet:"status"`
	}
	rejected := filepath.Join(tmp, "rejected.parquet")
	if err := parquet.WriteFile(rejected, []alpacaRow{{"say hi", "hi", "bad"}, {"say yo", "yo", "duplicate"}, {"a", "b", "bad"}}); err != nil {
		t.Fatal(err)
	}

	train := func(model, data string, more ...string) []string {
		return append([]string{"train", "--model", model, "--data", data, "--out", out, "--steps", "1", "--batch-size", "2", "--seq-len", "32"}, more...)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{train(cls1, stsbNaN, "--task", "stsb"), `stsb-nan.parquet: row 3: score NaN is not a number in [0, 5]`},
		{train(cls1, filepath.Join(tmp, "glue"), "--task", "stsb", "--data-format", "glue"), `train.tsv:5: score "nan" is not a number in [0, 5]`},
		{train(cls2, sstNull, "--task", "sst2"), `sst2-null.parquet: row 2: the label is null (an unlabelled row)`},
		{train(vit, meta3), `meta3.parquet: the file's ClassLabel metadata (written by datasets) names 3 classes (a, b, c) but the labels reach 9`},
		{train(vit, badMeta), `badmeta.parquet: its "huggingface" metadata (the features ` + "`datasets`" + ` writes, with the class names) is not JSON`},
		{train(vit, labelNull), `label-null.parquet: row 6: the label is null (an unlabelled row)`},
		{train(vit, label32), `label-int32max.parquet: row 6: label 2147483647 is not a class index of an image classifier (memfit reads up to 1048576 classes)`},
		{train(vit, label64), `label-int64big.parquet: row 6: label 9223372036854775807 is not a class index of an image classifier`},
		{train(vit, allBad), `all-bad.parquet: row 0: not a decodable image (text, not PNG or JPEG bytes`},
		{train(vit, truncated), `truncated.parquet: row 0: not a decodable image: png: invalid format: not enough pixel data`},
		{train(vit, huge), `huge.parquet: row 5: a 100000x32 image: memfit reads images of 1 to`},
		{train(vit, stringImage), `string-image.parquet: column "image" is string, but memfit reads image as an image struct{bytes, path} (as datasets stores it) or binary`},
		{train(llama, rejected), `rejected.parquet: no usable rows: all 3 rows have a "status" other than "ok"`},
	} {
		refused36(t, out, c.args, c.want)
	}
}

// TestProbe36Conversations: parquet conversations' errors speak the user's own form and name the row (col14, col17:
// ShareGPT's "from" was reported as an OpenAI role; pm_msg_user_last: "file.parquet:0:", a line number, for a row);
// a JSONL row with a key given twice is refused (cv_dup_key_messages, cv_dup_key_content).
func TestProbe36Conversations(t *testing.T) {
	tmp := t.TempDir()
	out := filepath.Join(tmp, "run")
	llama := filepath.Join("..", "pretrained", "llama-tiny")
	type turn struct {
		From  string `parquet:"from"`
		Value string `parquet:"value"`
	}
	type shareRow struct {
		Conversations []turn `parquet:"conversations,list"`
	}
	good := shareRow{[]turn{{"human", "hi"}, {"gpt", "hello"}}}
	bard := filepath.Join(tmp, "bard.parquet")
	if err := parquet.WriteFile(bard, []shareRow{good, {[]turn{{"human", "hi"}, {"bard", "hello"}}}}); err != nil {
		t.Fatal(err)
	}
	tool := filepath.Join(tmp, "function-call.parquet")
	if err := parquet.WriteFile(tool, []shareRow{good, good, {[]turn{{"human", "hi"}, {"function_call", "{}"}, {"gpt", "hello"}}}}); err != nil {
		t.Fatal(err)
	}
	type msg struct {
		Role    string `parquet:"role"`
		Content string `parquet:"content"`
	}
	type msgRow struct {
		Messages []msg `parquet:"messages,list"`
	}
	userLast := filepath.Join(tmp, "user-last.parquet")
	ok := msgRow{[]msg{{"user", "hi"}, {"assistant", "hello"}}}
	if err := parquet.WriteFile(userLast, []msgRow{ok, ok, {[]msg{{"user", "hi"}, {"assistant", "yo"}, {"user", "x"}}}}); err != nil {
		t.Fatal(err)
	}
	dup := filepath.Join(tmp, "dup.jsonl")
	os.WriteFile(dup, []byte(`{"messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"}]}`+"\n"+
		`{"messages":[{"role":"user","content":"a","content":"b"},{"role":"assistant","content":"c"}]}`+"\n"), 0o644)
	train := func(data string, more ...string) []string {
		return append([]string{"train", "--model", llama, "--data", data, "--out", out, "--steps", "1", "--batch-size", "2", "--seq-len", "64"}, more...)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{train(bard, "--columns", "messages=conversations"), `bard.parquet: row 1: message 2: "from" "bard": use system, human or gpt`},
		{train(tool, "--columns", "messages=conversations"), `function-call.parquet: row 2: message 2: "from" "function_call": tool calls are not read`},
		{train(userLast), `user-last.parquet: row 2: the Alpaca template learns the reply that ends a conversation`},
		{train(dup), `dup.jsonl:2: key "content" is given twice in message 1: keep one`},
	} {
		refused36(t, out, c.args, c.want)
	}
}

// TestProbe36EmptyReplies: an example with an empty reply is handled the same in every format: an Alpaca row with
// an empty output and a conversation with an empty assistant message, JSONL or parquet, are left out and counted
// (before, the conversation refused the whole file while the same row trained in Alpaca form on EOS alone); an
// empty prompt (an Alpaca row with no instruction or input, a conversation's empty user message) is refused in
// every format (pq06, pq06j, ev21: all-empty Alpaca rows trained, also as --eval-data).
func TestProbe36EmptyReplies(t *testing.T) {
	tmp := t.TempDir()
	out := filepath.Join(tmp, "run")
	llama := filepath.Join("..", "pretrained", "llama-tiny")
	type alpacaRow struct {
		Instruction string `parquet:"instruction" json:"instruction"`
		Input       string `parquet:"input" json:"input"`
		Output      string `parquet:"output" json:"output"`
	}
	type msg struct {
		Role    string `parquet:"role" json:"role"`
		Content string `parquet:"content" json:"content"`
	}
	type msgRow struct {
		Messages []msg `parquet:"messages,list" json:"messages"`
	}
	rows := []alpacaRow{{"Say hi.", "", "Hi."}, {"Name a colour.", "", "Blue."}, {"Count to three.", "", ""}, {"Add.", "2+2", "4"}, {"Say no.", "", " "}}
	var convs []msgRow
	for _, r := range rows {
		user := r.Instruction
		if r.Input != "" {
			user += "\n\n" + r.Input
		}
		convs = append(convs, msgRow{[]msg{{"user", user}, {"assistant", r.Output}}})
	}
	jsonl := func(name string, xs any) string {
		var b strings.Builder
		switch v := xs.(type) {
		case []alpacaRow:
			for _, x := range v {
				j, _ := json.Marshal(x)
				b.Write(append(j, '\n'))
			}
		case []msgRow:
			for _, x := range v {
				j, _ := json.Marshal(x)
				b.Write(append(j, '\n'))
			}
		}
		p := filepath.Join(tmp, name)
		os.WriteFile(p, []byte(b.String()), 0o644)
		return p
	}
	alpacaPQ, msgPQ := filepath.Join(tmp, "alpaca.parquet"), filepath.Join(tmp, "messages.parquet")
	if err := parquet.WriteFile(alpacaPQ, rows); err != nil {
		t.Fatal(err)
	}
	if err := parquet.WriteFile(msgPQ, convs); err != nil {
		t.Fatal(err)
	}
	train := func(data string, more ...string) []string {
		return append([]string{"train", "--model", llama, "--data", data, "--out", out, "--steps", "1", "--batch-size", "2", "--seq-len", "64"}, more...)
	}
	for _, data := range []string{jsonl("alpaca.jsonl", rows), jsonl("messages.jsonl", convs), alpacaPQ, msgPQ} {
		os.RemoveAll(out)
		_, stderr, code := run(t, train(data)...)
		want := data + ": 2 of 5 examples have an empty reply (an empty output or assistant message) and were left out"
		if code != 0 || !strings.Contains(stderr, want) {
			t.Errorf("%s: exit %d; want 0 and the note %q:\n%s", filepath.Base(data), code, want, stderr)
		}
	}
	os.RemoveAll(out)
	allEmpty := jsonl("all-empty.jsonl", []alpacaRow{{"a", "", ""}, {"b", "", " "}})
	emptyPrompt := []alpacaRow{{"Say hi.", "", "Hi."}, {"", "", ""}, {"Say yo.", "", "Yo."}}
	emptyPQ := filepath.Join(tmp, "empty-prompt.parquet")
	if err := parquet.WriteFile(emptyPQ, emptyPrompt); err != nil {
		t.Fatal(err)
	}
	good := jsonl("good.jsonl", rows[:2])
	for _, c := range []struct {
		args []string
		want string
	}{
		{train(allEmpty), `all-empty.jsonl: every example (2) has an empty reply (an empty output or assistant message): there is nothing to learn`},
		{train(jsonl("empty-prompt.jsonl", emptyPrompt)), `empty-prompt.jsonl:2: the instruction is empty (and so is the input): an Alpaca row needs an instruction, as a conversation needs a user message`},
		{train(emptyPQ), `empty-prompt.parquet: row 1: the instruction is empty (and so is the input)`},
		{train(good, "--eval-data", emptyPQ), `empty-prompt.parquet: row 1: the instruction is empty (and so is the input)`},
		{train(jsonl("empty-user.jsonl", []msgRow{convs[0], {[]msg{{"user", " "}, {"assistant", "Hi."}}}})), `empty-user.jsonl:2: message 1 (user) has empty content`},
	} {
		refused36(t, out, c.args, c.want)
	}
}

// TestProbe36OptionsRefused: options that do not apply to the data were accepted and ignored (pk06: --packing on
// image parquet; col07, col09, col10, mp03: --columns naming a missing column, or one the data kind does not read;
// hf27, hf28: --columns and --split on JSONL); each is now refused naming it.
func TestProbe36OptionsRefused(t *testing.T) {
	tmp := t.TempDir()
	out := filepath.Join(tmp, "run")
	llama := filepath.Join("..", "pretrained", "llama-tiny")
	vit := filepath.Join(tmp, "vit")
	mustRun(t, "init", "--arch", "vit", "--preset", "tiny", "--num-labels", "10", "--out", vit)
	alpaca, jsonl := filepath.Join(hfTestdata, "alpaca.duckdb.parquet"), filepath.Join(hfTestdata, "alpaca.jsonl")
	train := func(model, data string, more ...string) []string {
		return append([]string{"train", "--model", model, "--data", data, "--out", out, "--steps", "1", "--batch-size", "2", "--seq-len", "64"}, more...)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{train(vit, filepath.Join(hfTestdata, "images.duckdb.parquet"), "--packing"), `--packing packs instruction and conversation examples (alpaca, messages data), not image data`},
		{train(vit, filepath.Join(hfTestdata, "images.duckdb.parquet"), "--chat-template", "chatml"), `--chat-template renders conversations (messages data), not image data`},
		{train(llama, alpaca, "--columns", "text=nosuch"), `alpaca.duckdb.parquet: --columns text=nosuch: the file has no column "nosuch" (it has "instruction", "input", "output", "status")`},
		{train(llama, alpaca, "--columns", "input=nosuch"), `alpaca.duckdb.parquet: --columns input=nosuch: the file has no column "nosuch"`},
		{train(llama, alpaca, "--columns", "text=output"), `--columns text=output: ` + abs(alpaca) + ` is read for the columns instruction, input, output, status; memfit reads no "text" column from it: leave that rename out`},
		{train(llama, alpaca, "--columns", "label=output"), `--columns label=output: ` + abs(alpaca) + ` is read for the columns instruction, input, output, status; memfit reads no "label" column`},
		{train(llama, probe36("map.parquet"), "--columns", "instruction=sentence,output=sentence,text=m"), `memfit reads no "text" column`},
		{train(llama, jsonl, "--columns", "output=instruction"), `--columns renames the columns of parquet data, but ` + abs(jsonl) + ` is alpaca data: leave it out`},
		{train(llama, jsonl, "--split", "train"), `--split picks a split of an image folder or tar, GLUE data or a parquet dataset folder, but ` + abs(jsonl) + ` is alpaca data, one file: leave it out`},
	} {
		refused36(t, out, c.args, c.want)
	}
}

// TestProbe36Validation: validation data read from the same hub folder or GLUE folder as the training data takes
// its validation (or test, dev) split, not the training split (ev23: --eval-data-split defaulted to --split);
// validating on the training data itself is noted (ev10); the validation set's notes (examples cut or left out by
// --seq-len) are printed as the training data's are (ev16); a split flag is named as given (ev24).
func TestProbe36Validation(t *testing.T) {
	tmp := t.TempDir()
	out := filepath.Join(tmp, "run")
	llama := filepath.Join("..", "pretrained", "llama-tiny")
	hub := filepath.Join(hfTestdata, "hub-alpaca")
	train := func(model, data string, more ...string) []string {
		return append([]string{"train", "--model", model, "--data", data, "--out", out, "--steps", "1", "--batch-size", "2", "--seq-len", "256"}, more...)
	}
	trains := func(args []string, notes ...string) []map[string]any {
		t.Helper()
		os.RemoveAll(out)
		_, stderr, code := run(t, args...)
		if code != 0 {
			t.Fatalf("%v: exit %d:\n%s", args, code, stderr)
		}
		for _, n := range notes {
			if !strings.Contains(stderr, n) {
				t.Errorf("%v: no note %q:\n%s", args[3:6], n, stderr)
			}
		}
		return readMetrics(t, filepath.Join(out, "metrics.jsonl"))
	}
	evalExamples := func(m []map[string]any) float64 {
		for _, e := range m {
			if e["kind"] == "eval" {
				return e["eval_examples"].(float64)
			}
		}
		return -1
	}
	m := trains(train(llama, hub, "--eval-data", hub), "validation set: "+abs(hub)+" (split test): 1 parquet file(s): read as Alpaca rows")
	if n := evalExamples(m); n <= 0 || n > 8 {
		t.Errorf("--data HUB --eval-data HUB evaluated %v examples; the test split has 8 rows (the train split 40)", n)
	}
	jsonl := filepath.Join(hfTestdata, "alpaca.jsonl")
	trains(train(llama, jsonl, "--eval-data", jsonl, "--seq-len", "64"),
		"validation set: --eval-data "+abs(jsonl)+" is the training data itself",
		"validation set: "+abs(jsonl)+": 22 of 22 examples are longer than --seq-len 64 and were cut on the right",
		"validation set: "+abs(jsonl)+": 18 examples have no response token within --seq-len 64 and were left out")
	// GLUE: the dev split, as eval glue reads it.
	cls := filepath.Join(tmp, "cls")
	mustRun(t, "init", "--from", llama, "--num-labels", "2", "--out", cls)
	sst := filepath.Join(tmp, "glue", "SST-2")
	os.MkdirAll(sst, 0o755)
	tsv, err := os.ReadFile(filepath.Join(golden.SharedDir(t), "glue", "SST-2", "train.tsv"))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(tsv), "\n")
	os.WriteFile(filepath.Join(sst, "train.tsv"), []byte(strings.Join(lines[:11], "\n")+"\n"), 0o644)
	os.WriteFile(filepath.Join(sst, "dev.tsv"), []byte(strings.Join(append(lines[:1], lines[11:17]...), "\n")+"\n"), 0o644)
	if n := evalExamples(trains(train(cls, sst, "--eval-data", sst, "--seq-len", "32"))); n != 6 {
		t.Errorf("--data SST-2 --eval-data SST-2 evaluated %v examples; its dev split has 6 (train 10)", n)
	}
	os.RemoveAll(out)
	refused36(t, out, train(llama, jsonl, "--eval-data", filepath.Join(hfTestdata, "alpaca.duckdb.parquet"), "--eval-data-split", "test"),
		"--eval-data-split test picks the files of a dataset folder, but "+abs(filepath.Join(hfTestdata, "alpaca.duckdb.parquet"))+" is one parquet file: leave --eval-data-split out")
}

// TestProbe36GLUEFolder (section 6): a GLUE task folder given to train is GLUE data, recognised as eval glue
// recognises it; with a causal LM the message says how to make a classifier (it was "image data (images) needs a
// ViT model"); the GLUE root without --task asks for it (it said unknown GLUE task "").
func TestProbe36GLUEFolder(t *testing.T) {
	tmp := t.TempDir()
	out := filepath.Join(tmp, "run")
	llama := filepath.Join("..", "pretrained", "llama-tiny")
	sst := filepath.Join(golden.SharedDir(t), "glue", "SST-2")
	refused36(t, out, []string{"train", "--model", llama, "--data", sst, "--out", out, "--steps", "1"},
		"is GLUE sst2 data, which trains a sequence classifier, but the model is a causal LM: give it a classification head with finetune init --from "+abs(llama)+" --num-labels 2 --out NEW")
	cls := filepath.Join(tmp, "cls")
	mustRun(t, "init", "--from", llama, "--num-labels", "2", "--out", cls)
	refused36(t, out, []string{"train", "--model", cls, "--data", filepath.Dir(sst), "--out", out, "--steps", "1"},
		"GLUE data needs its task: name it with --task (cola, sst2, mrpc, stsb, rte), or give the task's folder (e.g. glue/SST-2)")
}

// TestProbe36HubValidationSplit (ev23 through the Hub): --data and --eval-data naming the same Hub dataset download
// and validate on its test split, not the training split.
func TestProbe36HubValidationSplit(t *testing.T) {
	hub, _ := standIn(t)
	files := map[string][]byte{}
	for _, name := range []string{"train-00000-of-00002.parquet", "train-00001-of-00002.parquet", "test-00000-of-00001.parquet"} {
		files["data/"+name] = mustRead(t, filepath.Join(hfTestdata, "hub-alpaca", "data", name))
	}
	hub.Add("dataset", "memfit-test/alpaca-splits", files)
	out := filepath.Join(t.TempDir(), "run")
	url := "hf://datasets/memfit-test/alpaca-splits"
	_, stderr, code := run(t, "train", "--model", filepath.Join("..", "pretrained", "llama-tiny"), "--data", url, "--eval-data", url,
		"--out", out, "--steps", "1", "--batch-size", "2", "--seq-len", "256")
	if code != 0 || !strings.Contains(stderr, "note: validation set: ") || !strings.Contains(stderr, "(split test): 1 parquet file(s)") {
		t.Fatalf("exit %d; want the validation set read from the test split:\n%s", code, stderr)
	}
	for _, m := range readMetrics(t, filepath.Join(out, "metrics.jsonl")) {
		if m["kind"] == "eval" && (m["eval_examples"].(float64) <= 0 || m["eval_examples"].(float64) > 8) {
			t.Errorf("evaluated %v examples; the test split has 8 rows (train 40)", m["eval_examples"])
		}
	}
}
