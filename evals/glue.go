package evals

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/gomlx/gomlx/core/tensors"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/runner"
	"github.com/memfit/memfit/tokenizer"
)

// GLUEResult holds a task's metrics on its dev set.
type GLUEResult struct {
	Task     string             `json:"task"`
	Examples int                `json:"examples"`
	Metrics  map[string]float64 `json:"metrics"`
	// Majority is the accuracy of always predicting the most frequent dev label (classification tasks).
	Majority float64 `json:"majority_baseline,omitempty"`
	// DataSHA256 hashes the dev files read.
	DataSHA256 string `json:"data_sha256"`
	Source     string `json:"source"`
}

// ScoreGLUE computes a task's metrics: CoLA Matthews correlation; STS-B Pearson and Spearman; MRPC accuracy and
// F1; SST-2 and RTE accuracy (always reported too for the classification tasks). preds are class indices (as
// float64) or, for STS-B, scores.
func ScoreGLUE(task string, gold []data.GLUEExample, preds []float64) (GLUEResult, error) {
	info, err := data.GLUETask(task)
	if err != nil {
		return GLUEResult{}, err
	}
	if len(preds) != len(gold) {
		return GLUEResult{}, fmt.Errorf("%d predictions for the %d examples of the %s dev set", len(preds), len(gold), task)
	}
	r := GLUEResult{Task: task, Examples: len(gold), Metrics: map[string]float64{}}
	if info.Regression {
		g := make([]float64, len(gold))
		for i, e := range gold {
			g[i] = e.Score
		}
		if r.Metrics["pearson"], err = Pearson(preds, g); err != nil {
			return r, err
		}
		r.Metrics["spearman"], err = Spearman(preds, g)
		return r, err
	}
	p, g := make([]int, len(gold)), make([]int, len(gold))
	counts := map[int]int{}
	for i, e := range gold {
		g[i] = e.Label
		counts[e.Label]++
		if preds[i] != float64(int(preds[i])) || int(preds[i]) < 0 || int(preds[i]) >= len(info.Classes) {
			return r, fmt.Errorf("prediction %d (%g) is not a class of %s (0..%d)", i+1, preds[i], task, len(info.Classes)-1)
		}
		p[i] = int(preds[i])
	}
	top := 0
	for _, c := range counts {
		top = max(top, c)
	}
	r.Majority = float64(top) / float64(len(gold))
	if r.Metrics["accuracy"], err = Accuracy(p, g); err != nil {
		return r, err
	}
	switch task {
	case data.CoLA:
		r.Metrics["matthews_correlation"], err = MatthewsCorrelation(p, g)
	case data.MRPC:
		r.Metrics["f1"], err = F1(p, g)
	}
	return r, err
}

// ReadPredictions reads a predictions file: one class index (or, for STS-B, a score) per line, in dev-set order
// (a line longer than data.MaxLineBytes is an error naming the file and line).
func ReadPredictions(path string) ([]float64, error) {
	raw, err := data.ReadTextFile(path)
	if err != nil {
		return nil, err
	}
	var out []float64
	for i, line := range strings.Split(strings.TrimRight(raw, "\n"), "\n") {
		line = strings.TrimSpace(line)
		v, err := strconv.ParseFloat(line, 64)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %q is not a number", path, i+1, line)
		}
		out = append(out, v)
	}
	return out, nil
}

// DevHash returns a SHA-256 over a GLUE task's dev files.
func DevHash(root, task string) (string, error) {
	files, err := data.GLUEFiles(root, task, "dev")
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, f := range files {
		b, err := data.ReadTextFile(f)
		if err != nil {
			return "", err
		}
		io.WriteString(h, b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// GLUEEncoder is a sequence classifier that encodes GLUE examples itself: an encoder (BERT, RoBERTa) reads each
// sentence or pair with its tokenizer's template and token type ids, truncated as transformers' truncation=True
// does. PredictGLUE asks it for each batch's inputs (without labels); other classifiers get
// data.GLUEExample.TokenIDs cut at seqLen and padded with their pad id.
type GLUEEncoder interface {
	GLUEInputs(tok *tokenizer.Tokenizer, examples []data.GLUEExample, seqLen int) (runner.Batch, error)
}

// PredictGLUE runs a sequence classifier (models.TextModel) over examples (encoded by the model when it is a
// GLUEEncoder, else by data.GLUEExample.TokenIDs, cut at seqLen, padded with the model's pad token) and returns
// the predicted class indices, or the scores of a one-label regression model. A NaN or infinite logit is an error
// naming the example.
func PredictGLUE(lr *runner.LogitsRunner, tok *tokenizer.Tokenizer, examples []data.GLUEExample, seqLen, batchSize int, progress func(done, total int)) ([]float64, error) {
	m, ok := lr.Model.(models.TextModel)
	if !ok || m.TextSpec().Task != models.TaskSeqCls {
		return nil, fmt.Errorf("GLUE prediction needs a sequence classifier over token ids")
	}
	pad := max(m.TextSpec().PadID, 0)
	enc, encodes := lr.Model.(GLUEEncoder)
	var out []float64
	for start := 0; start < len(examples); start += batchSize {
		chunk := examples[start:min(len(examples), start+batchSize)]
		// Full batches keep one graph shape; the last one is padded with copies of its first row.
		rows := append([]data.GLUEExample(nil), chunk...)
		for len(rows) < batchSize {
			rows = append(rows, rows[0])
		}
		var ex map[string]*tensors.Tensor
		var err error
		if encodes {
			ex, err = enc.GLUEInputs(tok, rows, seqLen)
		} else {
			ids := make([][]int, len(rows))
			for i, e := range rows {
				ids[i] = tokenizer.Truncate(e.TokenIDs(tok), seqLen, tokenizer.Right)
			}
			ex, err = data.TokenExamples(ids, nil, seqLen, pad)
		}
		if err != nil {
			return nil, err
		}
		delete(ex, "labels")
		logits, err := lr.Logits(runner.Batch(ex))
		for _, t := range ex {
			t.MustFinalizeAll()
		}
		if err != nil {
			return nil, err
		}
		dims := logits.Shape().Dimensions
		var bad error
		err = tensors.ConstFlatData[float32](logits, func(f []float32) {
			for i := range chunk {
				row := f[i*dims[1] : (i+1)*dims[1]]
				if dims[1] == 1 {
					out = append(out, float64(row[0]))
					continue
				}
				best := 0
				for c, v := range row {
					if v > row[best] {
						best = c
					}
				}
				out = append(out, float64(best))
				for _, v := range row {
					if v-v != 0 && bad == nil { // NaN or an infinity
						bad = fmt.Errorf("GLUE example %d: the classifier's logits are not finite (%v): its weights or adapter hold NaN or infinite values, or its activations overflow; no metric is reported", start+i+1, v)
					}
				}
			}
		})
		logits.MustFinalizeAll()
		if err == nil {
			err = bad
		}
		if err != nil {
			return nil, err
		}
		if progress != nil {
			progress(len(out), len(examples))
		}
	}
	return out, nil
}
