package hfdata

import (
	"encoding/json"
	"fmt"
	"image"
	"strconv"
	"strings"

	"github.com/memfit/memfit/data"
)

// Texts reads the "text" column: one document per row (a causal LM's pretraining text), as stored. Null,
// empty and all-whitespace texts (the blank lines of line-per-row corpora such as wikitext) are skipped.
func (d *Dataset) Texts() ([]string, error) {
	var out []string
	_, err := d.each([]spec{{name: "text", kind: kString, what: "the text of a document"}}, func(_ string, r row) error {
		if s, ok := r[0].(string); ok && strings.TrimSpace(s) != "" {
			out = append(out, s)
		}
		return nil
	})
	if err == nil && len(out) == 0 {
		err = fmt.Errorf("%s: every text is null or blank", d.where())
	}
	return out, err
}

// Instructions reads Alpaca rows: "instruction" and "output" strings and an optional "input"; as for Alpaca
// JSONL (data.ReadInstructions), rows with a "status" other than "ok" are skipped, so the rows read are the
// rows the JSONL gives.
func (d *Dataset) Instructions() ([]data.Instruction, error) {
	specs := []spec{
		{name: "instruction", kind: kString, what: "the instruction of an Alpaca row"},
		{name: "input", kind: kString, optional: true, what: "the input of an Alpaca row"},
		{name: "output", kind: kString, what: "the response of an Alpaca row"},
		{name: "status", kind: kString, optional: true, what: "alpaca-libre's row status; rows other than ok are skipped"},
	}
	var out []data.Instruction
	skipped := 0
	n, err := d.each(specs, func(where string, r row) error {
		if st, ok := r[3].(string); ok && st != "ok" {
			skipped++
			return nil
		}
		ins, ok1 := r[0].(string)
		res, ok2 := r[2].(string)
		if !ok1 || !ok2 {
			return fmt.Errorf("%s: an Alpaca row needs \"instruction\" and \"output\" strings, this one has a null", where)
		}
		in, _ := r[1].(string)
		row := data.Instruction{Instruction: ins, Input: in, Output: res}
		if err := row.CheckPrompt(); err != nil {
			return fmt.Errorf("%s: %v", where, err)
		}
		out = append(out, row)
		return nil
	})
	if err == nil && len(out) == 0 {
		err = data.NoUsableRows(d.where(), n, skipped)
	}
	return out, err
}

// Conversations reads the "messages" column: a list of {role, content} per row, the OpenAI form that chat
// training takes, or ShareGPT's {from, value} (read with --columns messages=conversations; from human becomes
// role user, gpt assistant; another speaker is an error in ShareGPT's words). Each conversation, named by its file
// and row (Conversation.Where), is checked as the JSONL reader checks one (data.CheckConversation:
// known roles, string content, an assistant turn); a bad one, or a null or empty list, is an error naming its row.
func (d *Dataset) Conversations() ([]data.Conversation, error) {
	var out []data.Conversation
	_, err := d.each([]spec{{name: "messages", kind: kMessages, what: "a conversation"}}, func(where string, r row) error {
		msgs, _ := r[0].([]Message)
		if len(msgs) == 0 {
			return fmt.Errorf("%s: the conversation has no messages", where)
		}
		if err := data.CheckConversation(msgs); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		out = append(out, data.Conversation{Messages: msgs, Where: where})
		return nil
	})
	return out, err
}

// GLUE reads a GLUE task's rows as the Hugging Face "glue" dataset stores them: sentence + label (cola, sst2),
// sentence1 + sentence2 + label (mrpc, rte; stsb with a float score in [0, 5]). Labels are class indices as in
// the GLUE TSV path (rte: 0 entailment, 1 not_entailment); a label of -1 (the hub's unlabelled test rows) is an
// error naming the row.
func (d *Dataset) GLUE(task string) ([]data.GLUEExample, error) {
	info, err := data.GLUETask(task)
	if err != nil {
		return nil, err
	}
	labelKind, labelWhat := kInt, fmt.Sprintf("a GLUE %s row's class, 0..%d", task, len(info.Classes)-1)
	if info.Regression {
		labelKind, labelWhat = kNumber, "an STS-B row's similarity score, 0 to 5"
	}
	specs := []spec{{name: "sentence", kind: kString, what: "the sentence of a GLUE " + task + " row"}}
	if info.Pair {
		specs = []spec{{name: "sentence1", kind: kString, what: "the first sentence of a GLUE " + task + " row"},
			{name: "sentence2", kind: kString, what: "the second sentence of a GLUE " + task + " row"}}
	}
	specs = append(specs, spec{name: "label", kind: labelKind, what: labelWhat})
	var out []data.GLUEExample
	_, err = d.each(specs, func(where string, r row) error {
		var ex data.GLUEExample
		var ok bool
		if ex.TextA, ok = r[0].(string); !ok {
			return fmt.Errorf("%s: the sentence is null", where)
		}
		if info.Pair {
			if ex.TextB, ok = r[1].(string); !ok {
				return fmt.Errorf("%s: the second sentence is null", where)
			}
		}
		lv := r[len(r)-1]
		if info.Regression {
			s, ok := lv.(float64)
			if i, isInt := lv.(int64); isInt {
				s, ok = float64(i), true
			}
			if lv == nil {
				return fmt.Errorf("%s: the score is null (an unlabelled row): give every row a score in [0, 5]", where)
			}
			if !ok || !data.ValidScore(s) {
				return fmt.Errorf("%s: score %v is not a number in [0, 5]", where, lv)
			}
			ex.Score = s
		} else {
			l, ok := lv.(int64)
			if lv == nil {
				return fmt.Errorf("%s: the label is null (an unlabelled row): give every row a class, 0..%d", where, len(info.Classes)-1)
			}
			if ok && l >= int64(len(info.Classes)) {
				return fmt.Errorf("%s: label %d is not one of GLUE %s's classes 0..%d", where, l, task, len(info.Classes)-1)
			}
			if !ok || l < 0 {
				return fmt.Errorf("%s: label %v is not one of 0..%d (the hub marks unlabelled test rows -1: train on a labelled split)", where, lv, len(info.Classes)-1)
			}
			ex.Label = int(l)
		}
		out = append(out, ex)
		return nil
	})
	return out, err
}

// classNames returns the class names the file stores for a ClassLabel column (the "huggingface" key of its
// metadata, which `datasets` writes), or nil when it stores none. Metadata that is not JSON is an error: the
// names cannot be read, and the file was not written by `datasets` as it says.
func classNames(f *file, column string) ([]string, error) {
	raw, ok := f.pf.Lookup("huggingface")
	if !ok {
		return nil, nil
	}
	if !json.Valid([]byte(raw)) {
		return nil, fmt.Errorf("%s: its \"huggingface\" metadata (the features `datasets` writes, with the class names) is not JSON: rewrite the file with datasets, or without that key", f.path)
	}
	var meta struct {
		Info struct {
			Features map[string]json.RawMessage `json:"features"`
		} `json:"info"`
	}
	var feature struct {
		Type  string   `json:"_type"`
		Names []string `json:"names"`
	}
	if json.Unmarshal([]byte(raw), &meta) != nil || json.Unmarshal(meta.Info.Features[column], &feature) != nil || feature.Type != "ClassLabel" {
		return nil, nil // features of another shape, or the label is not a ClassLabel: no names
	}
	return feature.Names, nil
}

// maxClasses bounds an image label (the class names memfit makes for labels without names take memory by it).
const maxClasses = 1 << 20

// Images reads an image classification dataset: the "image" column (struct{bytes, path} as `datasets` stores
// an Image feature, or binary) and the "label" column (class indices). The encoded bytes are kept in memory
// (as an image tar's are) and decoded a batch at a time by data.ImageLoader. The class names are the label
// feature's names in the file's `datasets` metadata, or "0".."K-1" for K = the largest label + 1.
func (d *Dataset) Images() (*Images, error) {
	specs := []spec{{name: "image", kind: kImage, what: "the encoded PNG or JPEG image"},
		{name: "label", kind: kInt, what: "the class index of the image"}}
	imgs := &Images{}
	maxLabel := int64(-1)
	_, err := d.each(specs, func(where string, r row) error {
		img, ok := r[0].(Image)
		if !ok || len(img.Bytes) == 0 {
			return fmt.Errorf("%s: the image has no bytes (datasets stores a path-only image when it was not embedded: save the dataset with embed_external_files)", where)
		}
		l, ok := r[1].(int64)
		switch {
		case !ok:
			return fmt.Errorf("%s: the label is null (an unlabelled row): give every image a class index", where)
		case l < 0:
			return fmt.Errorf("%s: label %d is not a class index (0 or more; the hub marks unlabelled test rows -1: train on a labelled split)", where, l)
		case l >= maxClasses:
			return fmt.Errorf("%s: label %d is not a class index of an image classifier (memfit reads up to %d classes): is the label column right?", where, l, maxClasses)
		}
		maxLabel = max(maxLabel, l)
		imgs.names = append(imgs.names, where)
		imgs.images = append(imgs.images, img.Bytes)
		imgs.labels = append(imgs.labels, int(l))
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Every image's header, and the first image whole, before training: a column of other bytes is found now,
	// not at the step whose batch holds it.
	for i := range imgs.images {
		if err := data.CheckImageHeader(imgs.names[i], imgs.images[i]); err != nil {
			return nil, err
		}
	}
	if len(imgs.images) > 0 {
		if _, err := imgs.Image(0); err != nil {
			return nil, err
		}
	}
	f, err := openFile(d.Files[0])
	if err != nil {
		return nil, err
	}
	imgs.classes, err = classNames(f, d.column("label"))
	f.Close()
	if err != nil {
		return nil, err
	}
	if len(imgs.classes) > 0 && int64(len(imgs.classes)) <= maxLabel {
		return nil, fmt.Errorf("%s: the file's ClassLabel metadata (written by datasets) names %d classes (%s) but the labels reach %d: fix the labels, or the label feature's names",
			d.where(), len(imgs.classes), strings.Join(imgs.classes[:min(len(imgs.classes), 5)], ", ")+map[bool]string{true: ", ...", false: ""}[len(imgs.classes) > 5], maxLabel)
	}
	if len(imgs.classes) == 0 {
		imgs.classes = make([]string, maxLabel+1)
		for i := range imgs.classes {
			imgs.classes[i] = strconv.Itoa(i)
		}
	}
	return imgs, nil
}

// Images is an image dataset read from parquet: a data.ImageSource.
type Images struct {
	names   []string
	images  [][]byte
	labels  []int
	classes []string
}

// Len returns the number of images.
func (m *Images) Len() int { return len(m.images) }

// Label returns image i's class index.
func (m *Images) Label(i int) int { return m.labels[i] }

// Classes returns the class names, in label order.
func (m *Images) Classes() []string { return m.classes }

// Name names image i: its file and row.
func (m *Images) Name(i int) string { return m.names[i] }

// Bytes returns image i's encoded bytes.
func (m *Images) Bytes(i int) []byte { return m.images[i] }

// Image decodes image i (its size bounded as for image folders, data.DecodeImage).
func (m *Images) Image(i int) (image.Image, error) { return data.DecodeImage(m.names[i], m.images[i]) }

// Preferences reads preference pairs in TRL's preference format: "prompt", "chosen" and "rejected" columns, each
// a string (the standard form) or a list of {role, content} (the conversational form). Without a "prompt" column
// the prompt is implicit in chosen and rejected (data.ExtractPrompt). Each pair is checked as the JSONL reader
// checks one (data.CheckPreference); a bad one, or a null, is an error naming its row.
func (d *Dataset) Preferences() ([]data.Preference, error) {
	specs := []spec{
		{name: "prompt", kind: kText, optional: true, what: "the prompt of a preference pair"},
		{name: "chosen", kind: kText, what: "the preferred completion of a preference pair"},
		{name: "rejected", kind: kText, what: "the dispreferred completion of a preference pair"},
	}
	var out []data.Preference
	hasPrompt, err := d.Has("prompt")
	if err != nil {
		return nil, err
	}
	index := 0
	_, err = d.each(specs, func(where string, r row) error {
		p := data.Preference{Line: index}
		index++
		for i, to := range []*data.Text{&p.Prompt, &p.Chosen, &p.Rejected} {
			switch v := r[i].(type) {
			case string:
				*to = data.Text{String: v}
			case []Message:
				*to = data.Text{Messages: v}
			default:
				if i > 0 || hasPrompt {
					return fmt.Errorf("%s: %q is null", where, specs[i].name)
				}
			}
		}
		if !hasPrompt {
			var err error
			if p, err = data.ExtractPrompt(p); err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
		}
		if err := data.CheckPreference(p); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		out = append(out, p)
		return nil
	})
	return out, err
}
