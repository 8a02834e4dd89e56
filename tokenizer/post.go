package tokenizer

import (
	"encoding/json"
	"fmt"
)

type postProcessor interface {
	single(a []int) []int
	pair(a, b []int) []int
}

// templateItem is one element of a TemplateProcessing template: a special token's ids or sequence A / B.
type templateItem struct {
	ids []int
	seq string // "A" or "B" for a sequence
}

type template struct{ singleT, pairT []templateItem }

func (t template) apply(items []templateItem, a, b []int) []int {
	var out []int
	for _, it := range items {
		switch it.seq {
		case "A":
			out = append(out, a...)
		case "B":
			out = append(out, b...)
		default:
			out = append(out, it.ids...)
		}
	}
	return out
}

func (t template) single(a []int) []int  { return t.apply(t.singleT, a, nil) }
func (t template) pair(a, b []int) []int { return t.apply(t.pairT, a, b) }

type postSeq []postProcessor

func (s postSeq) single(a []int) []int {
	for _, p := range s {
		a = p.single(a)
	}
	return a
}

func (s postSeq) pair(a, b []int) []int {
	if len(s) == 0 {
		return append(a, b...)
	}
	out := s[0].pair(a, b)
	for _, p := range s[1:] {
		out = p.single(out)
	}
	return out
}

type noPost struct{}

func (noPost) single(a []int) []int  { return a }
func (noPost) pair(a, b []int) []int { return append(append([]int(nil), a...), b...) }

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
					ID string `json:"id"`
				}
				if r, ok := it["SpecialToken"]; ok {
					if err := json.Unmarshal(r, &v); err != nil {
						return nil, err
					}
					st, ok := j.Special[v.ID]
					if !ok {
						return nil, fmt.Errorf("template token %q is not in special_tokens", v.ID)
					}
					out = append(out, templateItem{ids: st.IDs})
				} else if r, ok := it["Sequence"]; ok {
					if err := json.Unmarshal(r, &v); err != nil {
						return nil, err
					}
					out = append(out, templateItem{seq: v.ID})
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
		t := template{singleT: []templateItem{{ids: c}, {seq: "A"}, {ids: s}}}
		if typ == "BertProcessing" {
			t.pairT = []templateItem{{ids: c}, {seq: "A"}, {ids: s}, {seq: "B"}, {ids: s}}
		} else {
			t.pairT = []templateItem{{ids: c}, {seq: "A"}, {ids: s}, {ids: s}, {seq: "B"}, {ids: s}}
		}
		return t, nil
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
