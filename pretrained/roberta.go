package pretrained

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/gomlx/compute"

	"github.com/memfit/memfit/family/bert"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/readfile"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/encoder"
	"github.com/memfit/memfit/tokenizer"
)

// RobertaConfig is the shipped RoBERTa's architecture (RobertaForMaskedLM) for a tokenizer of vocab tokens in
// RoBERTa's layout (<s> <pad> </s> <unk> <mask> as ids 0-4): hidden 128, 4 layers of 4 heads, GELU MLP 512,
// 130 positions (sequences of 128 tokens after RoBERTa's padding_idx + 1 offset), LayerNorm eps 1e-5, the
// decoder tied to the embeddings.
func RobertaConfig(vocab int) encoder.Config {
	c := encoder.Config{ModelType: encoder.TypeRoBERTa, VocabSize: vocab, HiddenSize: 128, NumHiddenLayers: 4,
		NumAttentionHeads: 4, IntermediateSize: 512, MaxPositionEmbeddings: 130, TypeVocabSize: 1, LayerNormEps: 1e-5,
		PadTokenID: 1, BOSTokenID: 0, EOSTokenID: 2, TieWordEmbeddings: true, HiddenDropout: 0.1, AttentionDropout: 0.1,
		ClassifierDropout: -1, Head: encoder.HeadMaskedLM}
	c.Architecture = encoder.ArchitectureOf(c.ModelType, c.Head)
	return c
}

// PretrainRobertaOptions configure PretrainRoberta.
type PretrainRobertaOptions struct {
	Steps, BatchSize, SeqLen int
	LR                       float64
	Seed                     uint64
	// From, when set, is a RoBERTa masked LM of RobertaConfig's shape to continue training from (a second stage
	// with its own schedule) instead of random initialisation.
	From   string
	OnStep func(finetune.StepStats)
}

// PretrainRoberta trains RobertaConfig from random initialisation as a masked LM on texts (each .txt file split
// into paragraphs), encoded with the RoBERTa-layout tokenizer in tokDir into rows of SeqLen tokens (<s> ...
// </s>, documents separated by </s>), dynamically masked (15%: 80% <mask>, 10% random, 10% kept); 2% of the rows
// (every 50th) are held out, masked once with the seed. Full training with AdamW (weight decay 0.01), a linear
// schedule with 6% warm-up, gradient clipping at 1, from random initialisation or from o.From (a further stage). It writes config.json, model.safetensors and the tokenizer
// files to out and returns the held-out masked-LM loss and its perplexity.
func PretrainRoberta(ctx context.Context, backend compute.Backend, tokDir string, texts []string, out string, o PretrainRobertaOptions) (loss, ppl float64, err error) {
	tok, err := tokenizer.Load(tokDir)
	if err != nil {
		return 0, 0, err
	}
	c := RobertaConfig(tok.VocabSize())
	if err := c.Validate(); err != nil {
		return 0, 0, err
	}
	if o.SeqLen > c.MaxSequence() {
		return 0, 0, fmt.Errorf("--seq-len %d: the model takes at most %d tokens", o.SeqLen, c.MaxSequence())
	}
	var docs []string
	for _, path := range texts {
		d, err := readDocs(path)
		if err != nil {
			return 0, 0, err
		}
		docs = append(docs, d...)
	}
	m := bert.Encoder{Model: &encoder.Model{Config: c}}
	if pad, ok := tok.Pad(); !ok || pad != c.PadTokenID {
		return 0, 0, fmt.Errorf("tokenizer %s is not in RoBERTa's layout (padding id 1): make it with finetune pretrain tokenizer --layout roberta", tokDir)
	}
	rows, maskID, err := bert.MaskedLMRows(docs, tok, o.SeqLen, m)
	if err != nil {
		return 0, 0, err
	}
	var train, held [][]int
	for i, r := range rows {
		if i%50 == 49 {
			held = append(held, r)
		} else {
			train = append(train, r)
		}
	}
	trainEx, err := bert.MaskedLMExamples(train, o.SeqLen, c.PadTokenID)
	if err != nil {
		return 0, 0, err
	}
	heldEx, err := bert.MaskedLMExamples(held, o.SeqLen, c.PadTokenID)
	if err != nil {
		return 0, 0, err
	}
	special := bert.SpecialIDs(tok)
	heldEx["input_ids"], heldEx["labels"] = bert.Mask(heldEx["input_ids"], heldEx["attention_mask"],
		rand.New(rand.NewPCG(o.Seed, 0x4e1d)), maskID, c.VocabSize, special)

	cj, err := c.JSON()
	if err != nil {
		return 0, 0, err
	}
	initDir, err := os.MkdirTemp("", "memfit-roberta-init-")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(initDir)
	start := encoder.RandomParams(c, o.Seed)
	if o.From != "" {
		fc, err := encoder.LoadConfig(o.From)
		if err != nil {
			return 0, 0, err
		}
		if fj, _ := fc.JSON(); string(fj) != string(cj) {
			return 0, 0, fmt.Errorf("--from %s is not the shipped RoBERTa's architecture for this tokenizer (RobertaConfig(%d))", o.From, c.VocabSize)
		}
		if start, err = encoder.LoadParams(o.From, c); err != nil {
			return 0, 0, err
		}
	}
	if err := models.SaveCheckpoint(initDir, cj, start, 0); err != nil {
		return 0, 0, err
	}
	cfg := finetune.Defaults()
	cfg.Method, cfg.LoRARank, cfg.LoRAAlpha, cfg.LoRATarget = finetune.MethodFull, 0, 0, nil
	cfg.LR, cfg.Steps, cfg.BatchSize, cfg.Seed = o.LR, o.Steps, o.BatchSize, o.Seed
	cfg.Schedule, cfg.WarmupSteps, cfg.WeightDecay, cfg.ClipNorm = "linear", max(1, o.Steps*6/100), 0.01, 1
	loader, err := finetune.NewLoader(trainEx, cfg.BatchSize, cfg.Seed, true)
	if err != nil {
		return 0, 0, err
	}
	data := bert.NewMaskedLM(loader, cfg.Seed, maskID, c.VocabSize, special)
	res, err := finetune.Recipe{Spec: finetune.RunSpec{Model: initDir, Config: cfg}, Data: data, Backend: backend,
		Hooks: finetune.RunHooks{Hooks: finetune.Hooks{OnStep: o.OnStep}}}.Run(ctx)
	if err != nil {
		return 0, 0, err
	}
	tr := res.Trainer
	defer tr.Release()
	if loss, err = tr.MeanLoss(heldEx, o.BatchSize); err != nil {
		return 0, 0, err
	}
	params := models.Params{}
	for name, v := range tr.Train {
		params[name] = v
	}
	if err := models.SaveCheckpoint(out, cj, params, 0); err != nil {
		return 0, 0, err
	}
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		src, dst := filepath.Join(tokDir, name), filepath.Join(out, name)
		if mustAbs(src) == mustAbs(dst) {
			continue
		}
		b, err := readfile.Read(src, readfile.Tokenizer)
		if err != nil {
			return 0, 0, err
		}
		if err := writeFile(dst, b); err != nil {
			return 0, 0, err
		}
	}
	return loss, math.Exp(loss), nil
}
