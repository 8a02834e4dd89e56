package tokenizer

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"sync"
	"unicode/utf8"
)

type model interface {
	// tokenize appends the ids of one pre-tokenized piece to ids.
	tokenize(piece string, ids []int) []int
	vocab() map[string]int
	unkID() int
}

func parseModel(raw json.RawMessage) (model, error) {
	typ, err := typeOf(raw)
	if err != nil {
		return nil, err
	}
	if typ == "" { // old files leave the type out; BPE has merges, WordPiece a prefix, Unigram a list
		var probe map[string]json.RawMessage
		if err := json.Unmarshal(raw, &probe); err != nil {
			return nil, err
		}
		switch {
		case probe["merges"] != nil:
			typ = "BPE"
		case probe["continuing_subword_prefix"] != nil:
			typ = "WordPiece"
		default:
			typ = "Unigram"
		}
	}
	switch typ {
	case "BPE":
		return parseBPE(raw)
	case "WordPiece":
		return parseWordPiece(raw)
	case "Unigram":
		return parseUnigram(raw)
	}
	return nil, fmt.Errorf("unsupported model type %q", typ)
}

// cache remembers the ids of frequent pieces (words repeat a lot in text).
type cache struct {
	mu sync.Mutex
	m  map[string][]int
}

func (c *cache) get(s string) ([]int, bool) {
	c.mu.Lock()
	v, ok := c.m[s]
	c.mu.Unlock()
	return v, ok
}

func (c *cache) put(s string, ids []int) {
	c.mu.Lock()
	if c.m == nil || len(c.m) > 200_000 {
		c.m = map[string][]int{}
	}
	c.m[s] = ids
	c.mu.Unlock()
}

type pair struct{ a, b int }

type merge struct{ rank, id int }

type bpe struct {
	vocabMap     map[string]int
	merges       map[pair]merge
	unk          int
	fuseUnk      bool
	byteFallback bool
	prefix       string // continuing_subword_prefix
	suffix       string // end_of_word_suffix
	ignoreMerges bool
	byteIDs      [256]int // <0xXX> ids for byte fallback (-1 when absent)
	cache        cache
}

func parseBPE(raw json.RawMessage) (*bpe, error) {
	var j struct {
		Vocab        map[string]int    `json:"vocab"`
		Merges       []json.RawMessage `json:"merges"`
		Unk          *string           `json:"unk_token"`
		FuseUnk      bool              `json:"fuse_unk"`
		ByteFallback bool              `json:"byte_fallback"`
		Prefix       *string           `json:"continuing_subword_prefix"`
		Suffix       *string           `json:"end_of_word_suffix"`
		IgnoreMerges bool              `json:"ignore_merges"`
		Dropout      *float64          `json:"dropout"`
	}
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, err
	}
	if j.Dropout != nil && *j.Dropout > 0 {
		return nil, fmt.Errorf("BPE dropout %g is a training-time option memfit does not apply", *j.Dropout)
	}
	m := &bpe{vocabMap: j.Vocab, merges: make(map[pair]merge, len(j.Merges)), unk: -1, fuseUnk: j.FuseUnk,
		byteFallback: j.ByteFallback, ignoreMerges: j.IgnoreMerges}
	if j.Prefix != nil {
		m.prefix = *j.Prefix
	}
	if j.Suffix != nil {
		m.suffix = *j.Suffix
	}
	if j.Unk != nil {
		id, ok := j.Vocab[*j.Unk]
		if !ok {
			return nil, fmt.Errorf("unk_token %q is not in the vocabulary", *j.Unk)
		}
		m.unk = id
	}
	for b := range m.byteIDs {
		m.byteIDs[b] = -1
		if id, ok := j.Vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.byteIDs[b] = id
		}
	}
	for rank, r := range j.Merges {
		var a, b string
		var s string
		if json.Unmarshal(r, &s) == nil {
			var ok bool
			if a, b, ok = strings.Cut(s, " "); !ok {
				return nil, fmt.Errorf("merge %d %q is not two tokens", rank, s)
			}
		} else {
			var ab []string
			if err := json.Unmarshal(r, &ab); err != nil || len(ab) != 2 {
				return nil, fmt.Errorf("merge %d is neither \"a b\" nor [a, b]", rank)
			}
			a, b = ab[0], ab[1]
		}
		ia, oka := j.Vocab[a]
		ib, okb := j.Vocab[b]
		joined := a + strings.TrimPrefix(b, m.prefix)
		id, okj := j.Vocab[joined]
		if !oka || !okb || !okj {
			return nil, fmt.Errorf("merge %d (%q, %q) uses tokens missing from the vocabulary", rank, a, b)
		}
		if _, dup := m.merges[pair{ia, ib}]; !dup {
			m.merges[pair{ia, ib}] = merge{rank, id}
		}
	}
	return m, nil
}

func (m *bpe) vocab() map[string]int { return m.vocabMap }
func (m *bpe) unkID() int            { return m.unk }

func (m *bpe) tokenize(piece string, ids []int) []int {
	if cached, ok := m.cache.get(piece); ok {
		return append(ids, cached...)
	}
	out := m.encode(piece)
	m.cache.put(piece, out)
	return append(ids, out...)
}

func (m *bpe) encode(piece string) []int {
	if m.ignoreMerges {
		if id, ok := m.vocabMap[piece]; ok {
			return []int{id}
		}
	}
	var syms []int
	lastUnk := false
	for i, r := range piece {
		n := utf8.RuneLen(r)
		if r == utf8.RuneError {
			_, n = utf8.DecodeRuneInString(piece[i:])
		}
		s := piece[i : i+n]
		if i > 0 {
			s = m.prefix + s
		}
		if i+n == len(piece) {
			s += m.suffix
		}
		if id, ok := m.vocabMap[s]; ok {
			syms = append(syms, id)
			lastUnk = false
			continue
		}
		if m.byteFallback {
			ok := true
			for k := 0; k < n; k++ {
				ok = ok && m.byteIDs[piece[i+k]] >= 0
			}
			if ok {
				for k := 0; k < n; k++ {
					syms = append(syms, m.byteIDs[piece[i+k]])
				}
				lastUnk = false
				continue
			}
		}
		if m.unk >= 0 {
			if !(m.fuseUnk && lastUnk) {
				syms = append(syms, m.unk)
			}
			lastUnk = true
		}
	}
	for len(syms) > 1 {
		best, at := merge{rank: math.MaxInt}, -1
		for i := 0; i+1 < len(syms); i++ {
			if mg, ok := m.merges[pair{syms[i], syms[i+1]}]; ok && mg.rank < best.rank {
				best, at = mg, i
			}
		}
		if at < 0 {
			break
		}
		syms[at] = best.id
		syms = append(syms[:at+1], syms[at+2:]...)
	}
	return syms
}

type wordPiece struct {
	vocabMap map[string]int
	unk      int
	prefix   string
	maxChars int
	cache    cache
}

func parseWordPiece(raw json.RawMessage) (*wordPiece, error) {
	var j struct {
		Vocab    map[string]int `json:"vocab"`
		Unk      string         `json:"unk_token"`
		Prefix   *string        `json:"continuing_subword_prefix"`
		MaxChars int            `json:"max_input_chars_per_word"`
	}
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, err
	}
	m := &wordPiece{vocabMap: j.Vocab, prefix: "##", maxChars: j.MaxChars}
	if j.Prefix != nil {
		m.prefix = *j.Prefix
	}
	if m.maxChars == 0 {
		m.maxChars = 100
	}
	id, ok := j.Vocab[j.Unk]
	if !ok {
		return nil, fmt.Errorf("unk_token %q is not in the vocabulary", j.Unk)
	}
	m.unk = id
	return m, nil
}

func (m *wordPiece) vocab() map[string]int { return m.vocabMap }
func (m *wordPiece) unkID() int            { return m.unk }

// tokenize is greedy longest-match-first: the longest vocabulary prefix, then the longest "##" continuation, and
// so on; a word with any unmatched part (or longer than max_input_chars_per_word) is one unk token.
func (m *wordPiece) tokenize(piece string, ids []int) []int {
	if cached, ok := m.cache.get(piece); ok {
		return append(ids, cached...)
	}
	var out []int
	if utf8.RuneCountInString(piece) > m.maxChars {
		out = []int{m.unk}
	} else {
		for start := 0; start < len(piece); {
			end, found := len(piece), -1
			for end > start {
				s := piece[start:end]
				if start > 0 {
					s = m.prefix + s
				}
				if id, ok := m.vocabMap[s]; ok {
					found = id
					break
				}
				_, n := utf8.DecodeLastRuneInString(piece[start:end])
				end -= n
			}
			if found < 0 {
				out = []int{m.unk}
				break
			}
			out = append(out, found)
			start = end
		}
	}
	m.cache.put(piece, out)
	return append(ids, out...)
}

// unigram is a SentencePiece unigram model: the segmentation of highest total log-probability (Viterbi).
type unigram struct {
	pieces       map[string]int
	scores       []float64
	unk          int
	byteFallback bool
	byteIDs      [256]int
	maxLen       int
	cache        cache
}

func parseUnigram(raw json.RawMessage) (*unigram, error) {
	var j struct {
		Vocab        [][2]json.RawMessage `json:"vocab"`
		UnkID        *int                 `json:"unk_id"`
		ByteFallback bool                 `json:"byte_fallback"`
	}
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, err
	}
	m := &unigram{pieces: map[string]int{}, unk: -1, byteFallback: j.ByteFallback}
	for i, e := range j.Vocab {
		var s string
		var score float64
		if json.Unmarshal(e[0], &s) != nil || json.Unmarshal(e[1], &score) != nil {
			return nil, fmt.Errorf("unigram vocab entry %d is not [piece, score]", i)
		}
		m.pieces[s] = i
		m.scores = append(m.scores, score)
		m.maxLen = max(m.maxLen, len(s))
	}
	if len(j.Vocab) == 0 {
		return nil, fmt.Errorf("unigram vocab is empty")
	}
	if j.UnkID != nil {
		if *j.UnkID < 0 || *j.UnkID >= len(j.Vocab) {
			return nil, fmt.Errorf("unigram unk_id %d is not an entry of its %d-piece vocab", *j.UnkID, len(j.Vocab))
		}
		m.unk = *j.UnkID
	}
	for b := range m.byteIDs {
		m.byteIDs[b] = -1
		if id, ok := m.pieces[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.byteIDs[b] = id
		}
	}
	return m, nil
}

func (m *unigram) vocab() map[string]int { return m.pieces }
func (m *unigram) unkID() int            { return m.unk }

func (m *unigram) tokenize(piece string, ids []int) []int {
	if cached, ok := m.cache.get(piece); ok {
		return append(ids, cached...)
	}
	const unkPenalty = 10.0
	minScore := 0.0
	for _, s := range m.scores {
		minScore = min(minScore, s)
	}
	n := len(piece)
	best := make([]float64, n+1)
	from := make([]int, n+1)
	tok := make([]int, n+1)
	for i := 1; i <= n; i++ {
		best[i] = math.Inf(-1)
	}
	for i := 0; i < n; i++ {
		if math.IsInf(best[i], -1) || (i > 0 && !utf8.RuneStart(piece[i])) {
			continue
		}
		found := false
		for j := i + 1; j <= min(n, i+m.maxLen); j++ {
			if j < n && !utf8.RuneStart(piece[j]) {
				continue
			}
			if id, ok := m.pieces[piece[i:j]]; ok {
				found = true
				if s := best[i] + m.scores[id]; s > best[j] {
					best[j], from[j], tok[j] = s, i, id
				}
			}
		}
		if !found { // one character as unknown
			_, w := utf8.DecodeRuneInString(piece[i:])
			if s := best[i] + minScore - unkPenalty; s > best[i+w] {
				best[i+w], from[i+w], tok[i+w] = s, i, -1
			}
		}
	}
	var rev []int
	for j := n; j > 0; j = from[j] {
		if tok[j] >= 0 {
			rev = append(rev, tok[j])
			continue
		}
		seg := piece[from[j]:j]
		if m.byteFallback {
			for k := len(seg) - 1; k >= 0; k-- {
				rev = append(rev, m.byteIDs[seg[k]])
			}
		} else if len(rev) == 0 || rev[len(rev)-1] != m.unk {
			rev = append(rev, m.unk)
		}
	}
	out := make([]int, len(rev))
	for i, id := range rev {
		out[len(rev)-1-i] = id
	}
	m.cache.put(piece, out)
	return append(ids, out...)
}
