package finetune

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/data/hfdata"
)

// Data formats of RunSpec.Data.
const (
	FormatSafetensors = "safetensors" // one tensor per model input (LoadExamples)
	FormatImages      = "images"      // folder tree <class>/<image>
	FormatImageTar    = "image-tar"   // tar (or .tar.gz) of such a tree; DataOptions.Split picks a subfolder
	FormatIDX         = "idx"         // "images.idx[.gz],labels.idx[.gz]" (MNIST, Fashion-MNIST)
	FormatAlpaca      = "alpaca"      // JSONL instructions, prompt tokens masked in the loss
	FormatMessages    = "messages"    // JSONL conversations with the chat template, assistant turns learned
	FormatText        = "text"        // plain text for causal LM, packed into SeqLen blocks
	FormatGLUE        = "glue"        // GLUE task folder root (../shared/data/glue layout); DataOptions.Task
	// FormatParquet ("parquet", data_parquet.go): a Hugging Face parquet file or hub dataset folder.
	// FormatPreference ("preference", pairs.go): prompt/chosen/rejected pairs (JSONL or parquet).
)

// DataOptions say how to read a run's data (RunSpec.Data).
type DataOptions struct {
	// Format is one of the Format constants; empty picks it from the path: .safetensors, .jsonl (alpaca; the
	// loader reads a file whose first row is a conversation as messages: data.JSONLKind), .txt (text),
	// .tar/.tar.gz/.tgz (image-tar), .parquet or a folder of parquet files in the hub layout (parquet), a
	// comma-separated pair (idx), a GLUE task's folder or a GLUE root (glue: data.IsGLUE), another folder
	// (images).
	Format string `json:"format,omitempty"`
	// Split is the subfolder of an image folder or tar (e.g. "train"), the GLUE split (train, dev; default train)
	// or the split of a parquet dataset folder (train, validation, test; default train).
	Split string `json:"split,omitempty"`
	// Config is the config of a parquet dataset folder (--data-config; "" for its default): the card's configs
	// (README.md), or a config folder (CONFIG/SPLIT-*.parquet, the Hub's parquet conversion CONFIG/SPLIT/).
	Config string `json:"config,omitempty"`
	// Columns renames parquet columns to the names memfit reads: "text=content,label=y".
	Columns string `json:"columns,omitempty"`
	// Task is the GLUE task (cola, sst2, mrpc, stsb, rte).
	Task string `json:"task,omitempty"`
	// Tokenizer is the tokenizer of text data (default: the model folder).
	Tokenizer string `json:"tokenizer,omitempty"`
	// SeqLen is the tokens per text example (default 256); of preference pairs, the most tokens of prompt +
	// completion.
	SeqLen int `json:"seq_len,omitempty"`
	// MaxPromptLen is the most tokens a preference pair's prompt keeps, its last ones (0: no limit).
	MaxPromptLen int `json:"max_prompt_len,omitempty"`
	// Augment turns on random crops (padding of 1/8 of the image side) and horizontal flips for images.
	Augment bool `json:"augment,omitempty"`
	// ChatTemplate renders conversations (FormatMessages): auto (""), model, llama3, chatml or alpaca
	// (chattemplate.Choices), as generate's --chat-template; auto is the model's own Jinja template when its
	// tokenizer has one, else Alpaca. A run records the template its conversations took (auto resolved).
	ChatTemplate string `json:"chat_template,omitempty"`
	// Packing fills each sequence with several instruction or conversation examples (Alpaca, messages),
	// document-aware: positions restart at each example and attention does not cross examples (position_ids).
	Packing bool `json:"packing,omitempty"`
	// SplitFlag names the flag that set Split, in messages ("" for --split; --eval-data-split for validation data).
	SplitFlag string `json:"-"`
	// ValidationSplit says that Split "" means the dataset's validation split, the first of hfdata.EvalSplits it
	// has (validation data named by an hf:// URL, whose splits are known only from its file list).
	ValidationSplit bool `json:"-"`
}

// splitFlag is the flag that set Split.
func (o DataOptions) splitFlag() string {
	if o.SplitFlag == "" {
		return "--split"
	}
	return o.SplitFlag
}

// splitFormats are the formats that have splits (DataOptions.Split).
var splitFormats = []string{FormatImages, FormatImageTar, FormatGLUE, FormatParquet}

// DataFormat returns the format that opts (or the path) selects.
func DataFormat(path string, opts DataOptions) string {
	if opts.Format != "" {
		return opts.Format
	}
	low := strings.ToLower(path)
	switch {
	case strings.HasSuffix(low, ".safetensors"):
		return FormatSafetensors
	case strings.HasSuffix(low, ".jsonl"):
		return FormatAlpaca
	case strings.HasSuffix(low, ".txt"):
		return FormatText
	case strings.HasSuffix(low, ".tar") || strings.HasSuffix(low, ".tar.gz") || strings.HasSuffix(low, ".tgz"):
		return FormatImageTar
	case strings.Contains(path, ","):
		return FormatIDX
	case hfdata.IsParquet(path):
		return FormatParquet
	case data.IsGLUE(path):
		return FormatGLUE
	}
	return FormatImages
}

// checkDataPath names what is wrong with the data path before any format-specific reading: a missing file or
// folder (each file of an IDX pair), or a file whose name does not say its format (an image folder is the
// default only for folders).
func checkDataPath(path, format string, opts DataOptions) error {
	paths := []string{path}
	if format == FormatIDX {
		paths = strings.Split(path, ",")
	}
	for _, p := range paths {
		info, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("data %s: no such file or folder", p)
		}
		if format == FormatImages && opts.Format == "" && !info.IsDir() {
			return fmt.Errorf("data %s: cannot tell its format from the name (.safetensors, .jsonl, .txt, .tar, .tar.gz, .parquet, a folder, or an IDX pair \"images,labels\"): pass --data-format", p)
		}
	}
	return nil
}

// OpenData opens the run's training data for model as a resumable iterator of batches of batchSize with the
// given seed.
func OpenData(path string, opts DataOptions, model Model, modelDir string, batchSize int, seed uint64) (Iterator, error) {
	format := DataFormat(path, opts)
	if err := checkDataPath(path, format, opts); err != nil {
		return nil, err
	}
	preference := isPreferenceData(path, format, opts)
	kind := format
	if preference {
		kind = FormatPreference
	}
	if opts.Columns != "" && format != FormatParquet {
		return nil, fmt.Errorf("--columns renames the columns of parquet data, but %s is %s data: leave it out", path, kind)
	}
	if opts.Split != "" && !slices.Contains(splitFormats, format) {
		return nil, fmt.Errorf("%s picks a split of an image folder or tar, GLUE data or a parquet dataset folder, but %s is %s data, one file: leave it out",
			opts.splitFlag(), path, kind)
	}
	if opts.Config != "" && format != FormatParquet {
		return nil, fmt.Errorf("--data-config picks a config of a parquet dataset (a Hub dataset's card or config folders), but %s is %s data: leave it out", path, kind)
	}
	if preference {
		return openPairs(DataSource{Path: path, Format: FormatPreference, Options: opts, Model: model, ModelDir: modelDir, BatchSize: batchSize, Seed: seed})
	}
	if opts.MaxPromptLen != 0 {
		return nil, fmt.Errorf("--max-prompt-len cuts the prompts of preference pairs; %s holds %s data: leave it out", path, format)
	}
	if opts.Packing && format != FormatAlpaca && format != FormatMessages && format != FormatParquet { // parquet: checked once its columns tell its kind
		return nil, fmt.Errorf("--packing packs instruction and conversation examples (alpaca, messages data), not %s data: leave it out", format)
	}
	if opts.ChatTemplate != "" && format != FormatAlpaca && format != FormatMessages && format != FormatParquet {
		return nil, fmt.Errorf("--chat-template renders conversations (messages data), not %s data: leave it out", format)
	}
	if format == FormatSafetensors {
		ex, err := LoadExamples(path, model)
		if err != nil {
			return nil, err
		}
		return NewLoader(ex, batchSize, seed, true)
	}
	if format == FormatParquet {
		return openParquetData(DataSource{Path: path, Format: format, Options: opts, Model: model, ModelDir: modelDir, BatchSize: batchSize, Seed: seed})
	}
	if readers := FamiliesOfFormat(format); len(readers) > 0 {
		fam, ok := FamilyOf(model)
		if !ok || !slices.Contains(fam.Formats, format) || fam.OpenData == nil {
			return nil, fmt.Errorf("%s data needs a %s model; %s", format, familyTitles(readers), familyTitle(model))
		}
		return fam.OpenData(DataSource{Path: path, Format: format, Options: opts, Model: model, ModelDir: modelDir, BatchSize: batchSize, Seed: seed})
	}
	return nil, fmt.Errorf("unknown data format %q (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s)", format, FormatSafetensors, FormatImages,
		FormatImageTar, FormatIDX, FormatAlpaca, FormatMessages, FormatText, FormatGLUE, FormatParquet, FormatPreference)
}

// absData makes the data path absolute (both parts of an IDX pair).
func absData(path string) string {
	parts := strings.Split(path, ",")
	for i, p := range parts {
		if a, err := filepath.Abs(p); err == nil {
			parts[i] = a
		}
	}
	return strings.Join(parts, ",")
}
