package cli

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/memfit/memfit/chattemplate"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/gguf"
	"github.com/memfit/memfit/gguf/llamagguf"
	"github.com/memfit/memfit/gguf/ollama"
	"github.com/memfit/memfit/models"
	"github.com/memfit/memfit/tokenizer"
)

// ggufExport holds export's flags for `--format gguf` (from a run: run, checkpoint; or from a model folder:
// model, adapter, tokenizer) and for `--format merged` from a model folder.
type ggufExport struct {
	run, checkpoint, model, adapter, tokenizer, out, typ string
	overwrite                                            bool
}

// modelfileOf returns the path of the Ollama Modelfile written beside the GGUF file out: FILE.gguf ->
// FILE.Modelfile.
func modelfileOf(out string) string {
	return strings.TrimSuffix(out, filepath.Ext(out)) + ".Modelfile"
}

func (g ggufExport) export(cmd *cobra.Command, opts *Options) error {
	switch {
	case (g.run == "") == (g.model == ""):
		return usagef("--format gguf exports a run (--run DIR) or a model folder (--model DIR [--adapter DIR]): give one of them")
	case g.adapter != "" && g.model == "":
		return usagef("--adapter goes with --model (a run exports its own adapters)")
	case g.tokenizer != "" && g.model == "":
		return usagef("--tokenizer goes with --model (a run exports with its own tokenizer)")
	case g.checkpoint != "" && g.run == "":
		return usagef("--checkpoint goes with --run")
	case g.out == "":
		return usagef("--out is required: the GGUF file to write, e.g. model.gguf")
	case !llamagguf.IsGGUF(g.out):
		return usagef("--out %s: a GGUF export is one file: give a name ending in .gguf, e.g. %s", g.out, filepath.Join(g.out, "model.gguf"))
	}
	typ, err := gguf.ParseTensorType(g.typ)
	if err != nil {
		return usagef("--gguf-type %q: use f32, f16, bf16 or q8_0", g.typ)
	}
	stdout, stderr := cmd.OutOrStdout(), cmd.ErrOrStderr()
	var (
		model   finetune.Model
		params  models.Params
		tokPath string
		step    = -1
	)
	if g.run != "" {
		spec, err := finetune.ReadRunSpec(g.run)
		if err != nil {
			return err
		}
		if err := restoreHub(cmd, &spec); err != nil {
			return err
		}
		ins := inputs{}.add("--run", g.run, runReads...).add("--checkpoint", checkpointPath(g.run, g.checkpoint), checkpointReads...).
			add("the run's base model", spec.Model, modelReads...).add("the run's tokenizer", spec.DataOptions.Tokenizer, tokenizerReads...)
		if err := g.checkOut(ins); err != nil {
			return err
		}
		if spec.Model == "" {
			return fmt.Errorf("%s: run.yaml names no base model: there is nothing to export", g.run)
		}
		if _, err := os.Stat(spec.Model); err != nil {
			return fmt.Errorf("the run's base model %s is not there (%v): export merges the run's adapters into it; put it back or edit model: in %s",
				spec.Model, errors.Unwrap(err), filepath.Join(g.run, finetune.RunFile))
		}
		if model, err = finetune.LoadModel(spec.Model, spec.Config); err != nil {
			return err
		}
		if err := finetune.CheckGGUF(model); err != nil {
			return err
		}
		backend, err := opts.NewBackend()
		if err != nil {
			return err
		}
		from, err := checkpointOf(g.run, g.checkpoint)
		if err != nil {
			return err
		}
		tr, err := finetune.Resume(from, model, backend, nil)
		if err != nil {
			return err
		}
		fmt.Fprintf(stderr, "export: merging the run's step %d into %s\n", tr.Step, spec.Model)
		if params, err = tr.Merged(); err != nil {
			return err
		}
		step = tr.Step
		tokPath = spec.DataOptions.Tokenizer
		if tokPath == "" {
			tokPath = spec.Model
		}
	} else {
		if llamagguf.IsGGUF(g.model) {
			return usagef("--model %s is a GGUF file already: export reads a Hugging Face model folder", g.model)
		}
		if _, _, err := hubFolders(cmd, &g.model, &g.adapter); err != nil {
			return err
		}
		ins := inputs{}.add("--model", g.model, modelReads...).add("--adapter", g.adapter, adapterReads...).
			add("--tokenizer", g.tokenizer, tokenizerReads...)
		if err := g.checkOut(ins); err != nil {
			return err
		}
		if model, err = finetune.LoadModel(g.model, finetune.Defaults()); err != nil {
			return err
		}
		if err := finetune.CheckGGUF(model); err != nil {
			return err
		}
		var set *finetune.PEFTAdapter
		if g.adapter != "" {
			if set, err = finetune.ReadAdapter(g.adapter, model); err != nil {
				return err
			}
			for n, t := range set.Modules {
				model.Params()[n] = t
			}
			fmt.Fprintf(stderr, "export: merging the adapter %s into %s\n", g.adapter, g.model)
			params, err = finetune.MergedParams(model, set.Set)
		} else {
			params, err = finetune.MergedParams(model, nil)
		}
		if err != nil {
			return err
		}
		tokPath = g.model
		if g.tokenizer != "" {
			tokPath = g.tokenizer
		}
	}
	tok, err := exportTokenizer(tokPath, g.tokenizer != "")
	if err != nil {
		return err
	}
	var notes []string
	var tr ollama.Translation
	why := ""
	if tok == nil {
		why = "the model was exported without a tokenizer"
		notes = append(notes, fmt.Sprintf("%s has no tokenizer: the GGUF's vocabulary is placeholder tokens %s (token ids only); give --tokenizer to include one",
			tokPath, fmt.Sprintf(llamagguf.PlaceholderToken, 0)))
	} else {
		if err := finetune.CheckTokenizer(tok, model); err != nil {
			return fmt.Errorf("%s: %w", tokPath, err)
		}
		if tok.Config.ChatTemplate == "" {
			tok.Config.ChatTemplate = ollama.AlpacaJinja
			tr = ollama.AlpacaTranslation()
			notes = append(notes, "the tokenizer has no chat template: the GGUF gets the Alpaca prompt's (what finetune generate --chat uses for it)")
		} else if tmpl, err := chattemplate.FromTokenizer(tok); err != nil {
			why = "the tokenizer's chat template does not parse"
			notes = append(notes, fmt.Sprintf("%v: the GGUF keeps it, the Modelfile has no TEMPLATE", err))
		} else if tr, err = ollama.Translate(tmpl.Render, tok.Config.BOSToken); err != nil {
			why = err.Error()
			notes = append(notes, fmt.Sprintf("%s; the GGUF keeps it for llama.cpp, the Modelfile has no TEMPLATE (see the comment in it)", err))
		}
	}
	name := strings.TrimSuffix(filepath.Base(g.out), filepath.Ext(g.out))
	progress := countProgress(stderr, "export: writing "+g.out+" ("+typ.String()+"), tensors")
	note := func(n string) { notes = append(notes, n) }
	if err := finetune.ExportGGUF(g.out, model, params, tok, llamagguf.Options{Type: typ, Name: name, Progress: progress, Note: note}); err != nil {
		return err
	}
	var stops []string
	if tok != nil {
		if id, ok := tok.EOS(); ok {
			s, _ := tok.Token(id)
			stops = append(stops, s)
		}
	}
	mf := modelfileOf(g.out)
	text := ollama.ModelfileOf(filepath.Base(g.out), filepath.Base(mf), tr, stops, why)
	if err := writeFileAtomic(mf, []byte(text)); err != nil {
		return err
	}
	size := int64(0)
	if st, err := os.Stat(g.out); err == nil {
		size = st.Size()
	}
	what := fmt.Sprintf("gguf %s, %.1f MiB", typ, float64(size)/(1<<20))
	if step >= 0 {
		what += fmt.Sprintf(", step %d", step)
	}
	fmt.Fprintf(stdout, "wrote %s (%s)\n", g.out, what)
	fmt.Fprintf(stdout, "wrote %s: ollama create %s -f %s\n", mf, name, mf)
	for _, n := range notes {
		fmt.Fprintf(stdout, "note: %s\n", n)
	}
	return nil
}

// exportMerged is `export --format merged --model DIR [--adapter DIR]`: the merged Hugging Face folder of a
// model and a PEFT adapter, without a run.
func (g ggufExport) exportMerged(cmd *cobra.Command) error {
	switch {
	case g.run != "":
		return usagef("give --run or --model, not both")
	case g.adapter == "":
		return usagef("--format merged --model needs --adapter: the model folder is already a merged model")
	case g.out == "":
		return usagef("--out is required")
	}
	if _, _, err := hubFolders(cmd, &g.model, &g.adapter); err != nil {
		return err
	}
	ins := inputs{}.add("--model", g.model, modelReads...).add("--adapter", g.adapter, adapterReads...).
		add("--tokenizer", g.tokenizer, tokenizerReads...)
	if err := exportTarget(g.out, g.model, "merged", "merged", g.overwrite, ins); err != nil {
		return err
	}
	model, err := finetune.LoadModel(g.model, finetune.Defaults())
	if err != nil {
		return err
	}
	a, err := finetune.ReadAdapter(g.adapter, model)
	if err != nil {
		return err
	}
	for n, t := range a.Modules {
		model.Params()[n] = t
	}
	if err := finetune.ExportMergedModel(g.out, model, a.Set, g.model, g.tokenizer); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "wrote %s (merged: %s + %s)\n", g.out, g.model, g.adapter)
	return nil
}

// checkOut refuses, before any work, a GGUF --out (or its Modelfile) that lies in a folder training manages
// (a checkpoint, best/: managedFolder), is a folder, lies in a missing folder, is a file the export reads, or
// exists without --overwrite.
func (g ggufExport) checkOut(ins inputs) error {
	if err := notInManaged("--out", g.out, filepath.Base(g.out)); err != nil {
		return err
	}
	if err := outputFile("--out", g.out, ins, g.overwrite, true); err != nil {
		return err
	}
	return outputFile("--out's Modelfile", modelfileOf(g.out), ins, g.overwrite, true)
}

// exportTokenizer loads the tokenizer at path; a model folder without tokenizer files gives nil (the GGUF then
// holds token ids only) unless the tokenizer was asked for (given).
func exportTokenizer(path string, given bool) (*tokenizer.Tokenizer, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() && !given {
		found := false
		for _, f := range []string{"tokenizer.json", "tokenizer.model"} {
			if _, err := os.Stat(filepath.Join(path, f)); err == nil {
				found = true
			} else if !errors.Is(err, fs.ErrNotExist) {
				return nil, err
			}
		}
		if !found {
			return nil, nil
		}
	}
	return loadTokenizer(path)
}
