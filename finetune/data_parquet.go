package finetune

// Parquet data (FormatParquet): a Hugging Face dataset as the hub delivers it, one parquet file or a dataset
// folder whose split DataOptions.Split picks, read by package data/hfdata. What it holds is told by its columns
// (after DataOptions.Columns renames): instruction/input/output (Alpaca), messages (conversations), text,
// GLUE's sentence columns with a label, or image + label. Each is read into the representation of the format it
// stands for and goes the same way from there: Alpaca rows through the Alpaca tokenization, texts through the
// plain-text packing, GLUE rows through the GLUE path, images through the image loader.

import (
	"fmt"
	"slices"
	"strings"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/data/hfdata"
)

// FormatParquet is Hugging Face parquet data: a .parquet file, or a dataset folder in the hub layout
// (data/SPLIT-*.parquet, SPLIT/*.parquet) with DataOptions.Split (default train).
const FormatParquet = "parquet"

// openParquet resolves parquet data's files (the card's configs, or its config folder and split: hfdata.OpenSpec)
// and column renames.
func openParquet(path string, opts DataOptions) (*hfdata.Dataset, error) {
	return hfdata.OpenSpec(path, hfdata.Spec{Config: opts.Config, Split: opts.Split, Columns: opts.Columns, SplitFlag: opts.splitFlag(), ConfigFlag: "--data-config"})
}

// parquetTextFormat returns the text format that parquet data for a LLaMA stands for, by its columns: GLUE for a
// sequence classifier (with DataOptions.Task); for a causal LM, Alpaca when it has instruction and output, text
// when it has text, conversations when it has messages (ParquetConversations).
// It notes what it chose (the files and the reading), as the run shows before training.
func parquetTextFormat(path string, opts DataOptions, classifier bool, note func(string, ...any)) (format string, err error) {
	ds, err := openParquet(path, opts)
	if err != nil {
		return "", err
	}
	defer func() {
		if err == nil {
			note("%s: read as %s", ds.Describe(), map[string]string{FormatAlpaca: "Alpaca rows (instruction, input, output)",
				FormatText: "text documents, one per row", FormatMessages: "conversations (messages)", FormatGLUE: "GLUE " + opts.Task + " rows"}[format])
		}
	}()
	if classifier {
		if opts.Task == "" {
			return "", fmt.Errorf("parquet data for a sequence classifier is a GLUE task's rows: name it with --task (%s)", strings.Join(data.GLUETasks, ", "))
		}
		return FormatGLUE, nil
	}
	if err := ds.CheckRenames(); err != nil {
		return "", err
	}
	names, err := ds.ColumnNames()
	if err != nil {
		return "", err
	}
	has := func(name string) bool {
		ok, _ := ds.Has(name)
		return ok
	}
	switch {
	case has("instruction") || has("output"):
		return FormatAlpaca, nil
	case has("messages"):
		return FormatMessages, nil
	case slices.Contains(names, "conversations"):
		return "", fmt.Errorf("%s holds ShareGPT conversations (a conversations column of from/value turns): read them with --columns messages=conversations", path)
	case has("text"):
		return FormatText, nil
	}
	return "", fmt.Errorf("%s has none of the columns a causal LM trains on (instruction + output, messages, text); its columns are %s: name yours with --columns, e.g. --columns text=%s",
		path, strings.Join(names, ", "), first(names))
}

func first(names []string) string {
	if len(names) == 0 {
		return "COLUMN"
	}
	return names[0]
}

// readInstructions reads Alpaca rows from JSONL or parquet.
func readInstructions(path string, opts DataOptions) ([]data.Instruction, error) {
	if DataFormat(path, opts) != FormatParquet {
		return data.ReadInstructions(path)
	}
	ds, err := openParquet(path, opts)
	if err != nil {
		return nil, err
	}
	return ds.Instructions()
}

// readDocuments reads the documents of plain text (paragraphs) or of parquet (one per row's text).
func readDocuments(path string, opts DataOptions) ([]string, error) {
	if DataFormat(path, opts) != FormatParquet {
		raw, err := data.ReadTextFile(path)
		if err != nil {
			return nil, err
		}
		return data.Documents(raw), nil
	}
	ds, err := openParquet(path, opts)
	if err != nil {
		return nil, err
	}
	return ds.Texts()
}

// readGLUE reads a GLUE task's split from the GLUE data root, or parquet rows in the hub's glue columns (whose
// split is DataOptions.Split of a dataset folder).
func readGLUE(path string, opts DataOptions, split string) ([]data.GLUEExample, error) {
	if DataFormat(path, opts) != FormatParquet {
		return data.ReadGLUE(path, opts.Task, split)
	}
	ds, err := openParquet(path, opts)
	if err != nil {
		return nil, err
	}
	return ds.GLUE(opts.Task)
}

// ParquetConversations reads the conversations of parquet data with a messages column (list of {role,
// content} per row), for chat training: the hand-off from the parquet reader to the conversation path.
func ParquetConversations(path string, opts DataOptions) ([]data.Conversation, error) {
	ds, err := openParquet(path, opts)
	if err != nil {
		return nil, err
	}
	return ds.Conversations()
}

// openImageSource opens the images of an image format, or of parquet data with image and label columns.
func openImageSource(path, format string, opts DataOptions) (data.ImageSource, error) {
	if format != FormatParquet {
		return OpenImages(path, format, opts.Split)
	}
	ds, err := openParquet(path, opts)
	if err != nil {
		return nil, err
	}
	return ds.Images()
}

// openParquetData opens parquet data for the model's family (images for an image model, text for a text
// model), by the family's OpenData.
func openParquetData(src DataSource) (Iterator, error) {
	fam, ok := FamilyOf(src.Model)
	if !ok || fam.OpenData == nil {
		return nil, fmt.Errorf("parquet data needs a model whose family reads data; %s", familyTitle(src.Model))
	}
	if !slices.Contains(fam.Formats, FormatMessages) { // the family reads no conversations: packing and templates do not apply
		kind := "image"
		if !slices.Contains(fam.Formats, FormatImages) && len(fam.Formats) > 0 {
			kind = fam.Formats[0]
		}
		switch {
		case src.Options.Packing:
			return nil, fmt.Errorf("--packing packs instruction and conversation examples (alpaca, messages data), not %s data (%s is read as %s data for the %s model): leave it out", kind, src.Path, kind, fam.Title)
		case src.Options.ChatTemplate != "":
			return nil, fmt.Errorf("--chat-template renders conversations (messages data), not %s data (%s is read as %s data for the %s model): leave it out", kind, src.Path, kind, fam.Title)
		}
	}
	return fam.OpenData(src)
}
