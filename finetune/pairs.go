package finetune

// Preference data (FormatPreference): TRL's {"prompt", "chosen", "rejected"} pairs from JSONL, a parquet file or a
// hub dataset folder, tokenized and truncated as TRL does (preference.Encode, preference.Tensors) into the pair
// tensors a preference objective trains on. Any causal language model reads them: the family's own data
// formats are not involved.

import (
	"fmt"
	"slices"

	"github.com/memfit/memfit/chattemplate"
	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/data/hfdata"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/preference"
)

// FormatPreference is preference pairs: a JSONL file whose rows are {"prompt", "chosen", "rejected"} (strings,
// or message lists with the chat template), or parquet data (a file or a hub dataset folder) with those columns.
// A .jsonl file or parquet data is read as pairs when its first row (or its columns) say so.
const FormatPreference = "preference"

// isPreferenceData reports whether the data at path is preference pairs: --data-format preference, a .jsonl file
// whose first row is a pair (data.JSONLKind), or parquet data with chosen and rejected columns (after
// DataOptions.Columns). A file it cannot tell is left to the other readers, which name what is wrong.
func isPreferenceData(path, format string, opts DataOptions) bool {
	switch {
	case format == FormatPreference:
		return true
	case format == FormatAlpaca && opts.Format == "":
		kind, err := data.JSONLKind(path)
		return err == nil && kind == data.KindPreference
	case format == FormatParquet:
		ds, err := openParquet(path, opts)
		if err != nil {
			return false
		}
		chosen, err1 := ds.Has("chosen")
		rejected, err2 := ds.Has("rejected")
		return err1 == nil && err2 == nil && chosen && rejected
	}
	return false
}

// readPreferences reads the pairs of JSONL or parquet data.
func readPreferences(path string, opts DataOptions) ([]data.Preference, error) {
	if !hfdata.IsParquet(path) {
		return data.ReadPreferences(path)
	}
	ds, err := openParquet(path, opts)
	if err != nil {
		return nil, err
	}
	return ds.Preferences()
}

// openPairs opens preference data as a loader of pair batches; its Notes say what was cut or left out.
func openPairs(src DataSource) (Iterator, error) {
	var notes []string
	ex, chat, err := pairExamples(src.Path, src.Options, src.Model, src.ModelDir, func(format string, args ...any) {
		notes = append(notes, fmt.Sprintf(format, args...))
	})
	if err != nil {
		return nil, err
	}
	l, err := NewLoader(ex, src.BatchSize, src.Seed, true)
	if err != nil {
		return nil, err
	}
	l.Notes, l.ChatTemplate = notes, chat // run.yaml records the template conversational pairs took, as for conversations
	return l, nil
}

// PairExamples reads preference pairs for a causal language model and returns their tensors (the names of
// package preference): tokenized with the tokenizer (DataOptions.Tokenizer, or the model folder's) and, for
// conversational pairs, the chat template (DataOptions.ChatTemplate, resolved as for conversations); truncated to
// DataOptions.SeqLen (default 256) tokens of prompt + completion and DataOptions.MaxPromptLen of prompt. note
// (may be nil) receives the counts of prompts and completions cut and of pairs left out.
func PairExamples(path string, opts DataOptions, model Model, modelDir string, note func(string, ...any)) (Examples, error) {
	ex, _, err := pairExamples(path, opts, model, modelDir, note)
	return ex, err
}

// pairExamples is PairExamples, also returning the chat template conversational pairs took ("" for the
// standard form).
func pairExamples(path string, opts DataOptions, model Model, modelDir string, note func(string, ...any)) (Examples, string, error) {
	if note == nil {
		note = func(string, ...any) {}
	}
	tm, ok := model.(models.TextModel)
	switch {
	case !ok:
		return nil, "", fmt.Errorf("preference data trains a causal language model (its log-likelihoods of completions); %s", familyTitle(model))
	case !tm.TextSpec().CausalLM():
		return nil, "", fmt.Errorf("preference data trains a causal language model (its log-likelihoods of completions); the model's task is %s, not CAUSAL_LM", tm.TextSpec().Task)
	}
	if opts.Packing {
		return nil, "", fmt.Errorf("--packing packs instruction and conversation examples, not preference pairs: leave it out")
	}
	if opts.MaxPromptLen < 0 {
		return nil, "", fmt.Errorf("--max-prompt-len must not be negative, got %d", opts.MaxPromptLen)
	}
	spec := tm.TextSpec()
	tok, seqLen, err := textTokenizer(opts, model, spec, modelDir, "preference data")
	if err != nil {
		return nil, "", err
	}
	rows, err := readPreferences(path, opts)
	if err != nil {
		return nil, "", err
	}
	var chat *chattemplate.Chat
	if rows[0].Chosen.Conversational() {
		if chat, err = ConversationChat(tok, opts.ChatTemplate); err != nil {
			return nil, "", fmt.Errorf("%s: %w", path, err)
		}
		if chat.Note != "" {
			note("%s: %s", path, chat.Note)
		} else {
			note("%s: conversational pairs take the chat template %s", path, chat)
		}
	} else if opts.ChatTemplate != "" {
		return nil, "", fmt.Errorf("--chat-template renders conversational pairs (message lists); %s holds strings: leave it out", path)
	}
	enc := make([]preference.Encoded, len(rows))
	for i, r := range rows {
		if r.Chosen.Conversational() != rows[0].Chosen.Conversational() {
			return nil, "", fmt.Errorf("%s: %s: its pair is %s, the first is %s: one form per dataset", path, where(path, r.Line),
				form(r.Chosen.Conversational()), form(rows[0].Chosen.Conversational()))
		}
		if enc[i], err = preference.Encode(tok, chat, r); err != nil {
			return nil, "", fmt.Errorf("%s: %s: %w", path, where(path, r.Line), err)
		}
	}
	pad, ok := tok.Pad()
	if !ok {
		pad = max(0, spec.PadID) // masked: any id in the vocabulary will do
	}
	ex, _, cuts, err := preference.Tensors(enc, preference.Lengths{SeqLen: seqLen, MaxPromptLen: opts.MaxPromptLen}, pad)
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", path, err)
	}
	if cuts.Prompts > 0 {
		note("%s: %d of %d prompts are longer than --max-prompt-len %d and keep their last %d tokens", path, cuts.Prompts, len(rows), opts.MaxPromptLen, opts.MaxPromptLen)
	}
	if cuts.Completions > 0 {
		note("%s: %d of %d pairs have a completion cut to fit --seq-len %d (prompt + completion; the completion loses its end)", path, cuts.Completions, len(rows), seqLen)
	}
	if cuts.Refused > 0 {
		note("%s: %d of %d pairs were left out: their prompt leaves no completion token within --seq-len %d (raise it, or cut prompts with --max-prompt-len)", path, cuts.Refused, len(rows), seqLen)
	}
	if same := identicalPairs(rows); same > 0 {
		note("%s: %d of %d pairs have the same chosen and rejected completion: they teach nothing (their DPO gradient is zero) and count as misranked in rewards/accuracies; drop them from the data", path, same, len(rows))
	}
	name := ""
	if chat != nil {
		name = chat.Name
	}
	return Examples(ex), name, nil
}

// identicalPairs counts the pairs whose chosen and rejected completions are the same.
func identicalPairs(rows []data.Preference) int {
	n := 0
	for _, r := range rows {
		if r.Chosen.String == r.Rejected.String && slices.Equal(r.Chosen.Messages, r.Rejected.Messages) {
			n++
		}
	}
	return n
}

// where names a pair's place in its file: a JSONL line (1-based) or a parquet row (0-based).
func where(path string, line int) string {
	if hfdata.IsParquet(path) {
		return fmt.Sprintf("row %d", line)
	}
	return fmt.Sprintf("line %d", line)
}

func form(conversational bool) string {
	if conversational {
		return "conversational (message lists)"
	}
	return "standard (strings)"
}

// isPairData reports whether opened data holds preference pairs.
func isPairData(it Iterator) bool {
	l, ok := it.(*Loader)
	return ok && l.Data[preference.ChosenIDs] != nil
}

// checkObjectiveData refuses data that the run's objective does not train on: pairs without a preference
// objective, or a preference objective without pairs.
func checkObjectiveData(cfg Config, it Iterator, what string) error {
	_, pref := cfg.Preference()
	switch pairs := isPairData(it); {
	case pref && !pairs:
		return &RequestError{fmt.Errorf("%s: objective %s trains on preference pairs (JSONL or parquet rows of \"prompt\", \"chosen\", \"rejected\"), and this data holds none", what, cfg.Objective)}
	case !pref && pairs:
		return &RequestError{fmt.Errorf("%s holds preference pairs (prompt, chosen, rejected): train on them with --objective dpo or --objective orpo", what)}
	}
	return nil
}
