package hfdata

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"
)

// Issue 36 (probe cases pq22, pq24, pq25, mp01-mp05): a column whose values are lists or maps under a name memfit
// type-checks made describe and listElement recurse forever (a repeated node was its own list element) and the
// process die of a stack overflow. Each is now refused with one line naming the column and its type.

// writeSchema writes a parquet file of schema with rows (none: a file to type-check only).
func writeSchema(t *testing.T, schema *parquet.Schema, rows ...parquet.Row) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "nested.parquet")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := parquet.NewWriter(f, schema)
	if _, err := w.WriteRows(rows); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return path
}

func TestDescribeNestedTypes(t *testing.T) {
	msg := parquet.Group{"role": parquet.String(), "content": parquet.String()}
	for _, tc := range []struct {
		node parquet.Node
		want string
	}{
		{parquet.Repeated(parquet.String()), "list<string>"},
		{parquet.Repeated(msg), "list<struct{content: string, role: string}>"},
		{parquet.Optional(parquet.Group{"array": parquet.Repeated(parquet.Leaf(parquet.Int64Type))}), "list<int64>"},
		{parquet.Optional(parquet.Group{"array": parquet.Repeated(parquet.Group{"array": parquet.Repeated(parquet.String())})}), "list<list<string>>"},
		{parquet.List(parquet.String()), "list<string>"},
		{parquet.List(msg), "list<struct{content: string, role: string}>"},
		{parquet.Map(parquet.String(), parquet.Leaf(parquet.Int64Type)), "map<string, int64>"},
		{parquet.Repeated(parquet.Map(parquet.String(), parquet.String())), "list<map<string, string>>"},
	} {
		if got := describe(tc.node); got != tc.want {
			t.Errorf("describe: %q, want %q", got, tc.want)
		}
	}
}

// reader reads a dataset as one kind, with the --columns rename that reads column x as that kind.
type reader struct {
	cols string
	read func(d *Dataset) error
}

func TestNestedColumnsRefusedNotRecursed(t *testing.T) {
	msg := parquet.Group{"role": parquet.String(), "content": parquet.String()}
	texts := reader{"text=x", func(d *Dataset) error { _, err := d.Texts(); return err }}
	convs := reader{"messages=x", func(d *Dataset) error { _, err := d.Conversations(); return err }}
	images := reader{"image=x", func(d *Dataset) error { _, err := d.Images(); return err }}
	for _, tc := range []struct {
		col  parquet.Node
		read reader
		want string
	}{
		// A repeated leaf (a 2-level list) and a repeated group read as text: each recursed forever before.
		{parquet.Repeated(parquet.String()), texts, `column "x" is list<string>, but memfit reads text as a string`},
		{parquet.Repeated(msg), texts, `column "x" is list<struct{content: string, role: string}>, but memfit reads text as a string`},
		{parquet.Map(parquet.String(), parquet.String()), texts, `column "x" is map<string, string>, but memfit reads text`},
		{parquet.Map(parquet.String(), parquet.String()), convs, `column "x" is map<string, string>, but memfit reads messages as a list of struct{role, content}`},
		{parquet.Map(parquet.String(), parquet.Leaf(parquet.Int64Type)), images, `column "x" is map<string, int64>, but memfit reads image as an image`},
		// A list of lists of messages is not a conversation.
		{parquet.Optional(parquet.Group{"array": parquet.Repeated(parquet.Group{"array": parquet.Repeated(msg)})}), convs,
			`column "x" is list<list<struct{content: string, role: string}>>, but memfit reads messages`},
		// A message field of another type is named.
		{parquet.List(parquet.Group{"role": parquet.String(), "content": parquet.Int(32)}), convs,
			`column "x" is list<struct{content: int32, role: string}>: its messages' "content" is int32, but memfit reads a message's content as a string`},
	} {
		path := writeSchema(t, parquet.NewSchema("row", parquet.Group{"x": tc.col, "label": parquet.Leaf(parquet.Int64Type)}))
		d, err := Open(path, "", tc.read.cols)
		if err != nil {
			t.Fatal(err)
		}
		if err := tc.read.read(d); err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v; want one line naming %q", describe(tc.col), err, tc.want)
		}
	}
}

// TestTwoLevelMessagesRead: conversations in the legacy 2-level form (a repeated group of role and content, as
// parquet-go writes a Go slice without the list tag) read as the 3-level LIST form does.
func TestTwoLevelMessagesRead(t *testing.T) {
	type msg struct {
		Role    string `parquet:"role"`
		Content string `parquet:"content"`
	}
	type row struct {
		Messages []msg `parquet:"messages"`
	}
	path := filepath.Join(t.TempDir(), "two-level.parquet")
	rows := []row{{[]msg{{"user", "hi"}, {"assistant", "hello"}}}, {[]msg{{"system", "be brief"}, {"user", "2+2?"}, {"assistant", "4"}}}}
	if err := parquet.WriteFile(path, rows); err != nil {
		t.Fatal(err)
	}
	f, err := openFile(path)
	if err != nil {
		t.Fatal(err)
	}
	top, _ := field(f.pf.Schema(), "messages")
	f.Close()
	if !top.Repeated() {
		t.Fatalf("the fixture's messages column is %s, not a repeated group", describe(top))
	}
	d, err := Open(path, "", "")
	if err != nil {
		t.Fatal(err)
	}
	convs, err := d.Conversations()
	if err != nil {
		t.Fatal(err)
	}
	got := messagesOf(convs)
	if convs[1].Where != path+": row 1" {
		t.Errorf("the second conversation is named %q", convs[1].Where)
	}
	var want [][]Message
	for _, r := range rows {
		var c []Message
		for _, m := range r.Messages {
			c = append(c, Message{Role: m.Role, Content: m.Content})
		}
		want = append(want, c)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

// TestNumberColumnOfAGroupRefused: a number column (STS-B's score) that is a struct is refused naming its type;
// reading its physical kind panicked before ("cannot call Kind on parquet group"), as a leaf annotated MAP did
// (FuzzParquet's testdata/fuzz/FuzzParquet/94a08464a04595e4).
func TestNumberColumnOfAGroupRefused(t *testing.T) {
	path := writeSchema(t, parquet.NewSchema("row", parquet.Group{"sentence1": parquet.String(), "sentence2": parquet.String(),
		"label": parquet.Group{"score": parquet.Leaf(parquet.DoubleType)}}))
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pf, err := openReaderAt(path, bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	d := &Dataset{Path: path, Files: []string{path}}
	specs := []spec{{name: "sentence1", kind: kString}, {name: "sentence2", kind: kString}, {name: "label", kind: kNumber}}
	_, err = d.eachOfFile(&file{path: path, pf: pf}, specs, func(string, row) error { return nil })
	if err == nil || !strings.Contains(err.Error(), `"label" is struct{score: double}`) || strings.Contains(err.Error(), "\n") {
		t.Errorf("a struct label: %v; want one line naming its type", err)
	}
}
