package models

// TextSpec is what tokenizing, padding, generating and evaluating need to know of a model over token ids,
// whatever its family: its vocabulary and positions, its special tokens and its task.
type TextSpec struct {
	// VocabSize is the number of token ids the embedding table holds; MaxPositions the longest sequence the
	// model takes (max_position_embeddings).
	VocabSize, MaxPositions int
	// PadID and BOSID are the config's pad and beginning-of-sequence ids (-1: none); EOSIDs all its
	// end-of-sequence ids (generation stops at any of them).
	PadID, BOSID int
	EOSIDs       []int
	// Task is PEFT's task type: "CAUSAL_LM" (next-token logits [B, T, vocab]) or "SEQ_CLS" (logits [B, labels]).
	Task string
	// Labels are a classifier's class names (one: a regression).
	Labels []string
}

// Task types of TextSpec.Task (PEFT's names).
const (
	TaskCausalLM = "CAUSAL_LM"
	TaskSeqCls   = "SEQ_CLS"
)

// CausalLM reports whether the model predicts next tokens.
func (s TextSpec) CausalLM() bool { return s.Task == TaskCausalLM }

// TextModel is a model over token ids (input_ids, attention_mask) that describes itself: every decoder family,
// and encoders over text. Code that feeds or reads such a model (text data, generation, MMLU, GLUE) asks it
// through this interface instead of knowing its family.
type TextModel interface {
	TextSpec() TextSpec
}
