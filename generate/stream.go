package generate

import (
	"io"
	"strings"
	"unicode/utf8"
)

// Streamer writes a row's text as its tokens arrive. Tokens are decoded together (a byte-level token may hold
// part of a character, a SentencePiece one a leading space that depends on what precedes it), and only text
// that cannot change any more is written: not a trailing incomplete character, and not the last bytes that
// could still begin a stop string (the reply is cut before a stop string, which is then never shown).
type Streamer struct {
	W          io.Writer
	Decode     func(ids []int) string
	Stops      []string
	StopTokens []int
	ids        []int
	written    string
	err        error
}

// Add takes the row's next token (a stop token is not shown).
func (s *Streamer) Add(token int) {
	for _, t := range s.StopTokens {
		if t == token {
			return
		}
	}
	s.ids = append(s.ids, token)
	text := s.Decode(s.ids)
	hold := 0
	for _, stop := range s.Stops {
		hold = max(hold, len(stop)-1)
	}
	safe := len(text) - hold
	for _, stop := range s.Stops {
		if i := strings.Index(text, stop); stop != "" && i >= 0 {
			safe = min(safe, i)
		}
	}
	for safe > 0 && !utf8.ValidString(text[:safe]) {
		safe--
	}
	if safe > 0 && strings.HasSuffix(text[:safe], string(utf8.RuneError)) {
		safe -= len(string(utf8.RuneError)) // an incomplete character decoded as U+FFFD: wait for the rest
	}
	s.emit(text, safe)
}

// Finish writes the rest of the reply, final being its whole text (cut before the stop string, if one ended
// it).
func (s *Streamer) Finish(final string) error {
	s.emit(final, len(final))
	return s.err
}

func (s *Streamer) emit(text string, upto int) {
	if s.err != nil || upto <= len(s.written) || !strings.HasPrefix(text, s.written) {
		return // nothing new, or the decoding of earlier tokens changed: what was written stays
	}
	_, s.err = io.WriteString(s.W, text[len(s.written):upto])
	s.written = text[:upto]
}
