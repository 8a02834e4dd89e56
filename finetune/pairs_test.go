package finetune_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parquet-go/parquet-go"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/preference"
	"github.com/memfit/memfit/tokenizer"
)

type parquetMessage struct {
	Role    string `parquet:"role"`
	Content string `parquet:"content"`
}

// conversationalRow is a preference pair in the conversational form, as a parquet row.
type conversationalRow struct {
	Prompt   []parquetMessage `parquet:"prompt,list"`
	Chosen   []parquetMessage `parquet:"chosen,list"`
	Rejected []parquetMessage `parquet:"rejected,list"`
}

// standardRow is one in the standard form.
type standardRow struct {
	Prompt   string `parquet:"prompt"`
	Chosen   string `parquet:"chosen"`
	Rejected string `parquet:"rejected"`
}

func writeParquet[T any](t *testing.T, path string, rows []T) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := parquet.WriteFile(path, rows); err != nil {
		t.Fatal(err)
	}
}

func writeJSONLPairs(t *testing.T, path string, pairs []data.Preference) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := data.WritePreferences(f, pairs); err != nil {
		t.Fatal(err)
	}
}

// TestPairDataForms: the same pairs read the same from every form TRL's preference format takes: standard
// strings (JSONL, parquet), conversational message lists rendered with the chat template (llama-tiny has none,
// so the Alpaca template, whose prompt is the standard form's Alpaca prompt exactly), with the prompt implicit
// (the turns chosen and rejected share), and from a hub dataset folder's split.
func TestPairDataForms(t *testing.T) {
	rows, err := data.ReadInstructions(pairSource(t))
	if err != nil {
		t.Fatal(err)
	}
	var kept []data.Instruction
	for _, r := range rows {
		if r.Input == "" && strings.TrimSpace(r.Output) != "" && len(kept) < 6 {
			kept = append(kept, r)
		}
	}
	standard, err := preference.FromInstructions(kept, 0, 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	var conv, implicit []data.Preference
	var convRows []conversationalRow
	var strRows []standardRow
	for i, p := range standard {
		user := []data.Message{{Role: "user", Content: kept[i].Instruction}}
		chosen := []data.Message{{Role: "assistant", Content: p.Chosen.String}}
		rejected := []data.Message{{Role: "assistant", Content: p.Rejected.String}}
		conv = append(conv, data.Preference{Prompt: data.Text{Messages: user}, Chosen: data.Text{Messages: chosen}, Rejected: data.Text{Messages: rejected}})
		implicit = append(implicit, data.Preference{Chosen: data.Text{Messages: append(append([]data.Message{}, user...), chosen...)},
			Rejected: data.Text{Messages: append(append([]data.Message{}, user...), rejected...)}})
		msgs := func(ms []data.Message) []parquetMessage {
			var out []parquetMessage
			for _, m := range ms {
				out = append(out, parquetMessage(m))
			}
			return out
		}
		convRows = append(convRows, conversationalRow{msgs(user), msgs(chosen), msgs(rejected)})
		strRows = append(strRows, standardRow{p.Prompt.String, p.Chosen.String, p.Rejected.String})
	}
	writeJSONLPairs(t, filepath.Join(tmp, "standard.jsonl"), standard)
	writeJSONLPairs(t, filepath.Join(tmp, "conversational.jsonl"), conv)
	// The implicit form has no "prompt" key: WritePreferences writes one, so the rows are written by hand.
	var sb strings.Builder
	for _, p := range implicit {
		sb.WriteString(`{"chosen": ` + messagesJSON(p.Chosen.Messages) + `, "rejected": ` + messagesJSON(p.Rejected.Messages) + "}\n")
	}
	if err := os.WriteFile(filepath.Join(tmp, "implicit.jsonl"), []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	writeParquet(t, filepath.Join(tmp, "standard.parquet"), strRows)
	writeParquet(t, filepath.Join(tmp, "hub", "data", "train-00000-of-00001.parquet"), convRows)
	writeParquet(t, filepath.Join(tmp, "hub", "data", "test-00000-of-00001.parquet"), convRows[:2])

	cfg := finetune.PreferenceDefaults(config(finetune.MethodLoRA, 1), preference.DPO)
	model, err := finetune.LoadModel(tinyDir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	read := func(path string, opts finetune.DataOptions) finetune.Examples {
		t.Helper()
		opts.SeqLen = 96
		it, err := finetune.OpenData(path, opts, model, tinyDir, 2, 0)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return it.(*finetune.Loader).Data
	}
	want := read(filepath.Join(tmp, "standard.jsonl"), finetune.DataOptions{})
	if want.Len() != len(standard) {
		t.Fatalf("%d pairs read, want %d", want.Len(), len(standard))
	}
	for _, tc := range []struct {
		path string
		opts finetune.DataOptions
		n    int
	}{
		{"conversational.jsonl", finetune.DataOptions{}, len(standard)},
		{"conversational.jsonl", finetune.DataOptions{ChatTemplate: "alpaca"}, len(standard)},
		{"implicit.jsonl", finetune.DataOptions{}, len(standard)},
		{"standard.parquet", finetune.DataOptions{}, len(standard)},
		{"hub", finetune.DataOptions{}, len(standard)},
		{"hub", finetune.DataOptions{Split: "test"}, 2},
	} {
		got := read(filepath.Join(tmp, tc.path), tc.opts)
		for _, name := range preference.Inputs() {
			g, w := int32s(t, got[name]), int32s(t, want[name])
			if len(g) != tc.n*len(w)/len(standard) {
				t.Fatalf("%s %+v: %s has %d values, want %d", tc.path, tc.opts, name, len(g), tc.n*len(w)/len(standard))
			}
			for i := range g {
				if g[i] != w[i] {
					t.Fatalf("%s %+v: %s differs from the standard JSONL's at %d", tc.path, tc.opts, name, i)
				}
			}
		}
	}
	// The prompt: BOS, then the Alpaca prompt; the completion: its own tokens, then EOS.
	tok, err := tokenizer.Load(tinyDir)
	if err != nil {
		t.Fatal(err)
	}
	ids, labels := int32s(t, want[preference.ChosenIDs]), int32s(t, want[preference.ChosenLabels])
	prompt := tok.Encode(standard[0].Prompt.String, true)
	completion := append(tok.Encode(standard[0].Chosen.String, false), mustEOS(t, tok))
	width := want[preference.ChosenIDs].Shape().Dim(1)
	for i, id := range append(append([]int{}, prompt...), completion...) {
		if int(ids[i]) != id || (i < len(prompt)) != (labels[i] == -100) {
			t.Fatalf("pair 0 position %d: id %d label %d, want id %d (prompt %d tokens)", i, ids[i], labels[i], id, len(prompt))
		}
	}
	if n := len(prompt) + len(completion); n < width && labels[n] != -100 {
		t.Errorf("padding at %d is labelled %d", n, labels[n])
	}
}

func mustEOS(t *testing.T, tok *tokenizer.Tokenizer) int {
	t.Helper()
	eos, ok := tok.EOS()
	if !ok {
		t.Fatal("no EOS")
	}
	return eos
}

func messagesJSON(ms []data.Message) string {
	b, _ := json.Marshal(ms)
	return string(b)
}

// TestObjectiveNeedsPairs: a preference objective trains on pairs only, and pairs train with a preference
// objective only; both are refused before any step, as requests.
func TestObjectiveNeedsPairs(t *testing.T) {
	pairs := pairFile(t, 4)
	alpaca := filepath.Join(t.TempDir(), "alpaca.jsonl")
	if err := os.WriteFile(alpaca, []byte(`{"instruction": "Say hi.", "input": "", "output": "Hi."}`+"\n"+
		`{"instruction": "Say bye.", "input": "", "output": "Bye."}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sft := config(finetune.MethodLoRA, 1)
	dpo := finetune.PreferenceDefaults(sft, preference.DPO)
	model, err := finetune.LoadModel(tinyDir, sft)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		data string
		cfg  finetune.Config
		want string
	}{
		{alpaca, dpo, "trains on preference pairs"},
		{pairs, sft, "--objective dpo or --objective orpo"},
	} {
		spec := finetune.RunSpec{Model: tinyDir, Data: tc.data, Config: tc.cfg, DataOptions: finetune.DataOptions{SeqLen: 96}}
		_, _, err := spec.OpenTraining(model, 2, 0)
		var req *finetune.RequestError
		if err == nil || !errors.As(err, &req) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s with objective %q: %v, want a request error saying %q", filepath.Base(tc.data), tc.cfg.Objective, err, tc.want)
		}
	}
}
