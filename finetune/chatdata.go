package finetune

// Supervised text examples for the LLaMA causal LM: conversations rendered with the chat template, and the
// cutting, dropping and (with --packing) packing that Alpaca rows and conversations share.

import (
	"fmt"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/chattemplate"
	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/tokenizer"
)

// ConversationChat returns the chat template that conversations take for training with tok
// (chattemplate.Resolve): template auto (or "") takes the model's own Jinja template when the tokenizer has one,
// else Alpaca (the Chat's Note says so); model, llama3, chatml and alpaca choose. generate resolves its
// --chat-template the same way, so a model is prompted the way it was trained.
func ConversationChat(tok *tokenizer.Tokenizer, template string) (*chattemplate.Chat, error) {
	return chattemplate.Resolve(tok, template)
}

// conversationTokens reads the conversations of a JSONL file (data.ReadConversations) or of parquet data with a
// messages column (ParquetConversations), leaves out those with an empty reply (withoutEmptyReplies, noted), and
// encodes each with the chat template (ConversationChat, EncodeConversations): labels on the assistant turns
// only. note tells which template they took (and, for auto on a model without one, why Alpaca); *chat is set to
// its name. A conversation the template cannot render is an error naming its line (for parquet its file and row,
// 0-based as data/hfdata counts rows).
func conversationTokens(path string, opts DataOptions, tok *tokenizer.Tokenizer, note func(string, ...any), chat *string) (ids, labels [][]int, err error) {
	var convs []data.Conversation
	if DataFormat(path, opts) == FormatParquet {
		if convs, err = ParquetConversations(path, opts); err != nil {
			return nil, nil, err
		}
	} else if convs, err = data.ReadConversations(path); err != nil {
		return nil, nil, err
	}
	if convs, err = withoutEmptyReplies(path, convs, func(c data.Conversation) bool { return data.EmptyReply(c.Messages) }, note); err != nil {
		return nil, nil, err
	}
	c, err := ConversationChat(tok, opts.ChatTemplate)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	if c.Note != "" {
		note("%s: %s", path, c.Note)
	} else {
		note("%s: conversations take the chat template %s", path, c)
	}
	*chat = c.Name
	ids, labels, unended, err := EncodeConversations(convs, c, path)
	if err != nil {
		return nil, nil, err
	}
	if unended > 0 {
		note("%s: the chat template writes no special token after %d assistant turns: the model does not learn where its reply ends there", path, unended)
	}
	return ids, labels, nil
}

// withoutEmptyReplies keeps the examples whose reply is not empty (empty tells): an Alpaca row with an empty output
// and a conversation with an empty assistant message are left out alike, counted in a note. Such a row is a data
// error more often than an intended answer (alpaca-libre v1 has 29 "ok" rows with an empty output, for
// instructions such as "write a list of five facts"), and training on it teaches the model to answer with its
// end-of-turn token alone; leaving it out with a count keeps the rest of the file usable.
func withoutEmptyReplies[T any](path string, xs []T, empty func(T) bool, note func(string, ...any)) ([]T, error) {
	kept := make([]T, 0, len(xs))
	for _, x := range xs {
		if !empty(x) {
			kept = append(kept, x)
		}
	}
	if n := len(xs) - len(kept); n > 0 {
		if len(kept) == 0 {
			return nil, fmt.Errorf("%s: every example (%d) has an empty reply (an empty output or assistant message): there is nothing to learn", path, n)
		}
		note("%s: %d of %d examples have an empty reply (an empty output or assistant message) and were left out: they would teach the model to answer with nothing", path, n, len(xs))
	}
	return kept, nil
}

// EncodeConversations encodes conversations with the chat template c for training (Chat.EncodeTraining): ids
// and labels per conversation, IgnoreIndex except on the assistant's replies. name (the file) and each
// conversation's Line (or its Where, for a parquet row) name the one that fails; unended counts the assistant
// turns after which the template writes no special token to learn.
func EncodeConversations(convs []data.Conversation, c *chattemplate.Chat, name string) (ids, labels [][]int, unended int, err error) {
	for _, conv := range convs {
		msgs := make([]tokenizer.Message, len(conv.Messages))
		for i, m := range conv.Messages {
			msgs[i] = tokenizer.Message(m)
		}
		id, label, u, err := c.EncodeTraining(msgs)
		if err != nil {
			if conv.Where != "" {
				return nil, nil, 0, fmt.Errorf("%s: %w", conv.Where, err)
			}
			return nil, nil, 0, fmt.Errorf("%s:%d: %w", name, conv.Line, err)
		}
		ids, labels, unended = append(ids, id), append(labels, label), unended+u
	}
	return ids, labels, unended, nil
}

// supervisedExamples turns encoded examples (labels IgnoreIndex on what is not learned) into the loader's
// tensors: examples longer than seqLen are cut on the right, one left without a target token is dropped (it
// would train nothing), and the rest are padded one to a sequence or, with packing, packed several to a sequence
// (data.PackExamples, which adds position_ids). note reports the cuts, the drops and the packing.
func supervisedExamples(path string, ids, labels [][]int, seqLen, pad int, packing bool, note func(string, ...any)) (map[string]*tensors.Tensor, error) {
	var keptIDs, keptLabels [][]int
	cut, empty := 0, 0
	for i, id := range ids {
		label := labels[i]
		if len(id) > seqLen {
			cut++
			id, label = tokenizer.Truncate(id, seqLen, tokenizer.Right), tokenizer.Truncate(label, seqLen, tokenizer.Right)
		}
		if !hasTarget(label) {
			empty++
			continue
		}
		keptIDs, keptLabels = append(keptIDs, id), append(keptLabels, label)
	}
	if cut > 0 {
		note("%s: %d of %d examples are longer than --seq-len %d and were cut on the right", path, cut, len(ids), seqLen)
	}
	if empty > 0 {
		note("%s: %d examples have no response token within --seq-len %d and were left out (they would train nothing)", path, empty, seqLen)
	}
	if len(keptIDs) == 0 {
		return nil, fmt.Errorf("%s: no example keeps a response token within --seq-len %d: raise it", path, seqLen)
	}
	if !packing {
		return data.TokenExamples(keptIDs, keptLabels, seqLen, pad)
	}
	p, err := data.PackExamples(keptIDs, keptLabels, seqLen, pad)
	if err != nil {
		return nil, err
	}
	note("%s: packed %d examples into %d sequences of %d tokens (%.0f%% real tokens; %.0f%% unpacked)", path, p.Docs, p.Rows, seqLen,
		100*float64(p.RealTokens)/float64(p.Rows*seqLen), 100*float64(p.RealTokens)/float64(p.Docs*seqLen))
	return p.Tensors, nil
}

// examples counts the examples of a batch: its rows, or for packed sequences (position_ids) the examples packed
// into them (each starts at position 0 on a real token), so examples/s means the same packed or not.
func examples(b Batch) int {
	pos, ok := b["position_ids"]
	mask, hasMask := b["attention_mask"]
	if !ok || !hasMask || pos.DType() != mask.DType() || pos.Shape().Size() != mask.Shape().Size() {
		return b.Size()
	}
	n := -1 // the flat data is valid only within the callbacks
	pos.MustConstFlatData(func(pf any) {
		mask.MustConstFlatData(func(mf any) {
			p, okP := pf.([]int32)
			m, okM := mf.([]int32)
			if !okP || !okM {
				return
			}
			n = 0
			for i := range p {
				if p[i] == 0 && m[i] != 0 {
					n++
				}
			}
		})
	})
	if n < 0 {
		return b.Size()
	}
	return n
}
