package pretrained

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/gomlx/compute"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/family/llama"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/internal/readfile"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/models/decoder"
	"github.com/memfit/memfit/tokenizer"
)

// LlamaConfig is the shipped LLaMA's architecture for a tokenizer of vocab tokens (BOS, EOS and pad the last
// three): hidden 128, 4 layers of 4 query and 2 key/value heads of 32, SwiGLU MLP 352, RoPE, 512 positions,
// tied embeddings.
func LlamaConfig(vocab, bos, eos, pad int) decoder.Config {
	return decoder.Config{VocabSize: vocab, HiddenSize: 128, IntermediateSize: 352, NumHiddenLayers: 4, NumAttentionHeads: 4,
		NumKeyValueHeads: 2, HeadDim: 32, MaxPositionEmbeddings: 512, RMSNormEps: 1e-5, RopeTheta: 10000,
		TieWordEmbeddings: true, PadTokenID: pad, BOSTokenID: bos, EOSTokenID: eos, Task: decoder.CausalLM}
}

// PretrainLlamaOptions configure PretrainLlama.
type PretrainLlamaOptions struct {
	Steps, BatchSize, SeqLen int
	LR                       float64
	Seed                     uint64
	OnStep                   func(finetune.StepStats)
}

// PretrainLlama trains LlamaConfig from random initialisation as a causal LM on texts (each .txt file split
// into paragraphs, each Alpaca .jsonl row's fields joined by newlines), encoded with the tokenizer in tokDir,
// packed into blocks of SeqLen tokens with EOS between documents; 2% of the blocks (every 50th) are held out. It
// writes config.json, model.safetensors and the tokenizer files to out and returns the held-out loss and
// perplexity.
func PretrainLlama(ctx context.Context, backend compute.Backend, tokDir string, texts []string, out string, o PretrainLlamaOptions) (loss, ppl float64, err error) {
	tok, err := tokenizer.Load(tokDir)
	if err != nil {
		return 0, 0, err
	}
	bos, _ := tok.BOS()
	eos, okE := tok.EOS()
	pad, okP := tok.Pad()
	if !okE || !okP {
		return 0, 0, fmt.Errorf("tokenizer %s needs EOS and padding tokens", tokDir)
	}
	var seqs [][]int
	for _, path := range texts {
		docs, err := readDocs(path)
		if err != nil {
			return 0, 0, err
		}
		for _, d := range docs {
			seqs = append(seqs, tok.Encode(d, false))
		}
	}
	blocks := data.Pack(seqs, eos, o.SeqLen)
	var train, held [][]int
	for i, b := range blocks {
		if i%50 == 49 {
			held = append(held, b)
		} else {
			train = append(train, b)
		}
	}
	trainEx, err := data.TokenExamples(train, nil, o.SeqLen, pad)
	if err != nil {
		return 0, 0, err
	}
	heldEx, err := data.TokenExamples(held, nil, o.SeqLen, pad)
	if err != nil {
		return 0, 0, err
	}
	c := LlamaConfig(tok.VocabSize(), bos, eos, pad)
	cj, err := llama.JSON(c)
	if err != nil {
		return 0, 0, err
	}
	initDir, err := os.MkdirTemp("", "memfit-llama-init-")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(initDir)
	if err := models.SaveCheckpoint(initDir, cj, decoder.RandomParams(c, o.Seed), 0); err != nil {
		return 0, 0, err
	}
	cfg := finetune.Defaults()
	cfg.Method, cfg.LoRARank, cfg.LoRATarget = finetune.MethodFull, 0, nil
	cfg.LR, cfg.Steps, cfg.BatchSize, cfg.Seed = o.LR, o.Steps, o.BatchSize, o.Seed
	cfg.Schedule, cfg.WarmupSteps, cfg.WeightDecay, cfg.ClipNorm = "cosine", o.Steps/20, 0.1, 1
	cfg.Attention = "memory-efficient"
	loader, err := finetune.NewLoader(finetune.Examples(trainEx), cfg.BatchSize, cfg.Seed, true)
	if err != nil {
		return 0, 0, err
	}
	res, err := finetune.Recipe{Spec: finetune.RunSpec{Model: initDir, Config: cfg}, Data: loader, Backend: backend,
		Hooks: finetune.RunHooks{Hooks: finetune.Hooks{OnStep: o.OnStep}}}.Run(ctx)
	if err != nil {
		return 0, 0, err
	}
	tr := res.Trainer
	if loss, err = tr.MeanLoss(finetune.Examples(heldEx), o.BatchSize); err != nil {
		return 0, 0, err
	}
	params := models.Params{}
	for n, v := range tr.Train {
		params[n] = v
	}
	if err := models.SaveCheckpoint(out, cj, params, 0); err != nil {
		return 0, 0, err
	}
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json"} {
		src := filepath.Join(tokDir, name)
		dst := filepath.Join(out, name)
		if abs1, _ := filepath.Abs(src); abs1 == mustAbs(dst) {
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

func mustAbs(p string) string {
	a, _ := filepath.Abs(p)
	return a
}

// readDocs reads training documents: a .jsonl file of Alpaca rows (fields joined by newlines) or a text file
// split into paragraphs.
func readDocs(path string) ([]string, error) {
	if strings.HasSuffix(path, ".jsonl") {
		rows, err := data.ReadInstructions(path)
		if err != nil {
			return nil, err
		}
		docs := make([]string, len(rows))
		for i, r := range rows {
			docs[i] = strings.Join(nonEmpty(r.Instruction, r.Input, r.Output), "\n")
		}
		return docs, nil
	}
	b, err := readfile.Read(path, readfile.Data)
	if err != nil {
		return nil, err
	}
	return data.Documents(string(b)), nil
}

func nonEmpty(s ...string) []string {
	var out []string
	for _, x := range s {
		if strings.TrimSpace(x) != "" {
			out = append(out, strings.TrimSpace(x))
		}
	}
	return out
}
