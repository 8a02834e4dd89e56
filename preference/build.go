package preference

import (
	"errors"
	"math/rand/v2"
	"strings"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/tokenizer"
)

// FromInstructions builds a preference set from Alpaca instructions, reproducibly from seed: for each row with a
// response, the prompt is the row's Alpaca prompt (tokenizer.AlpacaPrompt, as instruction tuning formats it),
// chosen its own response and rejected the response of another row, drawn by a seeded shuffle (a response that
// reads the same as the chosen one is passed over). What separates chosen from rejected is only whether the reply
// answers the prompt: a model that prefers the chosen ones on pairs it never trained on has learned that. n > 0
// keeps the first n rows with a response (0: all).
func FromInstructions(rows []data.Instruction, n int, seed uint64) ([]data.Preference, error) {
	var kept []data.Instruction
	for _, r := range rows {
		if strings.TrimSpace(r.Output) != "" && (n <= 0 || len(kept) < n) {
			kept = append(kept, r)
		}
	}
	if len(kept) < 2 {
		return nil, errors.New("a preference set needs at least 2 instructions with a response")
	}
	perm := rand.New(rand.NewPCG(seed, 0x9a1e)).Perm(len(kept))
	out := make([]data.Preference, 0, len(kept))
	for i, r := range kept {
		// The i-th row takes the response of row perm[i], or of the next in the permutation whose response
		// differs from its own.
		other := ""
		for k := 0; k < len(kept) && other == ""; k++ {
			if c := kept[perm[(i+k)%len(kept)]].Output; strings.TrimSpace(c) != strings.TrimSpace(r.Output) {
				other = c
			}
		}
		if other == "" {
			continue // every response reads the same: no pair
		}
		out = append(out, data.Preference{Prompt: data.Text{String: tokenizer.AlpacaPrompt(r.Instruction, r.Input)},
			Chosen: data.Text{String: r.Output}, Rejected: data.Text{String: other}})
	}
	return out, nil
}
