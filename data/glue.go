package data

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// GLUE task names.
const (
	CoLA = "cola"
	SST2 = "sst2"
	MRPC = "mrpc"
	STSB = "stsb"
	RTE  = "rte"
)

// GLUETasks lists the supported tasks.
var GLUETasks = []string{CoLA, SST2, MRPC, STSB, RTE}

// GLUEExample is one example of a GLUE task: one sentence (TextB empty) or a pair, with a class label or (STS-B)
// a similarity score in [0, 5].
type GLUEExample struct {
	TextA, TextB string
	Label        int
	Score        float64
}

// Encoder encodes text into token ids with the tokenizer's special tokens (tokenizer.Tokenizer is one).
type Encoder interface {
	Encode(text string, addSpecial bool) []int
	EncodePair(a, b string, addSpecial bool) []int
}

// TokenIDs encodes the example for sequence classification: one sentence, or a pair with the tokenizer's pair
// template (memfit's own and Llama tokenizers have BOS A BOS B; joined with a newline otherwise). Training (finetune) and evaluation
// (evals) both encode with it, so they see the same inputs.
func (e GLUEExample) TokenIDs(enc Encoder) []int {
	if e.TextB == "" {
		return enc.Encode(e.TextA, true)
	}
	return enc.EncodePair(e.TextA, e.TextB, true)
}

// GLUEInfo describes a task: its folder under the GLUE data root, its classes (none for the regression task
// STS-B) and whether its inputs are pairs.
type GLUEInfo struct {
	Dir        string
	Classes    []string
	Pair       bool
	Regression bool
}

// GLUETask returns the description of task.
func GLUETask(task string) (GLUEInfo, error) {
	switch task {
	case CoLA:
		return GLUEInfo{Dir: "CoLA", Classes: []string{"unacceptable", "acceptable"}}, nil
	case SST2:
		return GLUEInfo{Dir: "SST-2", Classes: []string{"negative", "positive"}}, nil
	case MRPC:
		return GLUEInfo{Dir: "MRPC", Classes: []string{"not_equivalent", "equivalent"}, Pair: true}, nil
	case STSB:
		return GLUEInfo{Dir: "STS-B", Pair: true, Regression: true}, nil
	case RTE:
		return GLUEInfo{Dir: "RTE", Classes: []string{"entailment", "not_entailment"}, Pair: true}, nil
	}
	if task == "" {
		return GLUEInfo{}, fmt.Errorf("GLUE data needs its task: name it with --task (%s), or give the task's folder (e.g. glue/SST-2)", strings.Join(GLUETasks, ", "))
	}
	return GLUEInfo{}, fmt.Errorf("unknown GLUE task %q (have %s)", task, strings.Join(GLUETasks, ", "))
}

// GLUETaskOfFolder returns the task whose folder path is (its name is the task's folder name, SST-2, RTE, ..., in
// any case, and it holds the task's train or dev files), or "".
func GLUETaskOfFolder(path string) string {
	base := filepath.Base(filepath.Clean(path))
	for _, t := range GLUETasks {
		info, _ := GLUETask(t)
		if !strings.EqualFold(base, info.Dir) {
			continue
		}
		for _, split := range []string{"train", "dev"} {
			if _, err := GLUEFiles(filepath.Dir(filepath.Clean(path)), t, split); err == nil {
				return t
			}
			// GLUEFiles looks for the task folder by its canonical name; a folder named in another case is tried as it is.
			if _, err := os.Stat(filepath.Join(path, split+".tsv")); err == nil {
				return t
			}
		}
	}
	return ""
}

// IsGLUE reports whether the folder path is GLUE data in the layout of ../shared/data/glue: a task's folder
// (GLUETaskOfFolder), or a root holding one.
func IsGLUE(path string) bool {
	if GLUETaskOfFolder(path) != "" {
		return true
	}
	for _, t := range GLUETasks {
		info, _ := GLUETask(t)
		if GLUETaskOfFolder(filepath.Join(path, info.Dir)) != "" {
			return true
		}
	}
	return false
}

// GLUEFiles returns the files of a task's split ("train" or "dev") under root, in the layouts of
// ../shared/data/glue: official SST-2/RTE/STS-B TSVs, the original 4-column CoLA TSVs (train = train.tsv +
// val.tsv, as GLUE's training set), and for MRPC the original Microsoft corpus files (train =
// msr_paraphrase_train.txt; "dev" = msr_paraphrase_test.txt, since GLUE's MRPC dev ids are not part of the data).
func GLUEFiles(root, task, split string) ([]string, error) {
	info, err := GLUETask(task)
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(root, info.Dir)
	var names []string
	switch {
	case task == MRPC && split == "train":
		names = []string{"msr_paraphrase_train.txt"}
	case task == MRPC && split == "dev":
		names = []string{"msr_paraphrase_test.txt"}
	case (task == CoLA || task == RTE) && split == "train":
		names = []string{"train.tsv", "val.tsv"}
	case split == "train" || split == "dev":
		names = []string{split + ".tsv"}
	default:
		return nil, fmt.Errorf("GLUE split must be train or dev, got %q", split)
	}
	var out []string
	for _, n := range names {
		p := filepath.Join(dir, n)
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("GLUE %s %s: %w (expected the layout of ../shared/data/glue under %s)", task, split, err, root)
		}
		out = append(out, p)
	}
	return out, nil
}

// ReadGLUE reads a task's split from the GLUE data root (see GLUEFiles); a malformed row or a line longer than
// MaxLineBytes is an error naming the file and line.
func ReadGLUE(root, task, split string) ([]GLUEExample, error) {
	files, err := GLUEFiles(root, task, split)
	if err != nil {
		return nil, err
	}
	info, _ := GLUETask(task)
	var out []GLUEExample
	for _, path := range files {
		raw, err := ReadTextFile(path)
		if err != nil {
			return nil, err
		}
		text := strings.TrimPrefix(raw, "\ufeff")
		lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
		for i, line := range lines {
			if strings.TrimSpace(line) == "" {
				continue
			}
			cols := strings.Split(line, "\t")
			bad := func(format string, args ...any) error {
				return fmt.Errorf("%s:%d: %s", path, i+1, fmt.Sprintf(format, args...))
			}
			var ex GLUEExample
			switch task {
			case SST2:
				if i == 0 && cols[0] == "sentence" {
					continue
				}
				if len(cols) != 2 {
					return nil, bad("want 2 tab-separated columns (sentence, label), got %d", len(cols))
				}
				ex.TextA = strings.TrimSpace(cols[0])
				if ex.Label, err = classLabel(cols[1], 2); err != nil {
					return nil, bad("%v", err)
				}
			case CoLA:
				if len(cols) != 4 {
					return nil, bad("want 4 tab-separated columns (source, label, original label, sentence), got %d", len(cols))
				}
				ex.TextA = strings.TrimSpace(cols[3])
				if ex.Label, err = classLabel(cols[1], 2); err != nil {
					return nil, bad("%v", err)
				}
			case RTE:
				if i == 0 && cols[0] == "index" {
					continue
				}
				if len(cols) != 4 {
					return nil, bad("want 4 tab-separated columns (index, sentence1, sentence2, label), got %d", len(cols))
				}
				ex.TextA, ex.TextB = cols[1], cols[2]
				switch strings.TrimSpace(cols[3]) {
				case "entailment":
					ex.Label = 0
				case "not_entailment":
					ex.Label = 1
				default:
					return nil, bad("label %q is neither entailment nor not_entailment", cols[3])
				}
			case STSB:
				if i == 0 && cols[0] == "index" {
					continue
				}
				if len(cols) < 10 {
					return nil, bad("want 10 tab-separated columns (score last), got %d", len(cols))
				}
				ex.TextA, ex.TextB = cols[7], cols[8]
				if ex.Score, err = strconv.ParseFloat(strings.TrimSpace(cols[len(cols)-1]), 64); err != nil || !ValidScore(ex.Score) {
					return nil, bad("score %q is not a number in [0, 5]", cols[len(cols)-1])
				}
			case MRPC:
				if i == 0 && strings.HasPrefix(cols[0], "Quality") {
					continue
				}
				if len(cols) != 5 {
					return nil, bad("want 5 tab-separated columns (quality, id1, id2, string1, string2), got %d", len(cols))
				}
				ex.TextA, ex.TextB = cols[3], cols[4]
				if ex.Label, err = classLabel(cols[0], 2); err != nil {
					return nil, bad("%v", err)
				}
			}
			_ = info
			out = append(out, ex)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("GLUE %s %s: no examples in %v", task, split, files)
	}
	return out, nil
}

// ValidScore reports whether s is an STS-B similarity score: a number in [0, 5] (NaN is not one: it passes both
// comparisons, and would make the loss NaN steps later).
func ValidScore(s float64) bool { return s >= 0 && s <= 5 }

func classLabel(s string, n int) (int, error) {
	v, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil || v < 0 || v >= n {
		return 0, fmt.Errorf("label %q is not one of 0..%d", s, n-1)
	}
	return v, nil
}
