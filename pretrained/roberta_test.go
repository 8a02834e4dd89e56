package pretrained

import (
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/memfit/memfit/family/bert"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/golden"
	"github.com/memfit/memfit/internal/gtest"
	"github.com/memfit/memfit/models/encoder"
	"github.com/memfit/memfit/tokenizer"
)

func TestMain(m *testing.M) { gtest.Main(m) }

// TestShippedRoberta: pretrained/roberta-tiny is RobertaConfig's architecture for its own tokenizer, loads as a
// masked LM, and is pretrained: on 64 of the held-out rows (every 50th, as PretrainRoberta holds them out,
// masked with seed 3 as the last stage's held-out loss was) its masked-LM loss is that stage's 5.950 within 0.1,
// far below a uniform guess over the 4,096 tokens (8.32) and a random initialisation's (about 8.4).
func TestShippedRoberta(t *testing.T) {
	dir := filepath.Join("roberta-tiny")
	tok, err := tokenizer.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	c, err := encoder.LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := c.JSON()
	want, _ := RobertaConfig(tok.VocabSize()).JSON()
	if string(got) != string(want) {
		t.Fatalf("config.json is not RobertaConfig(%d):\n%s\nwant\n%s", tok.VocabSize(), got, want)
	}
	docs, err := readDocs(filepath.Join(golden.SharedDir(t), "text", "war-and-peace.txt"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := finetune.Defaults()
	cfg.Method, cfg.LoRARank, cfg.LoRAAlpha, cfg.LoRATarget = finetune.MethodFull, 0, 0, nil
	m, err := finetune.LoadModel(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	enc, ok := m.(bert.Encoder)
	if !ok {
		t.Fatalf("roberta-tiny loads as %T, not a bert.Encoder", m)
	}
	rows, maskID, err := bert.MaskedLMRows(docs, tok, 128, enc)
	if err != nil {
		t.Fatal(err)
	}
	var held [][]int
	for i := 49; i < len(rows) && len(held) < 64; i += 50 {
		held = append(held, rows[i])
	}
	ex, err := bert.MaskedLMExamples(held, 128, c.PadTokenID)
	if err != nil {
		t.Fatal(err)
	}
	ex["input_ids"], ex["labels"] = bert.Mask(ex["input_ids"], ex["attention_mask"], rand.New(rand.NewPCG(3, 0x4e1d)),
		bert.MaskProbability, maskID, c.VocabSize, bert.SpecialIDs(tok))
	tr, err := finetune.New(m, cfg, gtest.Backend(t))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Release()
	loss, err := tr.MeanLoss(ex, 16)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("held-out masked-LM loss on %d rows: %.4f", len(held), loss)
	if loss < 5.85 || loss > 6.05 {
		t.Errorf("held-out masked-LM loss %.4f, want 5.950 within 0.1 (pretrained/README.md)", loss)
	}
}
