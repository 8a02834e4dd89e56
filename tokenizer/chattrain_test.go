package tokenizer

import (
	"reflect"
	"strings"
	"testing"
)

// training is a multi-turn conversation with a system prompt and two assistant turns.
var training = []Message{{"system", "Be brief."}, {"user", "Hi!"}, {"assistant", "Hello."},
	{"user", "Name a colour."}, {"assistant", "Blue, like the sky."}}

// expectLabels is the independent expectation of which tokens a chat-formatted training sequence learns: it
// walks the ids of the whole rendering by its special tokens alone, as a reader of the template would. A turn
// opens with open (<|start_header_id|> / <|im_start|>), whose role runs up to the header's end: Llama-3's
// <|end_header_id|> and the "\n\n" token after it, ChatML's first token holding "\n"; the turn's content then
// runs to its end token (<|eot_id|> / <|im_end|>), included. Content and end token are learned in assistant
// turns; everything else (BOS, headers, ChatML's "\n" between turns) is not.
func expectLabels(t *testing.T, tok *Tokenizer, ids []int, open, headerEnd, end string) []int {
	t.Helper()
	id := func(s string) int {
		v, ok := tok.TokenID(s)
		if !ok {
			t.Fatalf("no %s", s)
		}
		return v
	}
	openID, endID := id(open), id(end)
	headerEndID := -1
	if headerEnd != "" {
		headerEndID = id(headerEnd)
	}
	labels := make([]int, len(ids))
	for i := range labels {
		labels[i] = IgnoreIndex
	}
	for i := 0; i < len(ids); i++ {
		if ids[i] != openID {
			continue
		}
		j := i + 1 // the role's tokens
		var role []int
		for ; j < len(ids); j++ {
			if headerEndID >= 0 && ids[j] == headerEndID {
				j += 2 // <|end_header_id|> and "\n\n"
				if tok.Decode(ids[j-1:j], false) != "\n\n" {
					t.Fatalf("token after <|end_header_id|> is %q", tok.Decode(ids[j-1:j], false))
				}
				break
			}
			if headerEndID < 0 && strings.Contains(tok.Decode(ids[j:j+1], false), "\n") {
				j++
				break
			}
			role = append(role, ids[j])
		}
		assistant := tok.Decode(role, false) == "assistant"
		for ; j < len(ids); j++ {
			if assistant {
				labels[j] = ids[j]
			}
			if ids[j] == endID {
				break
			}
		}
		i = j
	}
	return labels
}

// TestFormatConversationLearnsAssistantTurns checks assistant-only masking token by token, for Llama-3 (the
// shared Llama-3 tokenizer) and ChatML: the ids are the Hugging Face rendering of the whole conversation
// encoded as one string (as apply_chat_template tokenizes it), and the labels equal expectLabels' walk over
// those ids: every assistant turn's content and end-of-turn token learned (both turns), the system prompt kept
// in the sequence but not learned, no header learned.
func TestFormatConversationLearnsAssistantTurns(t *testing.T) {
	l3 := loadShared(t, "llama3")
	chatml := chatMLTokenizer(t)
	for _, c := range []struct {
		tok                  *Tokenizer
		format, rendered     string
		open, headerEnd, end string
		learned              string
	}{
		{l3, ChatLlama3, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>" +
			"<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>" +
			"<|start_header_id|>user<|end_header_id|>\n\nName a colour.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nBlue, like the sky.<|eot_id|>",
			"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "Hello.<|eot_id|>Blue, like the sky.<|eot_id|>"},
		{chatml, ChatML, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n" +
			"<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\nBlue, like the sky.<|im_end|>\n",
			"<|im_start|>", "", "<|im_end|>", "Hello.<|im_end|>Blue, like the sky.<|im_end|>"},
	} {
		ids, labels, err := c.tok.FormatConversation(training, c.format)
		if err != nil {
			t.Fatal(err)
		}
		if want := c.tok.Encode(c.rendered, false); !reflect.DeepEqual(ids, want) {
			t.Fatalf("%s: ids %q\nwant %q", c.format, c.tok.Decode(ids, false), c.rendered)
		}
		want := expectLabels(t, c.tok, ids, c.open, c.headerEnd, c.end)
		for i := range ids {
			if labels[i] != want[i] {
				t.Errorf("%s: position %d (%q): label %d, want %d", c.format, i, c.tok.Decode(ids[i:i+1], false), labels[i], want[i])
			}
		}
		var learned []int
		for _, l := range labels {
			if l != IgnoreIndex {
				learned = append(learned, l)
			}
		}
		if got := c.tok.Decode(learned, false); got != c.learned {
			t.Errorf("%s: learned %q, want %q", c.format, got, c.learned)
		}
	}
}

// TestFormatConversationAlpaca: under the Alpaca template a [user, assistant] conversation is the Alpaca row
// with that instruction (no input), token for token and label for label; a longer one learns its last reply
// (and EOS) after the Alpaca rendering of the turns before it, and one that does not end with the assistant is
// refused.
func TestFormatConversationAlpaca(t *testing.T) {
	tok := loadShared(t, "llama3")
	ids, labels, err := tok.FormatConversation([]Message{{"user", "Name a colour."}, {"assistant", "Blue."}}, ChatAlpaca)
	if err != nil {
		t.Fatal(err)
	}
	wantIDs, wantLabels := tok.FormatInstruction("Name a colour.", "", "Blue.")
	if !reflect.DeepEqual(ids, wantIDs) || !reflect.DeepEqual(labels, wantLabels) {
		t.Errorf("alpaca conversation %v / %v, want the Alpaca row's %v / %v", ids, labels, wantIDs, wantLabels)
	}
	ids, labels, err = tok.FormatConversation(training, ChatAlpaca)
	if err != nil {
		t.Fatal(err)
	}
	prompt, _ := AlpacaConversation(training[:4])
	if !strings.Contains(prompt, "Be brief.\n\n### Instruction:\nName a colour.\n\n### Input:\nUser: Hi!\nAssistant: Hello.") {
		t.Errorf("prompt %q", prompt)
	}
	eos, _ := tok.EOS()
	if want := append(tok.Encode(prompt+"Blue, like the sky.", true), eos); !reflect.DeepEqual(ids, want) {
		t.Errorf("ids %q, want %q", tok.Decode(ids, false), tok.Decode(want, false))
	}
	var learned []int
	for _, l := range labels {
		if l != IgnoreIndex {
			learned = append(learned, l)
		}
	}
	if got := tok.Decode(learned, false); got != "Blue, like the sky.<|end_of_text|>" {
		t.Errorf("learned %q", got)
	}
	if _, _, err := tok.FormatConversation(training[:4], ChatAlpaca); err == nil || !strings.Contains(err.Error(), "its last message must be the assistant's") {
		t.Errorf("a conversation ending with the user: %v", err)
	}
}
