package preference

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/tokenizer"
)

// FromInstructions builds a preference set from Alpaca instructions, reproducibly from seed: for each row with a
// response, perPrompt pairs (at least 1) whose prompt is the row's Alpaca prompt (tokenizer.AlpacaPrompt, as
// instruction tuning formats it), chosen its own response and rejected the response of another row, drawn by a
// seeded shuffle, one shuffle per pair of a prompt (so a prompt's pairs reject different responses; a response
// that reads the same as the chosen one, or as one already rejected for the prompt, is passed over). What
// separates chosen from rejected is only whether the reply answers the prompt. n > 0 keeps the first n rows with a
// response (0: all). The pairs come prompt by prompt, each prompt's perPrompt pairs together.
func FromInstructions(rows []data.Instruction, n, perPrompt int, seed uint64) ([]data.Preference, error) {
	var kept []data.Instruction
	for _, r := range rows {
		if strings.TrimSpace(r.Output) != "" && (n <= 0 || len(kept) < n) {
			kept = append(kept, r)
		}
	}
	perPrompt = max(1, perPrompt)
	if len(kept) < 2 {
		return nil, errors.New("a preference set needs at least 2 instructions with a response")
	}
	r := rand.New(rand.NewPCG(seed, 0x9a1e))
	perms := make([][]int, perPrompt)
	for k := range perms {
		perms[k] = r.Perm(len(kept))
	}
	same := func(a, b string) bool { return strings.TrimSpace(a) == strings.TrimSpace(b) }
	var out []data.Preference
	for i, row := range kept {
		var rejected []string
		for _, perm := range perms {
			// The response of row perm[i], or of the next in the permutation that differs from the chosen one
			// and from those already rejected for this prompt.
			for k := 0; k < len(kept); k++ {
				c := kept[perm[(i+k)%len(kept)]].Output
				if same(c, row.Output) || slices.ContainsFunc(rejected, func(s string) bool { return same(s, c) }) {
					continue
				}
				rejected = append(rejected, c)
				break
			}
		}
		for _, rej := range rejected {
			out = append(out, data.Preference{Prompt: data.Text{String: tokenizer.AlpacaPrompt(row.Instruction, row.Input)},
				Chosen: data.Text{String: row.Output}, Rejected: data.Text{String: rej}})
		}
	}
	return out, nil
}
