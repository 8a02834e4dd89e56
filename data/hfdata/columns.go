package hfdata

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/deprecated"
	"github.com/parquet-go/parquet-go/format"

	"github.com/memfit/memfit/data"
)

// kind is the type memfit needs of a column.
type kind int

const (
	kString   kind = iota // a string (BYTE_ARRAY)
	kInt                  // an integer (INT32, INT64)
	kNumber               // a number (FLOAT, DOUBLE, or an integer)
	kImage                // struct{bytes, path} as `datasets` stores an Image feature, or plain bytes
	kMessages             // list of struct{role, content}, or ShareGPT's struct{from, value}
	kText                 // a string or a list of messages (a preference pair's prompt and completions)
)

func (k kind) String() string {
	return [...]string{"a string", "an integer", "a number", "an image struct{bytes, path} (as datasets stores it) or binary", "a list of struct{role, content} (or ShareGPT's struct{from, value})", "a string or a list of struct{role, content}"}[k]
}

// spec is a column memfit reads: its name (before --columns renames), the type it needs, whether rows may lack
// it, and what it is for (in messages).
type spec struct {
	name     string
	kind     kind
	optional bool
	what     string
}

// leaf is a leaf column read for a spec.
type leaf struct {
	index    int // parquet column index
	maxDef   int
	listDef  int  // for messages: the definition level at which the list has an element
	shareGPT bool // for messages: roles are ShareGPT's (human, gpt)
	physical parquet.Kind
}

// resolved is a spec found in a file: its leaves (one; image: bytes and path (-1 when absent); messages: role
// and content), or none when an optional column is absent.
type resolved struct {
	spec   spec
	leaves []leaf
}

// Message is one turn of a conversation: its role (system, user, assistant, ...) and its text; the type the
// JSONL conversation reader and the chat trainer take (data.Message).
type Message = data.Message

// Image is an image as `datasets` stores it: its encoded bytes (PNG, JPEG) and the path it came from.
type Image struct {
	Bytes []byte
	Path  string
}

// describe names a node's type as messages show it: "string", "int64", "struct{bytes: binary, path: string}",
// "list<...>", "map<string, int64>". A repeated node is a list of its values (the legacy 2-level lists, and a
// repeated top-level field). Each call descends at least one schema level, so the recursion ends.
func describe(n parquet.Node) string {
	if n.Repeated() {
		return "list<" + describeValue(n) + ">"
	}
	return describeValue(n)
}

// describeValue names the type of one value of n, its repetition aside.
func describeValue(n parquet.Node) string {
	if n.Leaf() {
		t := n.Type()
		k, ok := leafKind(n)
		if !ok {
			return "a single value annotated " + t.String()
		}
		switch k {
		case parquet.ByteArray:
			if lt := t.LogicalType(); lt == nil || lt.Value == nil {
				return "binary"
			}
			return "string"
		case parquet.Boolean:
			return "bool"
		case parquet.Int32:
			return "int32"
		case parquet.Int64:
			return "int64"
		case parquet.Float:
			return "float"
		case parquet.Double:
			return "double"
		case parquet.FixedLenByteArray:
			return "fixed-size binary"
		case parquet.Int96:
			return "int96"
		}
		return t.String()
	}
	if k, v, ok := mapKeyValue(n); ok {
		return "map<" + describe(k) + ", " + describe(v) + ">"
	}
	if el, twoLevel, ok := listElement(n); ok {
		if twoLevel { // the repeated field is itself the element: its repetition is the list's
			return "list<" + describeValue(el) + ">"
		}
		return "list<" + describe(el) + ">"
	}
	var fields []string
	for _, f := range n.Fields() {
		fields = append(fields, f.Name()+": "+describe(f))
	}
	return "struct{" + strings.Join(fields, ", ") + "}"
}

// mapKeyValue returns the key and value of a MAP group (MAP > repeated key_value > key, value), by its logical
// type or its shape.
func mapKeyValue(n parquet.Node) (key, value parquet.Node, ok bool) {
	if n.Leaf() || len(n.Fields()) != 1 {
		return nil, nil, false
	}
	kv := n.Fields()[0]
	isMap := false
	if lt := n.Type().LogicalType(); lt != nil {
		_, isMap = lt.Value.(*format.MapType)
	}
	if ct := n.Type().ConvertedType(); ct != nil && (*ct == deprecated.Map || *ct == deprecated.MapKeyValue) {
		isMap = true
	}
	if kv.Leaf() || !kv.Repeated() || len(kv.Fields()) != 2 {
		return nil, nil, false
	}
	k, v := kv.Fields()[0], kv.Fields()[1]
	if !isMap && (k.Name() != "key" || v.Name() != "value") {
		return nil, nil, false
	}
	return k, v, true
}

// listElement returns the element of the list that one value of n holds: the element of the 3-level form (LIST >
// repeated group > element), or the repeated field itself in the 2-level forms (a repeated group of several
// fields, a repeated leaf, or a repeated group named "array" or "*_tuple"; twoLevel says so). It never returns
// n itself (a repeated n is a list of n's values: the caller sees that from n.Repeated()), so walking down by it
// ends.
func listElement(n parquet.Node) (el parquet.Node, twoLevel, ok bool) {
	if n.Leaf() {
		return nil, false, false
	}
	fields := n.Fields() // a LIST group, or (files before logical types) any group of one repeated field
	if len(fields) != 1 || !fields[0].Repeated() {
		return nil, false, false
	}
	rep := fields[0]
	if !rep.Leaf() && len(rep.Fields()) == 1 && rep.Name() != "array" && !strings.HasSuffix(rep.Name(), "_tuple") {
		return rep.Fields()[0], false, true
	}
	return rep, true, true
}

// leafKind returns the physical type of n; ok is false for a group, and for a leaf whose type parquet-go gives
// no physical kind: a MAP, LIST or VARIANT annotation on a leaf (only a damaged or hand-made file has one), whose
// Kind panics, as a group's does.
func leafKind(n parquet.Node) (k parquet.Kind, ok bool) {
	if !n.Leaf() {
		return 0, false
	}
	t := n.Type()
	if lt := t.LogicalType(); lt != nil {
		switch lt.Value.(type) {
		case *format.MapType, *format.ListType, *format.VariantType:
			return 0, false
		}
	}
	return t.Kind(), true
}

func isString(n parquet.Node) bool {
	k, ok := leafKind(n)
	return ok && k == parquet.ByteArray
}

// isBinary reports whether n holds bytes: a BYTE_ARRAY leaf that is not annotated as a string (text is not an
// encoded image).
func isBinary(n parquet.Node) bool {
	return isString(n) && describeValue(n) == "binary"
}

func isInt(n parquet.Node) bool {
	k, ok := leafKind(n)
	return ok && (k == parquet.Int32 || k == parquet.Int64)
}

func field(n parquet.Node, name string) (parquet.Field, bool) {
	for _, f := range n.Fields() {
		if f.Name() == name {
			return f, true
		}
	}
	return nil, false
}

// resolve finds the specs' columns in f and checks their types. A missing column (not optional) or one of the
// wrong type is an error naming the column, the type found and the type needed, and --columns.
func (d *Dataset) resolve(f *file, specs []spec) ([]resolved, error) {
	schema := f.pf.Schema()
	var names []string
	for _, fl := range schema.Fields() {
		names = append(names, fl.Name())
	}
	if err := d.renamesIn(f.path, names); err != nil {
		return nil, err
	}
	out := make([]resolved, len(specs))
	for i, s := range specs {
		col := d.column(s.name)
		rename := s.name
		if col != s.name {
			rename = s.name + "=" + col
		}
		out[i].spec = s
		top, ok := field(schema, col)
		if !ok {
			if s.optional {
				continue
			}
			return nil, fmt.Errorf("%s: no column %q (%s); the file has %s: name the column that holds it with --columns %s=COLUMN",
				f.path, col, s.what, quoteList(names), s.name)
		}
		needed := s.kind
		wrong := func() error {
			return fmt.Errorf("%s: column %q is %s, but memfit reads %s as %s (%s): name a column of that type with --columns %s=COLUMN",
				f.path, col, describe(top), s.name, needed, s.what, strings.Split(rename, "=")[0])
		}
		if s.kind == kText { // read as what the column holds
			s.kind = kMessages
			if isString(top) && !top.Repeated() {
				s.kind = kString
			}
			out[i].spec = s
		}
		lookup := func(path ...string) (leaf, bool) {
			lc, ok := schema.Lookup(path...)
			if !ok {
				return leaf{}, false
			}
			k, ok := leafKind(lc.Node)
			if !ok {
				return leaf{}, false
			}
			return leaf{index: lc.ColumnIndex, maxDef: lc.MaxDefinitionLevel, physical: k}, true
		}
		switch s.kind {
		case kString:
			if !isString(top) || top.Repeated() {
				return nil, wrong()
			}
			l, _ := lookup(col)
			out[i].leaves = []leaf{l}
		case kInt:
			if !isInt(top) || top.Repeated() {
				return nil, wrong()
			}
			l, _ := lookup(col)
			out[i].leaves = []leaf{l}
		case kNumber:
			k, ok := leafKind(top)
			if !ok || top.Repeated() || k != parquet.Int32 && k != parquet.Int64 && k != parquet.Float && k != parquet.Double {
				return nil, wrong()
			}
			l, _ := lookup(col)
			out[i].leaves = []leaf{l}
		case kImage:
			if isBinary(top) && !top.Repeated() {
				l, _ := lookup(col)
				out[i].leaves = []leaf{l, {index: -1}}
				break
			}
			b, ok := field(top, "bytes")
			if top.Leaf() || top.Repeated() || !ok || !isString(b) {
				return nil, wrong()
			}
			lb, _ := lookup(col, "bytes")
			lp := leaf{index: -1}
			if p, ok := field(top, "path"); ok && isString(p) {
				lp, _ = lookup(col, "path")
			}
			out[i].leaves = []leaf{lb, lp}
		case kMessages:
			el, twoLevel, ok := parquet.Node(top), true, true // a repeated top-level group: a 2-level list of messages
			if !top.Repeated() {
				el, twoLevel, ok = listElement(top)
			}
			if !ok || el.Leaf() || !twoLevel && el.Repeated() {
				return nil, wrong() // not a list of structs (a list of lists among them)
			}
			roleName, contentName := "role", "content"
			if _, ok := field(el, "role"); !ok {
				roleName, contentName = "from", "value" // the ShareGPT form
			}
			role, ok1 := field(el, roleName)
			content, ok2 := field(el, contentName)
			if !ok1 || !ok2 {
				return nil, wrong()
			}
			for _, fl := range []parquet.Field{role, content} {
				if !isString(fl) || fl.Repeated() {
					return nil, fmt.Errorf("%s: column %q is %s: its messages' %q is %s, but memfit reads a message's %s as a string: name a column of conversations with --columns %s=COLUMN",
						f.path, col, describe(top), fl.Name(), describe(fl), fl.Name(), s.name)
				}
			}
			path, def := pathTo(top, el, col)
			lr, _ := lookup(append(slices.Clone(path), roleName)...)
			lc, _ := lookup(append(slices.Clone(path), contentName)...)
			lr.listDef, lc.listDef = def, def
			lr.shareGPT = roleName == "from"
			out[i].leaves = []leaf{lr, lc}
		}
	}
	return out, nil
}

// pathTo returns the column path from the top-level node top (named name) down to the list element el, and the
// definition level at which a list has an element (one per optional or repeated node on the way, el included).
func pathTo(top, el parquet.Node, name string) ([]string, int) {
	path, def := []string{name}, 0
	n := top
	for {
		if !n.Required() {
			def++
		}
		if n == el {
			return path, def
		}
		if n.Leaf() || len(n.Fields()) == 0 {
			return path, def
		}
		next := n.Fields()[0]
		path = append(path, next.Name())
		n = next
	}
}

func quoteList(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = fmt.Sprintf("%q", n)
	}
	return strings.Join(q, ", ")
}

// row is one row's values by spec: string, int64, float64, Image, []Message, or nil (null, or an optional
// column the file lacks).
type row []any

// each reads the specs' columns of every file, row group by row group and readRows rows at a time, and calls fn
// with each row and where it is (file and 0-based row, for messages). It returns the rows read.
func (d *Dataset) each(specs []spec, fn func(where string, r row) error) (int, error) {
	var reads []string
	for _, s := range specs {
		reads = append(reads, s.name)
	}
	for _, newName := range slices.Sorted(maps.Keys(d.Columns)) {
		if !slices.Contains(reads, newName) {
			return 0, fmt.Errorf("--columns %s=%s: %s is read for the columns %s; memfit reads no %q column from it: leave that rename out",
				newName, d.Columns[newName], d.where(), strings.Join(reads, ", "), newName)
		}
	}
	total := 0
	for _, path := range d.Files {
		f, err := openFile(path)
		if err != nil {
			return total, err
		}
		n, err := d.eachOfFile(f, specs, fn)
		f.Close()
		total += n
		if err != nil {
			return total, err
		}
	}
	if total == 0 {
		if d.Split != "" {
			return 0, fmt.Errorf("%s: split %q is empty: its parquet files (%d) hold no rows", d.Path, d.Split, len(d.Files))
		}
		return 0, fmt.Errorf("%s holds no rows", d.Path)
	}
	return total, nil
}

func (d *Dataset) eachOfFile(f *file, specs []spec, fn func(where string, r row) error) (n int, err error) {
	res, err := d.resolve(f, specs)
	if err != nil {
		return 0, err
	}
	defer func() {
		if p := recover(); p != nil { // parquet-go on a malformed page it does not check
			err = fmt.Errorf("%s: row %d does not decode (%v): the file is corrupt", f.path, n, p)
		}
	}()
	byCol := map[int][]parquet.Value{}
	for _, r := range res {
		for _, l := range r.leaves {
			if l.index >= 0 {
				byCol[l.index] = nil
			}
		}
	}
	buf := make([]parquet.Row, readRows)
	for g, rg := range f.pf.RowGroups() {
		rows := rg.Rows()
		start := n
		for {
			k, rerr := rows.ReadRows(buf)
			for _, pr := range buf[:k] {
				for c := range byCol {
					byCol[c] = byCol[c][:0]
				}
				for _, v := range pr {
					if vs, ok := byCol[v.Column()]; ok {
						byCol[v.Column()] = append(vs, v)
					}
				}
				vals := make(row, len(res))
				for i, r := range res {
					if vals[i], err = value(r, byCol); err != nil {
						rows.Close()
						return n, fmt.Errorf("%s: row %d: %v", f.path, n, err)
					}
				}
				if err := fn(fmt.Sprintf("%s: row %d", f.path, n), vals); err != nil {
					rows.Close()
					return n, err
				}
				n++
			}
			if errors.Is(rerr, io.EOF) {
				break
			}
			if rerr != nil {
				rows.Close()
				return n, fmt.Errorf("%s: row group %d does not decode (%v): the file is corrupt", f.path, g, rerr)
			}
			if k == 0 {
				break
			}
		}
		rows.Close()
		if got := int64(n - start); got != rg.NumRows() {
			return n, fmt.Errorf("%s: row group %d declares %d rows but holds %d: the file is corrupt", f.path, g, rg.NumRows(), got)
		}
	}
	return n, nil
}

// value decodes a spec's value from a row's values by column.
func value(r resolved, byCol map[int][]parquet.Value) (any, error) {
	if len(r.leaves) == 0 {
		return nil, nil
	}
	first := func(l leaf) (parquet.Value, bool) {
		vs := byCol[l.index]
		if len(vs) == 0 || vs[0].IsNull() {
			return parquet.Value{}, false
		}
		return vs[0], true
	}
	switch r.spec.kind {
	case kString:
		v, ok := first(r.leaves[0])
		if !ok {
			return nil, nil
		}
		return string(v.ByteArray()), nil
	case kInt, kNumber:
		v, ok := first(r.leaves[0])
		if !ok {
			return nil, nil
		}
		switch v.Kind() {
		case parquet.Int32:
			return int64(v.Int32()), nil
		case parquet.Int64:
			return v.Int64(), nil
		case parquet.Float:
			return float64(v.Float()), nil
		case parquet.Double:
			return v.Double(), nil
		}
		return nil, fmt.Errorf("column %q holds a %s value", r.spec.name, v.Kind())
	case kImage:
		v, ok := first(r.leaves[0])
		if !ok {
			return nil, nil
		}
		img := Image{Bytes: slices.Clone(v.ByteArray())}
		if r.leaves[1].index >= 0 {
			if p, ok := first(r.leaves[1]); ok {
				img.Path = string(p.ByteArray())
			}
		}
		return img, nil
	case kMessages:
		roles, contents := byCol[r.leaves[0].index], byCol[r.leaves[1].index]
		if len(roles) != len(contents) {
			return nil, fmt.Errorf("messages: %d roles for %d contents", len(roles), len(contents))
		}
		if len(roles) == 0 || roles[0].DefinitionLevel() < r.leaves[0].listDef {
			return []Message{}, nil // a null or empty list
		}
		msgs := make([]Message, len(roles))
		for i := range roles {
			if !roles[i].IsNull() {
				msgs[i].Role = string(roles[i].ByteArray())
				if r.leaves[0].shareGPT {
					var err error
					if msgs[i].Role, err = data.ShareGPTRole(msgs[i].Role); err != nil {
						return nil, fmt.Errorf("message %d: %v", i+1, err)
					}
				}
			}
			if !contents[i].IsNull() {
				msgs[i].Content = string(contents[i].ByteArray())
			}
		}
		return msgs, nil
	}
	return nil, nil
}
