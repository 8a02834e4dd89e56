package tokenizer

import (
	"encoding/json"
	"fmt"
	"sort"
)

type jsonFile struct {
	Added         []addedToken    `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         json.RawMessage `json:"model"`
}

type addedToken struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// component is the "type" field every tokenizer.json component has.
type component struct {
	Type string `json:"type"`
}

func isNull(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

func typeOf(raw json.RawMessage) (string, error) {
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return "", err
	}
	return c.Type, nil
}

// maxTokenID bounds the token ids a tokenizer file may use (the largest real vocabularies have a few hundred
// thousand): the id table is sized by the largest id, so a file declaring id 4e9 must not allocate for it.
const maxTokenID = 1 << 24

func parseTokenizerJSON(data []byte) (*Tokenizer, error) {
	var f jsonFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("not a tokenizer.json: %w", err)
	}
	if isNull(f.Model) {
		return nil, fmt.Errorf("tokenizer.json has no model")
	}
	t := &Tokenizer{tokenToID: map[string]int{}, special: map[int]bool{}}
	var err error
	if t.model, err = parseModel(f.Model); err != nil {
		return nil, fmt.Errorf("model: %w", err)
	}
	vocab := t.model.vocab()
	size := 0
	for tok, id := range vocab {
		if id < 0 || id >= maxTokenID {
			return nil, fmt.Errorf("model: token %q has id %d, outside [0, %d)", tok, id, maxTokenID)
		}
		size = max(size, id+1)
	}
	for _, a := range f.Added {
		if a.ID < 0 || a.ID >= maxTokenID {
			return nil, fmt.Errorf("added token %q has id %d, outside [0, %d)", a.Content, a.ID, maxTokenID)
		}
		size = max(size, a.ID+1)
	}
	t.idToToken = make([]string, size)
	for tok, id := range vocab {
		t.idToToken[id] = tok
		t.tokenToID[tok] = id
	}
	for _, a := range f.Added {
		t.idToToken[a.ID] = a.Content
		t.tokenToID[a.Content] = a.ID
		if a.Special {
			t.special[a.ID] = true
		}
	}
	t.added = newAddedVocab(f.Added)
	t.src = source{pre: f.PreTokenizer, added: f.Added}
	if !isNull(f.Normalizer) {
		if t.normalizer, err = parseNormalizer(f.Normalizer); err != nil {
			return nil, fmt.Errorf("normalizer: %w", err)
		}
	}
	if !isNull(f.PreTokenizer) {
		if t.pre, err = parsePreTokenizer(f.PreTokenizer); err != nil {
			return nil, fmt.Errorf("pre_tokenizer: %w", err)
		}
	}
	if !isNull(f.PostProcessor) {
		if t.post, err = parsePostProcessor(f.PostProcessor, t.tokenToID); err != nil {
			return nil, fmt.Errorf("post_processor: %w", err)
		}
	}
	if !isNull(f.Decoder) {
		if t.decoder, err = parseDecoder(f.Decoder); err != nil {
			return nil, fmt.Errorf("decoder: %w", err)
		}
	}
	return t, nil
}

func sortedStrings(m map[string]int) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
