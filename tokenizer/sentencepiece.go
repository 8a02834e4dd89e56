package tokenizer

import (
	"fmt"
	"math"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/memfit/memfit/internal/readfile"
)

// SentencePiece piece types (sentencepiece_model.proto).
const (
	spNormal      = 1
	spUnknown     = 2
	spControl     = 3
	spUserDefined = 4
	spUnused      = 5
	spByte        = 6
)

type spPiece struct {
	piece string
	score float32
	typ   int
}

// loadSentencePiece reads a SentencePiece tokenizer.model (a ModelProto; BPE and unigram models) and sets up the
// same pipeline as Hugging Face's conversion of it: spaces become "▁" with one in front (add_dummy_prefix),
// BOS added by the post-processor, "▁" back to spaces and <0xXX> back to bytes when decoding.
func loadSentencePiece(path string) (*Tokenizer, error) {
	data, err := readfile.Read(path, readfile.Tokenizer)
	if err != nil {
		return nil, err
	}
	var pieces []spPiece
	modelType, byteFallback := 1, false
	addDummy, removeExtra := true, true
	bosID, eosID, unkID, padID := 1, 2, 0, -1
	err = eachField(data, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
		switch num {
		case 1: // SentencePiece
			p := spPiece{typ: spNormal}
			err := eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
				switch num {
				case 1:
					p.piece = string(v)
				case 2:
					p.score = math.Float32frombits(uint32(x))
				case 3:
					p.typ = int(x)
				}
				return nil
			})
			pieces = append(pieces, p)
			return err
		case 2: // TrainerSpec
			return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
				switch num {
				case 3:
					modelType = int(x)
				case 35:
					byteFallback = x != 0
				case 40:
					unkID = int(int32(x))
				case 41:
					bosID = int(int32(x))
				case 42:
					eosID = int(int32(x))
				case 43:
					padID = int(int32(x))
				}
				return nil
			})
		case 3: // NormalizerSpec
			return eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
				switch num {
				case 3:
					addDummy = x != 0
				case 4:
					removeExtra = x != 0
				}
				return nil
			})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("not a SentencePiece model: %w", err)
	}
	if len(pieces) == 0 {
		return nil, fmt.Errorf("not a SentencePiece model: no pieces")
	}
	return newSentencePiece(pieces, modelType, byteFallback, addDummy, removeExtra, bosID, eosID, unkID, padID)
}

// newSentencePiece builds the tokenizer of a SentencePiece model's pieces and settings (loadSentencePiece).
func newSentencePiece(pieces []spPiece, modelType int, byteFallback, addDummy, removeExtra bool, bosID, eosID, unkID, padID int) (*Tokenizer, error) {
	t := &Tokenizer{src: source{sp: pieces, spModelType: modelType, addDummy: addDummy}, tokenToID: map[string]int{}, special: map[int]bool{}, idToToken: make([]string, len(pieces))}
	var added []addedToken
	for i, p := range pieces {
		t.idToToken[i] = p.piece
		if _, dup := t.tokenToID[p.piece]; !dup {
			t.tokenToID[p.piece] = i
		}
		if p.typ == spControl || p.typ == spUnknown {
			t.special[i] = true
		}
		if p.typ == spUserDefined {
			added = append(added, addedToken{ID: i, Content: p.piece})
		}
	}
	t.added = newAddedVocab(added)
	switch modelType {
	case 2:
		t.model = newSPBPE(pieces, byteFallback, unkID)
	case 1:
		u := &unigram{pieces: map[string]int{}, unk: unkID, byteFallback: byteFallback}
		for i, p := range pieces {
			if p.typ == spNormal || p.typ == spUserDefined || p.typ == spUnused {
				u.pieces[p.piece] = i
				u.maxLen = max(u.maxLen, len(p.piece))
			}
			u.scores = append(u.scores, float64(p.score))
		}
		for b := range u.byteIDs {
			u.byteIDs[b] = -1
			if id, ok := t.tokenToID[fmt.Sprintf("<0x%02X>", b)]; ok {
				u.byteIDs[b] = id
			}
		}
		t.model = u
	default:
		return nil, fmt.Errorf("SentencePiece model type %d is not supported (BPE and unigram are)", modelType)
	}
	var norm normSeq
	if removeExtra {
		norm = append(norm, normFunc(func(x string) string { return strings.Join(strings.Fields(x), " ") }))
	}
	if addDummy {
		norm = append(norm, normFunc(func(x string) string {
			if x == "" {
				return x
			}
			return " " + x
		}))
	}
	norm = append(norm, normFunc(func(x string) string { return strings.ReplaceAll(x, " ", "▁") }))
	t.normalizer = norm
	var tmpl template
	if bosID >= 0 && bosID < len(pieces) {
		tmpl.singleT = []templateItem{{ids: []int{bosID}}, {seq: "A"}}
		tmpl.pairT = []templateItem{{ids: []int{bosID}}, {seq: "A"}, {ids: []int{bosID}}, {seq: "B"}}
		t.Config.BOSToken = pieces[bosID].piece
	} else {
		tmpl.singleT = []templateItem{{seq: "A"}}
		tmpl.pairT = []templateItem{{seq: "A"}, {seq: "B"}}
	}
	t.post = tmpl
	t.spBOS, t.spEOS = bosID, eosID
	if eosID >= 0 && eosID < len(pieces) {
		t.Config.EOSToken = pieces[eosID].piece
	}
	if padID >= 0 && padID < len(pieces) {
		t.Config.PadToken = pieces[padID].piece
	}
	strip := 0
	if addDummy {
		strip = 1
	}
	t.decoder = decSeq{decFunc(func(toks []string) []string {
		out := make([]string, len(toks))
		for i, s := range toks {
			out[i] = strings.ReplaceAll(s, "▁", " ")
		}
		return out
	}), decFunc(byteFallbackDecode), decFunc(func(toks []string) []string {
		s := strings.Join(toks, "")
		if strip > 0 {
			s = strings.TrimPrefix(s, " ")
		}
		return []string{s}
	})}
	return t, nil
}

// eachField calls fn for every field of a protobuf message (v for bytes fields, x for varint and fixed ones).
func eachField(b []byte, fn func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		case protowire.Fixed32Type:
			var y uint32
			y, n = protowire.ConsumeFixed32(b)
			x = uint64(y)
		case protowire.Fixed64Type:
			x, n = protowire.ConsumeFixed64(b)
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := fn(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}

// spBPE is SentencePiece's BPE: start from characters and repeatedly merge the adjacent pair whose joined piece
// is in the vocabulary with the highest score (the leftmost on ties); characters outside the vocabulary become
// their <0xXX> byte pieces (byte fallback) or unk.
type spBPE struct {
	ids          map[string]int
	scores       []float32
	byteFallback bool
	byteIDs      [256]int
	unk          int
	cache        cache
}

func newSPBPE(pieces []spPiece, byteFallback bool, unk int) *spBPE {
	m := &spBPE{ids: map[string]int{}, byteFallback: byteFallback, unk: unk}
	for i, p := range pieces {
		m.scores = append(m.scores, p.score)
		if p.typ == spNormal || p.typ == spUserDefined || p.typ == spUnused {
			if _, dup := m.ids[p.piece]; !dup {
				m.ids[p.piece] = i
			}
		}
	}
	for b := range m.byteIDs {
		m.byteIDs[b] = -1
	}
	for i, p := range pieces {
		if p.typ == spByte && len(p.piece) == 6 {
			var b int
			if _, err := fmt.Sscanf(p.piece, "<0x%02X>", &b); err == nil {
				m.byteIDs[b] = i
			}
		}
	}
	return m
}

func (m *spBPE) vocab() map[string]int { return m.ids }
func (m *spBPE) unkID() int            { return m.unk }

func (m *spBPE) tokenize(piece string, ids []int) []int {
	if cached, ok := m.cache.get(piece); ok {
		return append(ids, cached...)
	}
	var syms []string
	for _, r := range piece {
		syms = append(syms, string(r))
	}
	for {
		best, at := float32(math.Inf(-1)), -1
		for i := 0; i+1 < len(syms); i++ {
			if id, ok := m.ids[syms[i]+syms[i+1]]; ok && m.scores[id] > best {
				best, at = m.scores[id], i
			}
		}
		if at < 0 {
			break
		}
		syms[at] += syms[at+1]
		syms = append(syms[:at+1], syms[at+2:]...)
	}
	var out []int
	for _, s := range syms {
		if id, ok := m.ids[s]; ok {
			out = append(out, id)
			continue
		}
		if m.byteFallback {
			for i := 0; i < len(s); i++ {
				out = append(out, m.byteIDs[s[i]])
			}
			continue
		}
		if _, n := utf8.DecodeRuneInString(s); n > 0 {
			out = append(out, m.unk)
		}
	}
	m.cache.put(piece, out)
	return append(ids, out...)
}
