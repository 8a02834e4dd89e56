package cli

import (
	"encoding/json"
	"fmt"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/runner"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"

	"github.com/memfit/memfit/adapter"
	"github.com/memfit/memfit/data"
	"github.com/memfit/memfit/evals"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/gguf/llamagguf"
	"github.com/memfit/memfit/tokenizer"
)

func newEvalCommand(opts *Options) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "eval",
		Short: "Evaluate a model (with an optional PEFT adapter) on MMLU or GLUE",
	}
	cmd.AddCommand(newEvalMMLUCommand(opts), newEvalGLUECommand(opts))
	return cmd
}

// loadModelAdapter loads a model folder with an optional PEFT adapter (and its modules_to_save).
func loadModelAdapter(model, adapterDir string) (finetune.Model, *adapter.Set, error) {
	m, err := finetune.LoadModel(model, finetune.Defaults())
	if err != nil {
		return nil, nil, err
	}
	if adapterDir == "" {
		return m, nil, nil
	}
	a, err := finetune.ReadAdapter(adapterDir, m)
	if err != nil {
		return nil, nil, err
	}
	for n, t := range a.Modules {
		m.Params()[n] = t
	}
	return m, a.Set, nil
}

// loadForEval loads a model folder with an optional PEFT adapter and the tokenizer (--tokenizer, else the model
// folder).
func loadForEval(model, adapterDir, tok string) (finetune.Model, *adapter.Set, *tokenizer.Tokenizer, error) {
	m, set, err := loadModelAdapter(model, adapterDir)
	if err != nil {
		return nil, nil, nil, err
	}
	if tok == "" {
		tok = model
	}
	t, err := loadTokenizer(tok)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := finetune.CheckTokenizer(t, m); err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", tok, err)
	}
	return m, set, t, nil
}

// textSpec returns the TextSpec of a model over token ids (models.TextModel).
func textSpec(m finetune.Model) (models.TextSpec, bool) {
	tm, ok := m.(models.TextModel)
	if !ok {
		return models.TextSpec{}, false
	}
	return tm.TextSpec(), true
}

// textDecoder is a causal LM that decodes with a key/value cache and describes its tokens.
type textDecoder interface {
	runner.Decoder
	models.TextModel
}

// causalLM returns m as a causal LM that generates (every decoder family's causal LM), or false.
func causalLM(m finetune.Model) (textDecoder, bool) {
	d, ok := m.(textDecoder)
	if !ok || !d.TextSpec().CausalLM() {
		return nil, false
	}
	return d, true
}

// loadTokenizer loads the tokenizer at path (tokenizer.Load), or the tokenizer in the metadata of a GGUF file.
func loadTokenizer(path string) (*tokenizer.Tokenizer, error) {
	if !finetune.IsGGUF(path) {
		return tokenizer.Load(path)
	}
	t, err := llamagguf.ReadTokenizer(path)
	if err == nil && t == nil {
		err = fmt.Errorf("%s holds no tokenizer (tokenizer.ggml.model none): give --tokenizer", path)
	}
	return t, err
}

// resultPath is where an evaluation's results go: --out; else, when the adapter (or the model) evaluated is a
// checkpoint or adapter of a training run, that run's folder (RUN/eval-mmlu-best.json); else the current folder,
// named after what was evaluated (eval-mmlu-llama-tiny.json, eval-glue-sst2-chat-q8.json). Never into a model or
// adapter folder (a read-only or shared model folder got files it did not have), a Hub cache folder, nor under
// a GGUF file's path. kind is "mmlu" or "glue-TASK"; model and adapter are local paths, or, with their hub
// source, named by their Hub repository.
func resultPath(out, kind, model, adapter string, modelHub, adapterHub *finetune.HubSource) string {
	if out != "" {
		return out
	}
	what, hub := model, modelHub
	if adapter != "" {
		what, hub = adapter, adapterHub
	}
	if hub != nil {
		return "eval-" + kind + "-" + path.Base(hub.Repo) + ".json"
	}
	if dir, run, _, ok := managedFolder(what); ok && run != "" {
		return filepath.Join(run, "eval-"+kind+"-"+filepath.Base(dir)+".json")
	}
	name := filepath.Base(absPath(what))
	name = strings.TrimSuffix(name, filepath.Ext(name))
	return "eval-" + kind + "-" + name + ".json"
}

func writeResult(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(path, append(b, '\n'))
}

// maxEvalBatch bounds the evaluation batch flags (a typo such as 10000000 would size the batch's tensors).
const maxEvalBatch = 4096

func newEvalMMLUCommand(opts *Options) *cobra.Command {
	var model, adapter, tok, dataDir, out string
	var subjects []string
	var o evals.MMLUOptions
	var asJSON, overwrite bool
	var limit, shots int
	cmd := &cobra.Command{
		Use:   "mmlu --model DIR --data DIR [--adapter DIR] [--subjects a,b] [--shots 5]",
		Short: "MMLU k-shot accuracy (log-likelihood of \" A\"..\" D\" and letter argmax), micro and macro",
		Long: `Scores the MMLU test questions of the chosen subjects (all 57 by default) with the first --shots dev questions
of each subject as examples, in lm-evaluation-harness' prompt format; prompts longer than --seq-len tokens are cut
from the left. Two scorings are reported: the log-likelihood of the continuations " A".." D" (harness style) and the
argmax over the letter tokens A..D (QLoRA-script style), and with --generate a third: the letter a greedy
two-token reply starts with (decoded with the key/value cache of finetune generate); each as micro (over questions) and macro (over subjects)
averages, per subject and per category. --data is a folder with dev/ and test/ CSVs (question,choice0..3,answer
with an index, or the original layout without header and letter answers). The results JSON (with the prompt format, shots,
averaging and a SHA-256 of the data) goes to --out, or by default to eval-mmlu-NAME.json in the current folder,
NAME the adapter (or model) evaluated, or into the run folder when that is a training run's checkpoint or adapter
(RUN/eval-mmlu-best.json); never into the model or adapter folder. The output says where.`,
		Example: `  finetune eval mmlu --model pretrained/llama-tiny --data ../shared/data/mmlu --subjects anatomy,virology
  finetune eval mmlu --model base --adapter runs/alpaca/adapter --data ../shared/data/mmlu --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if model == "" || dataDir == "" {
				return usagef("--model and --data are required")
			}
			switch {
			case shots < 0:
				return usagef("--shots %d: give 0 (zero-shot) or more dev questions per subject", shots)
			case o.MaxLen < 0 || o.MaxLen == 1:
				return usagef("--seq-len %d: give 0 (the model's positions) or at least 2 tokens", o.MaxLen)
			case o.BatchSize < 1 || o.BatchSize > maxEvalBatch:
				return usagef("--batch-size %d: give 1 to %d prompts per forward pass", o.BatchSize, maxEvalBatch)
			case limit < 0:
				return usagef("--limit %d: give 0 (every question) or a positive number", limit)
			}
			o.Shots = shots
			if shots == 0 {
				o.Shots = -1 // evals: 0 means the default (5), a negative number zero-shot
			}
			for _, s := range subjects {
				if _, ok := evals.Categories[s]; !ok {
					return usagef("unknown MMLU subject %q", s)
				}
			}
			modelHub, adapterHub, err := hubFolders(cmd, &model, &adapter)
			if err != nil {
				return err
			}
			ins := evalInputs(model, adapter, tok).add("--data", dataDir)
			if err := outputFile("--out", out, ins, overwrite, true); err != nil {
				return err
			}
			path := resultPath(out, "mmlu", model, adapter, modelHub, adapterHub)
			if err := outputFile("the results file", path, ins, true, false); err != nil {
				return err
			}
			m, set, t, err := loadForEval(model, adapter, tok)
			if err != nil {
				return err
			}
			if spec, ok := textSpec(m); ok {
				if positions := spec.MaxPositions; o.MaxLen == 0 {
					o.MaxLen = positions
				} else if o.MaxLen > positions {
					return usagef("--seq-len %d is more than the model's %d positions (max_position_embeddings)", o.MaxLen, positions)
				}
			}
			dev, test, hash, err := evals.ReadMMLU(dataDir, subjects)
			if err != nil {
				return err
			}
			if limit > 0 {
				for s := range test {
					test[s] = test[s][:min(limit, len(test[s]))]
				}
			}
			backend, err := opts.NewBackend()
			if err != nil {
				return err
			}
			defer backend.Finalize()
			lm, err := evals.NewModelLM(backend, m, set)
			if err != nil {
				return err
			}
			stderr := cmd.ErrOrStderr()
			o.Progress = countProgress(stderr, "MMLU questions")
			res, err := evals.EvalMMLU(lm, t, dev, test, o)
			if err != nil {
				return err
			}
			full := struct {
				Model      string `json:"model"`
				Adapter    string `json:"adapter,omitempty"`
				Data       string `json:"data"`
				DataSHA256 string `json:"data_sha256"`
				Limit      int    `json:"questions_per_subject_limit,omitempty"`
				*evals.MMLUResult
			}{abs(model), absIf(adapter), abs(dataDir), hash, limit, res}
			if err := writeResult(path, full); err != nil {
				return err
			}
			if asJSON {
				fmt.Fprintf(cmd.ErrOrStderr(), "results in %s\n", path)
				return writeJSON(cmd.OutOrStdout(), full)
			}
			return writeMMLUTable(cmd.OutOrStdout(), res, path)
		},
	}
	f := cmd.Flags()
	f.StringVar(&model, "model", "", "LLaMA causal-LM folder, or a Hub id ORG/NAME[@REVISION]")
	f.StringVar(&adapter, "adapter", "", "PEFT LoRA adapter folder (or Hub id) to apply")
	f.StringVar(&tok, "tokenizer", "", "tokenizer (default: the model folder)")
	f.StringVar(&dataDir, "data", "", "MMLU folder with dev/ and test/")
	f.StringSliceVar(&subjects, "subjects", nil, "subjects to evaluate (default: all 57)")
	f.IntVar(&shots, "shots", 5, "dev questions used as examples (0: zero-shot)")
	f.IntVar(&o.MaxLen, "seq-len", 0, "cut prompts longer than this many tokens from the left (default: the model's positions)")
	f.IntVar(&o.BatchSize, "batch-size", 8, "prompts per forward pass")
	f.IntVar(&limit, "limit", 0, "score only the first N test questions of each subject (0: all; the results say so)")
	f.BoolVar(&o.Generate, "generate", false, "also score by generation: the letter a greedy 2-token reply starts with (the runner of finetune generate)")
	f.StringVar(&out, "out", "", "results file (default: eval-mmlu-NAME.json in the current folder, NAME the adapter or model evaluated; a run's checkpoint or adapter: in its run folder; replaced by each run)")
	f.BoolVar(&overwrite, "overwrite", false, "replace an existing --out file")
	f.BoolVar(&asJSON, "json", false, "print the results as JSON")
	checksOwnRange(f, "seq-len") // 0 is the model's positions; the command names them
	alias(f, "seq-len", "max-len")
	return cmd
}

func absIf(p string) string {
	if p == "" {
		return ""
	}
	return abs(p)
}

func writeMMLUTable(w io.Writer, r *evals.MMLUResult, path string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	gen := r.Micro.Generate != nil
	if gen {
		fmt.Fprintf(tw, "\tquestions\tacc (log-likelihood)\tacc (letter)\tacc (generate)\t\n")
	} else {
		fmt.Fprintf(tw, "\tquestions\tacc (log-likelihood)\tacc (letter)\t\n")
	}
	keys := make([]string, 0, len(r.BySubject))
	for k := range r.BySubject {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	row := func(name string, s evals.SubjectResult) {
		if gen && s.Generate != nil {
			fmt.Fprintf(tw, "%s\t%d\t%.2f%%\t%.2f%%\t%.2f%%\t\n", name, s.Questions, 100*s.LogLikelihood, 100*s.Letter, 100**s.Generate)
			return
		}
		fmt.Fprintf(tw, "%s\t%d\t%.2f%%\t%.2f%%\t\n", name, s.Questions, 100*s.LogLikelihood, 100*s.Letter)
	}
	for _, k := range keys {
		row(k, r.BySubject[k])
	}
	cats := make([]string, 0, len(r.ByCategory))
	for k := range r.ByCategory {
		cats = append(cats, k)
	}
	sort.Strings(cats)
	for _, k := range cats {
		row("["+k+"]", r.ByCategory[k])
	}
	row("micro (over questions)", r.Micro)
	row("macro (over subjects)", r.Macro)
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%d-shot, %d prompts cut from the left; %.1f questions/s (%.0f s); results in %s\n",
		r.Shots, r.Truncated, r.PerSecond, r.Seconds, path)
	return err
}

func newEvalGLUECommand(opts *Options) *cobra.Command {
	var task, dataDir, preds, model, adapter, tok, out string
	var seqLen, batch int
	var asJSON, overwrite bool
	cmd := &cobra.Command{
		Use:   "glue --data DIR [--task cola|sst2|mrpc|stsb|rte] (--predictions FILE | --model DIR [--adapter DIR])",
		Short: "GLUE dev-set metrics of a predictions file or of a LLaMA sequence classifier",
		Long: `Scores a GLUE task's dev set (../shared/data/glue layout): CoLA Matthews correlation, STS-B Pearson and
Spearman, MRPC accuracy and F1, SST-2 and RTE accuracy, with the majority-class baseline for the classification
tasks. --data is the GLUE root with --task, or one task's folder (../shared/data/glue/CoLA), which names the task. --predictions FILE scores a file of one label (or STS-B score) per line in dev-set order, without a model;
--model runs a LLaMA sequence classifier (with --adapter). Results are written as JSON to --out, or with --model to
eval-glue-TASK-NAME.json in the current folder (a run's checkpoint or adapter: in its run folder); the output says
where.`,
		Example: `  finetune eval glue --task sst2 --data ../shared/data/glue --predictions preds.txt --json
  finetune eval glue --data ../shared/data/glue/SST-2 --model runs/sst2/merged`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if dataDir == "" {
				return usagef("--data is required (the GLUE root with --task, or a task folder such as glue/CoLA)")
			}
			dataDir, task, err := glueData(dataDir, task)
			if err != nil {
				return err
			}
			if task == "" {
				return usagef("--task is required with the GLUE root %s (or give a task folder: --data %s)", dataDir, filepath.Join(dataDir, "CoLA"))
			}
			info, err := data.GLUETask(task)
			if err != nil {
				return usageError{err}
			}
			if (preds == "") == (model == "") {
				return usagef("give either --predictions or --model")
			}
			if model != "" && (batch < 1 || batch > maxEvalBatch) {
				return usagef("--batch-size %d: give 1 to %d examples per forward pass", batch, maxEvalBatch)
			}
			modelHub, adapterHub, err := hubFolders(cmd, &model, &adapter)
			if err != nil {
				return err
			}
			ins := evalInputs(model, adapter, tok).add("--data", dataDir).add("--predictions", preds)
			if err := outputFile("--out", out, ins, overwrite, true); err != nil {
				return err
			}
			resultFile := ""
			if out != "" || model != "" {
				resultFile = resultPath(out, "glue-"+task, model, adapter, modelHub, adapterHub)
				if err := outputFile("the results file", resultFile, ins, true, false); err != nil {
					return err
				}
			}
			dev, err := data.ReadGLUE(dataDir, task, "dev")
			if err != nil {
				return err
			}
			hash, err := evals.DevHash(dataDir, task)
			if err != nil {
				return err
			}
			var p []float64
			source := ""
			if preds != "" {
				if p, err = evals.ReadPredictions(preds); err != nil {
					return err
				}
				source = "predictions " + abs(preds)
			} else {
				m, set, t, err := loadForEval(model, adapter, tok)
				if err != nil {
					return err
				}
				want := max(len(info.Classes), 1) // a regression task has one output
				spec, ok := textSpec(m)
				if !ok || spec.Task != models.TaskSeqCls || len(spec.Labels) != want {
					got := "not a sequence classifier over tokens"
					if ok && spec.Task == models.TaskSeqCls {
						got = fmt.Sprintf("a classifier of %d labels", len(spec.Labels))
					}
					return usagef("GLUE %s needs a sequence classifier (...ForSequenceClassification) with %d label(s) (finetune init --from BASE --num-labels %d); %s is %s", task, want, want, model, got)
				}
				if seqLen < 2 || seqLen > spec.MaxPositions {
					return usagef("--seq-len %d: give 2 to %d tokens (the model's max_position_embeddings)", seqLen, spec.MaxPositions)
				}
				backend, err := opts.NewBackend()
				if err != nil {
					return err
				}
				defer backend.Finalize()
				runner := finetune.NewLogitsRunner(backend, m, nil, set)
				stderr := cmd.ErrOrStderr()
				if p, err = evals.PredictGLUE(runner, t, dev, seqLen, batch, countProgress(stderr, "GLUE "+task+" examples")); err != nil {
					return err
				}
				source = "model " + abs(model)
				if adapter != "" {
					source += " + adapter " + abs(adapter)
				}
			}
			res, err := evals.ScoreGLUE(task, dev, p)
			if err != nil {
				return err
			}
			res.DataSHA256, res.Source = hash, source
			if resultFile != "" {
				if err := writeResult(resultFile, res); err != nil {
					return err
				}
			}
			if asJSON {
				if resultFile != "" {
					fmt.Fprintf(cmd.ErrOrStderr(), "results in %s\n", resultFile)
				}
				return writeJSON(cmd.OutOrStdout(), res)
			}
			keys := make([]string, 0, len(res.Metrics))
			for k := range res.Metrics {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			var parts []string
			for _, k := range keys {
				parts = append(parts, fmt.Sprintf("%s %.4f", k, res.Metrics[k]))
			}
			if res.Majority > 0 {
				parts = append(parts, fmt.Sprintf("majority baseline %.4f", res.Majority))
			}
			if resultFile != "" {
				parts = append(parts, "results in "+resultFile)
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "GLUE %s dev (%d examples): %s\n", task, res.Examples, strings.Join(parts, ", "))
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&task, "task", "", "cola, sst2, mrpc, stsb or rte (default: the task of a --data task folder)")
	f.StringVar(&dataDir, "data", "", "GLUE data root (../shared/data/glue layout) or one task's folder in it")
	f.StringVar(&preds, "predictions", "", "file with one label or score per line, in dev-set order")
	f.StringVar(&model, "model", "", "LLaMA sequence-classification folder, or a Hub id ORG/NAME[@REVISION]")
	f.StringVar(&adapter, "adapter", "", "PEFT adapter folder (or Hub id) to apply")
	f.StringVar(&tok, "tokenizer", "", "tokenizer (default: the model folder)")
	f.IntVar(&seqLen, "seq-len", 128, "tokens per example")
	f.IntVar(&batch, "batch-size", 32, "examples per forward pass")
	f.StringVar(&out, "out", "", "results file (default with --model: eval-glue-TASK-NAME.json in the current folder, NAME the adapter or model evaluated; a run's checkpoint or adapter: in its run folder; replaced by each run)")
	f.BoolVar(&overwrite, "overwrite", false, "replace an existing --out file")
	f.BoolVar(&asJSON, "json", false, "print the results as JSON")
	return cmd
}

// glueData takes --data and --task of a GLUE command: --data is the GLUE root, or one task's folder in it (the
// folder names of the ../shared/data/glue layout: CoLA, SST-2, MRPC, STS-B, RTE), which stands for its root and
// its task. It returns the root and the task; a task folder with a --task of another task is an error.
func glueData(path, task string) (root, glueTask string, err error) {
	base := filepath.Base(filepath.Clean(path))
	for _, t := range data.GLUETasks {
		info, _ := data.GLUETask(t)
		if !strings.EqualFold(base, info.Dir) {
			continue
		}
		if st, err := os.Stat(path); err != nil || !st.IsDir() {
			break // not a folder: the reader names the problem
		}
		if task != "" && task != t {
			return "", "", usagef("--data %s is the GLUE %s folder but --task is %s: give the GLUE root with --task %s, or leave out --task", path, info.Dir, task, task)
		}
		return filepath.Dir(filepath.Clean(path)), t, nil
	}
	return path, task, nil
}

// countProgress reports done/total: a progress bar on a terminal, otherwise a line at every tenth of the way.
func countProgress(w io.Writer, label string) func(done, total int) {
	var bar *progressbar.ProgressBar
	last := -1
	return func(done, total int) {
		if cols := terminalColumns(w); cols > 0 {
			if bar == nil {
				width, desc := barLayout(cols, total, true)
				bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(w), progressbar.OptionShowCount(),
					progressbar.OptionSetDescription(cut(label, desc)), progressbar.OptionShowIts(), progressbar.OptionSetWidth(width))
			}
			_ = bar.Set(done)
			if done == total {
				fmt.Fprintln(w)
			}
			return
		}
		if tenth := 10 * done / max(total, 1); tenth != last {
			last = tenth
			fmt.Fprintf(w, "%s: %d/%d\n", label, done, total)
		}
	}
}

// evalInputs are the inputs of a command that loads a model with an optional adapter and tokenizer.
func evalInputs(model, adapter, tok string) inputs {
	return inputs{}.add("--model", model, modelReads...).add("--adapter", adapter, adapterReads...).
		add("--tokenizer", tok, tokenizerReads...)
}
