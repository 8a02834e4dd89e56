package preference

import (
	"errors"
	"fmt"
	"slices"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/chattemplate"
	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/loss"
	"github.com/memfit/memfit/tokenizer"
)

// Tokenizing and truncating preference pairs as TRL does, into the tensors Loss reads.

// Encoded is a pair's tokens: the prompt, then each completion, to be concatenated (never tokenized together).
type Encoded struct {
	Prompt, Chosen, Rejected []int
}

// Encode tokenizes a pair as TRL's DPOTrainer does.
//
// The standard form (strings): the prompt with the tokenizer's special tokens (its post-processor: BOS for a
// LLaMA), each completion on its own without them, followed by EOS (unless it already ends with it). This is
// DPOTrainer.tokenize_row (v0.12-v0.29: prompt, chosen and rejected tokenized separately, EOS appended to each
// completion) with the prompt's special tokens that TRL >= 1.0 adds (it tokenizes with add_special_tokens left
// on); a BPE tokenizer may encode the joint text differently at the seam, and TRL's separate tokenization is what
// is matched here.
//
// The conversational form (messages) goes through the chat template chat (chattemplate.Resolve, as conversations
// for training resolve it; nil is refused for this form). The prompt is encoded as for generation
// (Chat.EncodePrompt: the assistant's header after it, add_generation_prompt, with the template's own BOS); each
// completion is the rest of prompt + completion encoded as for training (Chat.EncodeTraining, the model's Jinja
// template or a built-in one), up to the last token training learns of the assistant's reply, its end-of-turn
// token: the tokens SFT on the same conversation learns. TRL >= 1.0 takes the rest of the rendering after the
// prompt too and appends no EOS to conversational completions; where a template writes more after the turn (a
// generation header it always appends, ChatML's newline) memfit stops at the turn's end. With the Alpaca template
// the prompt is the Alpaca rendering of the conversation (tokenizer.AlpacaConversation) and the completion, one
// assistant message, is encoded as in the standard form: the pair encodes as its standard form does.
func Encode(tok *tokenizer.Tokenizer, chat *chattemplate.Chat, p data.Preference) (Encoded, error) {
	eos, hasEOS := tok.EOS()
	completion := func(text string) []int {
		ids := tok.Encode(text, false)
		if len(ids) == 0 || ids[len(ids)-1] != eos {
			ids = append(ids, eos)
		}
		return ids
	}
	conversational := p.Chosen.Conversational()
	if !hasEOS && (!conversational || chat != nil && chat.Name == chattemplate.Alpaca) {
		return Encoded{}, errors.New("the tokenizer has no EOS token to end a completion with")
	}
	if !conversational {
		return Encoded{Prompt: tok.Encode(p.Prompt.String, true), Chosen: completion(p.Chosen.String),
			Rejected: completion(p.Rejected.String)}, nil
	}
	if chat == nil {
		return Encoded{}, errors.New("a conversational pair needs a chat template")
	}
	prompt := messages(p.Prompt.Messages)
	if chat.Name == chattemplate.Alpaca {
		text, err := tokenizer.AlpacaConversation(prompt)
		if err != nil {
			return Encoded{}, err
		}
		if len(p.Chosen.Messages) != 1 || len(p.Rejected.Messages) != 1 {
			return Encoded{}, errors.New("the alpaca template renders one reply: give chosen and rejected one assistant message each")
		}
		return Encoded{Prompt: tok.Encode(text, true), Chosen: completion(p.Chosen.Messages[0].Content),
			Rejected: completion(p.Rejected.Messages[0].Content)}, nil
	}
	ids, _, err := chat.EncodePrompt(prompt)
	if err != nil {
		return Encoded{}, err
	}
	enc := Encoded{Prompt: ids}
	for _, c := range []struct {
		msgs []data.Message
		to   *[]int
	}{{p.Chosen.Messages, &enc.Chosen}, {p.Rejected.Messages, &enc.Rejected}} {
		full, labels, _, err := chat.EncodeTraining(append(slices.Clone(prompt), messages(c.msgs)...))
		if err != nil {
			return Encoded{}, err
		}
		if len(full) < len(ids) || !slices.Equal(full[:len(ids)], ids) {
			return Encoded{}, fmt.Errorf("the chat template %s encodes the prompt differently alone and before its completion: the completion cannot be told apart", chat)
		}
		end := len(full)
		for end > len(ids) && labels[end-1] == loss.IgnoreIndex {
			end-- // what the template writes after the reply's end of turn is not the reply's
		}
		if end == len(ids) {
			return Encoded{}, errors.New("the completion encodes to no token")
		}
		*c.to = full[len(ids):end]
	}
	return enc, nil
}

func messages(msgs []data.Message) []tokenizer.Message {
	out := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		out[i] = tokenizer.Message(m)
	}
	return out
}

// Lengths are the truncation settings of pairs, as TRL's: SeqLen is the most tokens of prompt + completion
// (max_length), MaxPromptLen the most tokens of a prompt (max_prompt_length; 0: no limit).
type Lengths struct {
	SeqLen, MaxPromptLen int
}

// Cuts counts what Tensors cut or left out: prompts cut to MaxPromptLen (keeping their end), pairs with a
// completion cut to fit SeqLen (keeping its start), and pairs refused because their prompt leaves no room for a
// completion token (or the pair has no token to score).
type Cuts struct {
	Prompts, Completions, Refused int
}

// Tensors truncates encoded pairs and returns their tensors (the names above: ids, masks and labels of chosen and
// rejected, int32 [N, T], padded on the right with pad, T the longest kept sequence), the indices of the pairs
// kept, and what was cut.
//
// Truncation is TRL's: the prompt keeps its last MaxPromptLen tokens (DPOTrainer.tokenize_row, "keep_end" for
// the prompt); prompt + completion keeps its first SeqLen tokens, so a completion loses its end (DPOConfig's
// truncation_mode "keep_start", TRL >= 1.0's default); a pair whose prompt fills SeqLen keeps no completion token
// and is refused (TRL >= 1.0 drops such examples before training).
func Tensors(pairs []Encoded, l Lengths, pad int) (map[string]*tensors.Tensor, []int, Cuts, error) {
	if l.SeqLen < 2 {
		return nil, nil, Cuts{}, fmt.Errorf("a pair's sequence needs at least 2 tokens, got %d", l.SeqLen)
	}
	var cuts Cuts
	var kept []int
	var chosen, rejected, chosenLabels, rejectedLabels [][]int
	longest := 0
	for i, p := range pairs {
		prompt := p.Prompt
		if l.MaxPromptLen > 0 && len(prompt) > l.MaxPromptLen {
			prompt = prompt[len(prompt)-l.MaxPromptLen:]
			cuts.Prompts++
		}
		room := l.SeqLen - len(prompt)
		// Position 0 predicts nothing: without a prompt token, a one-token completion has nothing to score.
		if room < 1 || (len(prompt) == 0 && (len(p.Chosen) < 2 || len(p.Rejected) < 2)) {
			cuts.Refused++
			continue
		}
		c, r := p.Chosen, p.Rejected
		if len(c) > room || len(r) > room {
			cuts.Completions++
			c, r = c[:min(len(c), room)], r[:min(len(r), room)]
		}
		for _, s := range []struct {
			completion  []int
			ids, labels *[][]int
		}{{c, &chosen, &chosenLabels}, {r, &rejected, &rejectedLabels}} {
			ids := append(slices.Clone(prompt), s.completion...)
			labels := slices.Clone(ids)
			for j := range prompt {
				labels[j] = loss.IgnoreIndex
			}
			*s.ids, *s.labels = append(*s.ids, ids), append(*s.labels, labels)
			longest = max(longest, len(ids))
		}
		kept = append(kept, i)
	}
	if len(kept) == 0 {
		return nil, nil, cuts, fmt.Errorf("no pair keeps a completion token within --seq-len %d (every prompt fills it): raise --seq-len or lower --max-prompt-len", l.SeqLen)
	}
	out := map[string]*tensors.Tensor{}
	for _, side := range []struct {
		ids, labels [][]int
		names       [3]string
	}{{chosen, chosenLabels, [3]string{ChosenIDs, ChosenMask, ChosenLabels}}, {rejected, rejectedLabels, [3]string{RejectedIDs, RejectedMask, RejectedLabels}}} {
		ex, err := data.TokenExamples(side.ids, side.labels, longest, pad)
		if err != nil {
			return nil, nil, cuts, err
		}
		out[side.names[0]], out[side.names[1]], out[side.names[2]] = ex["input_ids"], ex["attention_mask"], ex["labels"]
	}
	return out, kept, cuts, nil
}
