package tokenizer

import (
	"encoding/json"
	"fmt"
)

// seq is a token sequence with its token type ids (Hugging Face tokenizers' Encoding, ids and type_ids only).
type seq struct{ ids, types []int }

// typed returns ids with every type id set to typ.
func typed(ids []int, typ int) seq {
	types := make([]int, len(ids))
	for i := range types {
		types[i] = typ
	}
	return seq{ids: ids, types: types}
}

func (s seq) concat(o seq) seq {
	return seq{ids: append(append([]int(nil), s.ids...), o.ids...), types: append(append([]int(nil), s.types...), o.types...)}
}

// postProcessor adds a model's special tokens around a sequence or a pair, as Hugging Face tokenizers' post
// processors: process returns the processed first sequence and, when the processor leaves a pair unmerged
// (ByteLevel), the processed second one (nil once merged). The sequences come in with type ids 0 (first) and 1
// (second), as tokenizers encodes them.
type postProcessor interface {
	process(a seq, b *seq) (seq, *seq)
	// added is the number of special tokens process adds to a single sequence or to a pair.
	added(pair bool) int
}

// templateItem is one element of a TemplateProcessing template: a special token's ids or sequence A / B, with
// the type id its tokens get.
type templateItem struct {
	ids    []int
	seq    string // "A" or "B" for a sequence
	typeID int
}

type template struct{ singleT, pairT []templateItem }

func (t template) apply(items []templateItem, a, b seq) seq {
	var out seq
	for _, it := range items {
		switch it.seq {
		case "A":
			out = out.concat(typed(a.ids, it.typeID))
		case "B":
			out = out.concat(typed(b.ids, it.typeID))
		default:
			out = out.concat(typed(it.ids, it.typeID))
		}
	}
	return out
}

func (t template) process(a seq, b *seq) (seq, *seq) {
	if b == nil {
		return t.apply(t.singleT, a, seq{}), nil
	}
	return t.apply(t.pairT, a, *b), nil
}

func (t template) added(pair bool) int {
	items := t.singleT
	if pair {
		items = t.pairT
	}
	n := 0
	for _, it := range items {
		n += len(it.ids)
	}
	return n
}

// bertLike is BertProcessing ([CLS] A [SEP] B [SEP]) and RobertaProcessing (<s> A </s></s> B </s>): BERT's
// first part has type 0 and its second part (B [SEP]) type 1; RoBERTa, which has no token types, gives every
// token type 0 (as Hugging Face tokenizers does).
type bertLike struct {
	cls, sep []int
	roberta  bool
}

func (p bertLike) process(a seq, b *seq) (seq, *seq) {
	first := typed(p.cls, 0).concat(a).concat(typed(p.sep, 0))
	if b == nil {
		return first, nil
	}
	if p.roberta {
		return first.concat(typed(p.sep, 0)).concat(typed(b.ids, 0)).concat(typed(p.sep, 0)), nil
	}
	return first.concat(*b).concat(typed(p.sep, 1)), nil
}

func (p bertLike) added(pair bool) int {
	switch {
	case !pair:
		return len(p.cls) + len(p.sep)
	case p.roberta:
		return len(p.cls) + 3*len(p.sep)
	}
	return len(p.cls) + 2*len(p.sep)
}

type postSeq []postProcessor

func (s postSeq) process(a seq, b *seq) (seq, *seq) {
	for _, p := range s {
		a, b = p.process(a, b)
	}
	return a, b
}

func (s postSeq) added(pair bool) int {
	n := 0
	for _, p := range s {
		n += p.added(pair)
	}
	return n
}

// noPost is ByteLevel's post-processing (offset trimming only): the sequences are left as they are.
type noPost struct{}

func (noPost) process(a seq, b *seq) (seq, *seq) { return a, b }
func (noPost) added(bool) int                    { return 0 }

func parsePostProcessor(raw json.RawMessage, vocab map[string]int) (postProcessor, error) {
	typ, err := typeOf(raw)
	if err != nil {
		return nil, err
	}
	tokenIDs := func(tok string) ([]int, error) {
		id, ok := vocab[tok]
		if !ok {
			return nil, fmt.Errorf("special token %q is not in the vocabulary", tok)
		}
		return []int{id}, nil
	}
	switch typ {
	case "TemplateProcessing":
		var j struct {
			Single  []map[string]json.RawMessage `json:"single"`
			Pair    []map[string]json.RawMessage `json:"pair"`
			Special map[string]struct {
				IDs []int `json:"ids"`
			} `json:"special_tokens"`
		}
		if err := json.Unmarshal(raw, &j); err != nil {
			return nil, err
		}
		parse := func(items []map[string]json.RawMessage) ([]templateItem, error) {
			var out []templateItem
			for _, it := range items {
				var v struct {
					ID     string `json:"id"`
					TypeID int    `json:"type_id"`
				}
				if r, ok := it["SpecialToken"]; ok {
					if err := json.Unmarshal(r, &v); err != nil {
						return nil, err
					}
					st, ok := j.Special[v.ID]
					if !ok {
						return nil, fmt.Errorf("template token %q is not in special_tokens", v.ID)
					}
					out = append(out, templateItem{ids: st.IDs, typeID: v.TypeID})
				} else if r, ok := it["Sequence"]; ok {
					if err := json.Unmarshal(r, &v); err != nil {
						return nil, err
					}
					out = append(out, templateItem{seq: v.ID, typeID: v.TypeID})
				} else {
					return nil, fmt.Errorf("template item %v is neither SpecialToken nor Sequence", it)
				}
			}
			return out, nil
		}
		var t template
		if t.singleT, err = parse(j.Single); err != nil {
			return nil, err
		}
		if t.pairT, err = parse(j.Pair); err != nil {
			return nil, err
		}
		return t, nil
	case "BertProcessing", "RobertaProcessing":
		var j struct {
			Sep [2]json.RawMessage `json:"sep"`
			Cls [2]json.RawMessage `json:"cls"`
		}
		if err := json.Unmarshal(raw, &j); err != nil {
			return nil, err
		}
		var sep, cls string
		if json.Unmarshal(j.Sep[0], &sep) != nil || json.Unmarshal(j.Cls[0], &cls) != nil {
			return nil, fmt.Errorf("%s needs sep and cls as [token, id]", typ)
		}
		s, err := tokenIDs(sep)
		if err != nil {
			return nil, err
		}
		c, err := tokenIDs(cls)
		if err != nil {
			return nil, err
		}
		return bertLike{cls: c, sep: s, roberta: typ == "RobertaProcessing"}, nil
	case "ByteLevel":
		return noPost{}, nil
	case "Sequence":
		var j struct {
			Processors []json.RawMessage `json:"processors"`
		}
		if err := json.Unmarshal(raw, &j); err != nil {
			return nil, err
		}
		var seq postSeq
		for _, r := range j.Processors {
			p, err := parsePostProcessor(r, vocab)
			if err != nil {
				return nil, err
			}
			seq = append(seq, p)
		}
		return seq, nil
	}
	return nil, fmt.Errorf("unsupported post_processor type %q", typ)
}
