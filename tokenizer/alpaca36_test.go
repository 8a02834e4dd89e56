package tokenizer

import (
	"strings"
	"testing"
)

// TestAlpacaConversationWithoutUserTurn (issue 36: cv_asst_only, cv_asst_single, cv_sys_asst, cv_dup_key_role): a
// conversation with no user message just before its final reply was refused as one "that ends with a user
// message", although it ends with the assistant's; the message now names what is missing.
func TestAlpacaConversationWithoutUserTurn(t *testing.T) {
	tok := loadShared(t, "llama3")
	for _, c := range []struct {
		msgs []Message
		want string
	}{
		{[]Message{{"assistant", "Hi."}}, "but it has no message before it"},
		{[]Message{{"system", "Be brief."}, {"assistant", "Hi."}}, "but message 1 before it is the system's"},
		{[]Message{{"assistant", "Hi."}, {"assistant", "Hello."}}, "but message 1 before it is the assistant's"},
	} {
		_, _, err := tok.FormatConversation(c.msgs, ChatAlpaca)
		if err == nil || !strings.Contains(err.Error(), "the Alpaca template learns the final assistant reply as the answer to the user message just before it, "+c.want) {
			t.Errorf("%v: %v; want %q", c.msgs, err, c.want)
		}
	}
}
