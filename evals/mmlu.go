package evals

import (
	"crypto/sha256"
	"encoding/csv"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/memfit/memfit/data"
)

// Letters are the MMLU answer letters.
var Letters = [4]string{"A", "B", "C", "D"}

// Question is one MMLU question.
type Question struct {
	Subject  string
	Question string
	Choices  [4]string
	// Answer is the index (0-3) of the right choice.
	Answer int
}

// Categories maps every MMLU subject to its category (STEM, humanities, social sciences, other), as in the
// original MMLU code's categories.py (subcategory -> category; anatomy and the other health subjects are
// "other").
var Categories = func() map[string]string {
	m := map[string]string{}
	for cat, subjects := range map[string][]string{
		"STEM": {"abstract_algebra", "astronomy", "college_biology", "college_chemistry", "college_computer_science",
			"college_mathematics", "college_physics", "computer_security", "conceptual_physics", "electrical_engineering",
			"elementary_mathematics", "high_school_biology", "high_school_chemistry", "high_school_computer_science",
			"high_school_mathematics", "high_school_physics", "high_school_statistics", "machine_learning"},
		"humanities": {"formal_logic", "high_school_european_history", "high_school_us_history", "high_school_world_history",
			"international_law", "jurisprudence", "logical_fallacies", "moral_disputes", "moral_scenarios", "philosophy",
			"prehistory", "professional_law", "world_religions"},
		"social sciences": {"econometrics", "high_school_geography", "high_school_government_and_politics",
			"high_school_macroeconomics", "high_school_microeconomics", "high_school_psychology", "human_sexuality",
			"professional_psychology", "public_relations", "security_studies", "sociology", "us_foreign_policy"},
		"other": {"anatomy", "business_ethics", "clinical_knowledge", "college_medicine", "global_facts", "human_aging",
			"management", "marketing", "medical_genetics", "miscellaneous", "nutrition", "professional_accounting",
			"professional_medicine", "virology"},
	} {
		for _, s := range subjects {
			m[s] = cat
		}
	}
	return m
}()

// Subjects returns the 57 MMLU subjects, sorted.
func Subjects() []string {
	out := make([]string, 0, len(Categories))
	for s := range Categories {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// MMLUFile returns the path of a subject's split in an MMLU folder: <dir>/<split>/<subject>_<split>.csv.
func MMLUFile(dir, split, subject string) string {
	return filepath.Join(dir, split, subject+"_"+split+".csv")
}

// ReadMMLUFile reads one subject's CSV in either layout: with the header question,choice0..choice3,answer
// (answer an index 0-3, as ../shared/data/mmlu), or the original layout without header (answer a letter A-D). A
// line longer than data.MaxLineBytes is an error naming the file and line.
func ReadMMLUFile(path, subject string) ([]Question, error) {
	raw, err := data.ReadTextFile(path)
	if err != nil {
		return nil, err
	}
	return parseMMLU(raw, path, subject)
}

// parseMMLU parses the CSV text raw of the file path (ReadMMLUFile).
func parseMMLU(raw, path, subject string) ([]Question, error) {
	r := csv.NewReader(strings.NewReader(raw))
	r.FieldsPerRecord = 6
	var out []Question
	for line := 1; ; line++ {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %v", path, err)
		}
		if line == 1 && rec[0] == "question" && rec[5] == "answer" {
			continue
		}
		q := Question{Subject: subject, Question: rec[0]}
		copy(q.Choices[:], rec[1:5])
		a := strings.TrimSpace(rec[5])
		if n, err := strconv.Atoi(a); err == nil && n >= 0 && n < 4 {
			q.Answer = n
		} else if len(a) == 1 && a[0] >= 'A' && a[0] <= 'D' {
			q.Answer = int(a[0] - 'A')
		} else {
			return nil, fmt.Errorf("%s: row %d: answer %q is neither 0-3 nor A-D", path, line, a)
		}
		out = append(out, q)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no questions", path)
	}
	return out, nil
}

// SubjectName is how a subject appears in the prompt: underscores become spaces.
func SubjectName(subject string) string { return strings.ReplaceAll(subject, "_", " ") }

// PromptFormat describes the prompt, for the results file.
const PromptFormat = "The following are multiple choice questions (with answers) about {subject}.\\n\\n" +
	"then per shot: {question}\\nA. {choice0}\\nB. {choice1}\\nC. {choice2}\\nD. {choice3}\\nAnswer: {letter}\\n\\n, " +
	"then the question the same way ending in \"Answer:\"; scored continuations \" A\"..\" D\""

// Prompt is the MMLU k-shot prompt (lm-evaluation-harness' format, the original MMLU code's with the question
// stripped of surrounding spaces): a header naming the subject, each shot with its answer, then the question
// ending in "Answer:".
func Prompt(subject string, shots []Question, q Question) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "The following are multiple choice questions (with answers) about %s.\n\n", SubjectName(subject))
	for _, s := range shots {
		writeQuestion(&sb, s)
		fmt.Fprintf(&sb, " %s\n\n", Letters[s.Answer])
	}
	writeQuestion(&sb, q)
	return sb.String()
}

func writeQuestion(sb *strings.Builder, q Question) {
	sb.WriteString(strings.TrimSpace(q.Question))
	for i, c := range q.Choices {
		fmt.Fprintf(sb, "\n%s. %s", Letters[i], c)
	}
	sb.WriteString("\nAnswer:")
}

// Tokenizer encodes text (the tokenizer package's Tokenizer satisfies it).
type Tokenizer interface {
	Encode(text string, addSpecial bool) []int
}

// LM scores next tokens.
type LM interface {
	// NextLogProbs returns, for each context, the log-probabilities (log-softmax over the vocabulary) of the
	// candidate ids as the token following the context.
	NextLogProbs(contexts [][]int, candidates [][]int) ([][]float64, error)
}

// Generator continues contexts greedily (ModelLM through runner.Generator, the runner `finetune generate`
// uses).
type Generator interface {
	Greedy(contexts [][]int, maxNew int) ([][]int, error)
}

// TextDecoder turns ids back into text (the tokenizer package's Tokenizer satisfies it).
type TextDecoder interface {
	Decode(ids []int, skipSpecial bool) string
}

// GenerateTokens is how many tokens MMLU's generation scoring decodes after "Answer:".
const GenerateTokens = 2

// GeneratedAnswer returns the choice (0-3) a generated reply gives: its first character after leading spaces,
// when it is one of the letters A-D; -1 otherwise (no answer, counted wrong).
func GeneratedAnswer(text string) int {
	text = strings.TrimLeft(text, " \t\n")
	for i, l := range Letters {
		if strings.HasPrefix(text, l) {
			return i
		}
	}
	return -1
}

// MMLUOptions configure EvalMMLU.
type MMLUOptions struct {
	// Generate also scores by generation: the model decodes GenerateTokens tokens greedily after each prompt
	// and the answer is the letter its reply starts with (lm-evaluation-harness's generative MMLU style); the
	// LM must be a Generator and the tokenizer a TextDecoder. The prompts are cut GenerateTokens shorter than
	// MaxLen, so prompt and reply fit the positions.
	Generate bool
	// Shots is the number of dev questions used as examples (the first ones of the subject): 0 means 5, the
	// default; a negative number means zero-shot.
	Shots int
	// MaxLen truncates longer prompts from the left (keeping a leading BOS), as the harness does; 0: no limit.
	MaxLen int
	// BatchSize is the number of prompts scored together (8 by default).
	BatchSize int
	// Progress is called after each batch with the questions done and the total.
	Progress func(done, total int)
}

// SubjectResult is one subject's (or category's) accuracy under both scorings.
type SubjectResult struct {
	Questions int `json:"questions"`
	// LogLikelihood picks the choice whose continuation " X" has the highest log-likelihood (harness style);
	// Letter picks the highest of the four letter tokens "A".."D" at the answer position (QLoRA-script style).
	LogLikelihood float64 `json:"acc_loglikelihood"`
	Letter        float64 `json:"acc_letter"`
	// Generate is the accuracy of the answers read from greedy generation (with MMLUOptions.Generate).
	Generate *float64 `json:"acc_generate,omitempty"`
}

// MMLUResult is what EvalMMLU reports.
type MMLUResult struct {
	Shots        int    `json:"shots"`
	PromptFormat string `json:"prompt_format"`
	Averaging    string `json:"averaging"`
	// Micro averages over questions (lm-evaluation-harness); Macro over subjects (the QLoRA scripts).
	Micro       SubjectResult            `json:"micro"`
	Macro       SubjectResult            `json:"macro"`
	BySubject   map[string]SubjectResult `json:"by_subject"`
	ByCategory  map[string]SubjectResult `json:"by_category"`
	Truncated   int                      `json:"truncated_prompts"`
	Seconds     float64                  `json:"seconds"`
	PerSecond   float64                  `json:"questions_per_second"`
	Predictions map[string][]int         `json:"-"`
	// Generated holds, with MMLUOptions.Generate, each question's generated tokens by subject.
	Generated map[string][][]int `json:"-"`
}

// NonFiniteError is EvalMMLU's error when a score is NaN or infinite: a model or adapter with NaN or infinite
// weights, or one whose activations overflow. Accuracies over such scores would be numbers (argmax picks the
// first choice), not results, so none are reported.
type NonFiniteError struct {
	// Subject and Question (its 0-based index in the subject's test questions) name the question; Candidate is
	// the scored continuation (0-3: " A".." D", 4-7: the letters "A".."D"), Value its log-likelihood.
	Subject   string
	Question  int
	Candidate int
	Value     float64
}

func (e *NonFiniteError) Error() string {
	return fmt.Sprintf("MMLU %s question %d: the model's log-likelihood scores are not finite (%v): its weights or adapter hold NaN or infinite values, or its activations overflow; no accuracy is reported",
		e.Subject, e.Question+1, e.Value)
}

// EvalMMLU scores the test questions of each subject in test with shots from dev. A NaN or infinite score stops it
// with a *NonFiniteError (and scoring by generation with runner's *NonFiniteError).
func EvalMMLU(lm LM, tok Tokenizer, dev, test map[string][]Question, o MMLUOptions) (*MMLUResult, error) {
	if o.Shots == 0 {
		o.Shots = 5
	}
	if o.Shots < 0 {
		o.Shots = 0
	}
	if o.BatchSize <= 0 {
		o.BatchSize = 8
	}
	// Continuation and letter token ids.
	var cont, letters [4]int
	for i, l := range Letters {
		ctx := tok.Encode("Answer:", false)
		full := tok.Encode("Answer: "+l, false)
		if len(full) != len(ctx)+1 || !equalInts(full[:len(ctx)], ctx) {
			return nil, fmt.Errorf("the continuation \" %s\" is not a single token after \"Answer:\" for this tokenizer", l)
		}
		cont[i] = full[len(full)-1]
		ids := tok.Encode(l, false)
		letters[i] = ids[len(ids)-1]
	}
	var gen Generator
	var detok TextDecoder
	maxLen := o.MaxLen
	if o.Generate {
		var ok1, ok2 bool
		gen, ok1 = lm.(Generator)
		detok, ok2 = tok.(TextDecoder)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("scoring by generation needs a model that generates and a tokenizer that decodes")
		}
		if maxLen > 0 {
			if maxLen -= GenerateTokens; maxLen < 2 {
				return nil, fmt.Errorf("prompts of at most %d tokens leave no room for %d generated ones", o.MaxLen, GenerateTokens)
			}
		}
	}
	cands := append(cont[:], letters[:]...)
	subjects := make([]string, 0, len(test))
	total := 0
	for s := range test {
		subjects = append(subjects, s)
		total += len(test[s])
	}
	sort.Strings(subjects)
	type item struct {
		subject string
		index   int
		ctx     []int
	}
	var items []item
	res := &MMLUResult{Shots: o.Shots, PromptFormat: PromptFormat, BySubject: map[string]SubjectResult{},
		ByCategory: map[string]SubjectResult{}, Predictions: map[string][]int{},
		Averaging: "micro: over all questions (lm-evaluation-harness); macro: mean of the subjects' accuracies (QLoRA scripts)"}
	for _, s := range subjects {
		shots := dev[s]
		if len(shots) > o.Shots {
			shots = shots[:o.Shots]
		}
		if len(shots) < o.Shots {
			return nil, fmt.Errorf("subject %s has %d dev questions, fewer than %d shots", s, len(shots), o.Shots)
		}
		for i, q := range test[s] {
			ids := tok.Encode(Prompt(s, shots, q), true)
			if maxLen > 0 && len(ids) > maxLen {
				res.Truncated++
				ids = append([]int{ids[0]}, ids[len(ids)-maxLen+1:]...)
			}
			items = append(items, item{s, i, ids})
		}
	}
	correctLL := map[string]int{}
	correctL := map[string]int{}
	correctG := map[string]int{}
	if o.Generate {
		res.Generated = map[string][][]int{}
	}
	start := time.Now()
	for b := 0; b < len(items); b += o.BatchSize {
		batch := items[b:min(len(items), b+o.BatchSize)]
		ctxs := make([][]int, len(batch))
		cs := make([][]int, len(batch))
		for i, it := range batch {
			ctxs[i], cs[i] = it.ctx, cands
		}
		lp, err := lm.NextLogProbs(ctxs, cs)
		if err != nil {
			return nil, err
		}
		for i, it := range batch {
			for k, v := range lp[i] {
				if math.IsNaN(v) || math.IsInf(v, 0) {
					return nil, &NonFiniteError{Subject: it.subject, Question: it.index, Candidate: k, Value: v}
				}
			}
		}
		var replies [][]int
		if gen != nil {
			if replies, err = gen.Greedy(ctxs, GenerateTokens); err != nil {
				return nil, err
			}
		}
		for i, it := range batch {
			q := test[it.subject][it.index]
			ll, let := argmax(lp[i][:4]), argmax(lp[i][4:])
			if ll == q.Answer {
				correctLL[it.subject]++
			}
			if let == q.Answer {
				correctL[it.subject]++
			}
			res.Predictions[it.subject] = append(res.Predictions[it.subject], ll)
			if replies != nil {
				if GeneratedAnswer(detok.Decode(replies[i], true)) == q.Answer {
					correctG[it.subject]++
				}
				res.Generated[it.subject] = append(res.Generated[it.subject], replies[i])
			}
		}
		if o.Progress != nil {
			o.Progress(min(len(items), b+o.BatchSize), total)
		}
	}
	res.Seconds = time.Since(start).Seconds()
	if res.Seconds > 0 {
		res.PerSecond = float64(total) / res.Seconds
	}
	catN, catLL, catL, catG := map[string]int{}, map[string]int{}, map[string]int{}, map[string]int{}
	var sumLL, sumL, sumG float64
	acc := func(correct, n int) *float64 {
		if !o.Generate {
			return nil
		}
		a := float64(correct) / float64(n)
		return &a
	}
	correctAll := 0
	for _, s := range subjects {
		n := len(test[s])
		r := SubjectResult{Questions: n, LogLikelihood: float64(correctLL[s]) / float64(n), Letter: float64(correctL[s]) / float64(n),
			Generate: acc(correctG[s], n)}
		res.BySubject[s] = r
		sumLL += r.LogLikelihood
		sumL += r.Letter
		sumG += float64(correctG[s]) / float64(n)
		c := Categories[s]
		if c == "" {
			c = "unknown"
		}
		catN[c] += n
		catLL[c] += correctLL[s]
		catL[c] += correctL[s]
		catG[c] += correctG[s]
		correctAll += correctG[s]
		res.Micro.Questions += n
		res.Micro.LogLikelihood += float64(correctLL[s])
		res.Micro.Letter += float64(correctL[s])
	}
	if total > 0 {
		res.Micro.LogLikelihood /= float64(total)
		res.Micro.Letter /= float64(total)
		res.Micro.Generate = acc(correctAll, total)
		res.Macro = SubjectResult{Questions: total, LogLikelihood: sumLL / float64(len(subjects)), Letter: sumL / float64(len(subjects))}
		if o.Generate {
			g := sumG / float64(len(subjects))
			res.Macro.Generate = &g
		}
	}
	for c, n := range catN {
		res.ByCategory[c] = SubjectResult{Questions: n, LogLikelihood: float64(catLL[c]) / float64(n), Letter: float64(catL[c]) / float64(n),
			Generate: acc(catG[c], n)}
	}
	return res, nil
}

func argmax(x []float64) int {
	best := 0
	for i, v := range x {
		if v > x[best] || math.IsNaN(x[best]) {
			best = i
		}
	}
	return best
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// ReadMMLU reads the dev and test questions of the given subjects (all 57 when empty) from an MMLU folder, and
// returns a SHA-256 over the files read (in order) for the results file.
func ReadMMLU(dir string, subjects []string) (dev, test map[string][]Question, hash string, err error) {
	if len(subjects) == 0 {
		subjects = Subjects()
	}
	h := sha256.New()
	dev, test = map[string][]Question{}, map[string][]Question{}
	for _, s := range subjects {
		for _, split := range []string{"dev", "test"} {
			path := MMLUFile(dir, split, s)
			raw, err := data.ReadTextFile(path)
			if tl := (*data.LineTooLongError)(nil); errors.As(err, &tl) {
				return nil, nil, "", err
			}
			if err != nil {
				return nil, nil, "", fmt.Errorf("MMLU subject %s: %w (expected <data>/%s/%s_%s.csv)", s, err, split, s, split)
			}
			io.WriteString(h, raw)
			qs, err := parseMMLU(raw, path, s)
			if err != nil {
				return nil, nil, "", err
			}
			if split == "dev" {
				dev[s] = qs
			} else {
				test[s] = qs
			}
		}
	}
	return dev, test, hex.EncodeToString(h.Sum(nil)), nil
}
