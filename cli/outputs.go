package cli

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/memfit/memfit/finetune"
)

// Output paths against inputs (issue 28): nothing a command writes may replace a file it reads. Each command lists
// its inputs (the files and folders its flags name, with the files it reads inside a folder) and checks every
// file it is about to write against them before any work: a path that is (after resolving links and relative
// paths: the same file) one of those inputs is refused in one line naming both, whatever --overwrite says. A
// path that holds an earlier output is refused without --overwrite where the command has that flag.

// input is a file or folder a command reads.
type input struct {
	// flag names it in messages ("--model", "--data").
	flag string
	// path is as the user gave it.
	path string
	// files are the glob patterns of the files read inside a folder input (nil: every file under it; ignored
	// for a file input).
	files []string
}

// inputs are the paths a command reads.
type inputs []input

// add returns ins with path (when not empty) read through flag; files are the patterns of the files read inside
// it when it is a folder (none: everything under it).
func (ins inputs) add(flag, path string, files ...string) inputs {
	if path == "" {
		return ins
	}
	return append(ins, input{flag: flag, path: path, files: files})
}

// The files memfit reads in the folders users give it.
var (
	// modelReads are the files of a Hugging Face model folder that loading a model (and its tokenizer) reads.
	modelReads = []string{"config.json", "*.safetensors", "model.safetensors.index.json", "tokenizer.json",
		"tokenizer_config.json", "chat_template.jinja", "tokenizer.model", "special_tokens_map.json",
		"preprocessor_config.json", "generation_config.json"}
	// adapterReads are the files of a PEFT adapter folder.
	adapterReads = []string{"adapter_config.json", "adapter_model.safetensors", "adapter_model.bin"}
	// tokenizerReads are the files tokenizer.Load reads in a folder.
	tokenizerReads = []string{"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "tokenizer.model", "special_tokens_map.json"}
)

// readBy returns the input whose file path would replace and that file (nil when none): path exists and is an
// input file, one of the files read inside an input folder with file patterns, or any file under an input
// folder without them. Paths are compared as files (os.SameFile: links and relative paths resolved); a file
// under a folder by its real path.
func (ins inputs) readBy(path string) (*input, string) {
	st, err := os.Stat(path)
	if err != nil || st.IsDir() {
		return nil, ""
	}
	real := realPath(path)
	for i := range ins {
		in := &ins[i]
		ist, err := os.Stat(in.path)
		if err != nil {
			continue
		}
		if !ist.IsDir() {
			if os.SameFile(st, ist) {
				return in, in.path
			}
			continue
		}
		if in.files == nil {
			if under(real, realPath(in.path)) {
				rel, _ := filepath.Rel(realPath(in.path), real)
				return in, filepath.Join(in.path, rel)
			}
			continue
		}
		for _, pat := range in.files {
			matches, _ := filepath.Glob(filepath.Join(in.path, pat))
			for _, m := range matches {
				if mst, err := os.Stat(m); err == nil && os.SameFile(st, mst) {
					return in, m
				}
			}
		}
	}
	return nil, ""
}

// realPath is p absolute with its links resolved (as far as they resolve).
func realPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		p = a
	}
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	// A path that does not exist yet: resolve its folder.
	if r, err := filepath.EvalSymlinks(filepath.Dir(p)); err == nil {
		return filepath.Join(r, filepath.Base(p))
	}
	return p
}

// absPath is p made absolute (links kept).
func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// under reports whether path is dir or lies inside it (both real paths).
func under(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

// replacesInput returns the one-line refusal of writing path (named by flag) over an input, or nil.
func (ins inputs) replacesInput(flag, path string) error {
	in, file := ins.readBy(path)
	if in == nil {
		return nil
	}
	what := in.flag + " " + in.path
	if file == in.path {
		what = in.flag
	}
	if absPath(file) == absPath(path) {
		return usagef("%s %s is a file this command reads (%s): writing there would replace it; choose another path", flag, path, what)
	}
	return usagef("%s %s is %s, which this command reads (%s): writing there would replace it; choose another path", flag, path, file, what)
}

// outputFile checks, before any work, the results file path named by flag: not a folder, in a folder that
// exists, not a file the command reads (ins), and, when it exists, replaced only with overwrite (where the
// command has --overwrite: needOverwrite). An empty path is no output.
func outputFile(flag, path string, ins inputs, overwrite, needOverwrite bool) error {
	if path == "" {
		return nil
	}
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return usagef("%s %s is a folder: give a file name, e.g. %s", flag, path, filepath.Join(path, exampleFile(path)))
	}
	if st, err := os.Stat(filepath.Dir(path)); err != nil || !st.IsDir() {
		return usagef("%s %s: the folder %s does not exist", flag, path, filepath.Dir(path))
	}
	if err := ins.replacesInput(flag, path); err != nil {
		return err
	}
	if _, err := os.Lstat(path); err == nil && needOverwrite && !overwrite {
		return usagef("%s %s already exists: pass --overwrite to replace it, or choose another file", flag, path)
	}
	return nil
}

// exampleFile is a file name of the kind path names, for a message suggesting one: model.gguf for a GGUF file,
// results.json otherwise (a results file).
func exampleFile(path string) string {
	switch filepath.Ext(path) {
	case ".gguf":
		return "model.gguf"
	case ".Modelfile":
		return "model.Modelfile"
	}
	return "results.json"
}

// outputFolder checks, before any work, the folder out named by flag into which a command writes the files
// matching patterns (names or globs, relative to out; a pattern ending in "/" is a folder written as a whole):
// out must not be a file, none of the files it would write or replace may be a file the command reads, and
// when some already exist they are replaced only with overwrite (needOverwrite: the command has --overwrite).
func outputFolder(flag, out string, patterns []string, ins inputs, overwrite, needOverwrite bool) error {
	if st, err := os.Stat(out); err == nil && !st.IsDir() {
		return usagef("%s %s is a file: give a folder", flag, out)
	}
	var existing []string
	for _, pat := range patterns {
		dir := strings.HasSuffix(pat, "/")
		matches, _ := filepath.Glob(filepath.Join(out, strings.TrimSuffix(pat, "/")))
		for _, m := range matches {
			existing = append(existing, m)
			if !dir {
				if err := ins.replacesInput(flag, m); err != nil {
					return err
				}
				continue
			}
			// A folder written as a whole (replaced or removed): no input may lie inside it.
			err := filepath.WalkDir(m, func(p string, d fs.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return nil
				}
				return ins.replacesInput(flag, p)
			})
			if err != nil {
				return err
			}
		}
	}
	if len(existing) > 0 && needOverwrite && !overwrite {
		return usagef("%s %s already holds %s: pass --overwrite to replace it, or choose another folder",
			flag, out, filepath.Base(existing[0]))
	}
	return nil
}

// managedFolder reports whether path is, or lies inside, a folder memfit's training manages, whose contents a
// later train, resume or pruning replaces or deletes: a run's best checkpoint (replaced whenever the validation
// loss improves), a checkpoint-N (pruned by --keep-checkpoints, deleted by --overwrite), a run's adapter folder
// (rewritten when the run ends), a save's temporary folder, or any folder holding trainer_state.json (a
// checkpoint). It returns that folder, the run folder above it ("" when there is none) and why its contents are
// not safe there. A run folder itself is not reported: files beside run.yaml (RUN/exports/...) survive.
func managedFolder(path string) (dir, run, why string, ok bool) {
	p := realPath(path)
	for d := p; ; d = filepath.Dir(d) {
		parent, base := filepath.Dir(d), filepath.Base(d)
		if isRunFolder(parent) {
			switch {
			case base == finetune.BestDir:
				return d, parent, "the run's best checkpoint, which the run replaces whenever its validation loss improves", true
			case strings.HasPrefix(base, "checkpoint-"):
				return d, parent, "a checkpoint of the run, which pruning (--keep-checkpoints) or --overwrite deletes", true
			case base == "adapter":
				return d, parent, "the run's adapter folder, which the run rewrites when it ends", true
			case strings.HasPrefix(base, ".checkpoint-") || strings.HasPrefix(base, "."+finetune.BestDir+"."):
				return d, parent, "a temporary folder of a checkpoint being saved", true
			}
		}
		if _, err := os.Stat(filepath.Join(d, finetune.StateFile)); err == nil {
			run := ""
			if isRunFolder(parent) {
				run = parent
			}
			return d, run, "a checkpoint (it holds " + finetune.StateFile + ")", true
		}
		if parent == d {
			return "", "", "", false
		}
	}
}

// isRunFolder reports whether dir is a training output folder (it holds run.yaml).
func isRunFolder(dir string) bool {
	st, err := os.Stat(filepath.Join(dir, finetune.RunFile))
	return err == nil && !st.IsDir()
}

// notInManaged refuses an output path (named by flag) that is or lies in a folder training manages
// (managedFolder), suggesting a path of the same name under the run's exports folder (suggest: e.g. "peft-best"
// or "model.gguf").
func notInManaged(flag, path, suggest string) error {
	dir, run, why, ok := managedFolder(path)
	if !ok {
		return nil
	}
	where := "a folder of its own outside " + dir
	if run != "" {
		where = "e.g. " + filepath.Join(run, "exports", suggest)
		if _, err := os.Stat(filepath.Join(run, "exports")); err != nil && filepath.Ext(suggest) != "" {
			where += " (make the folder first: mkdir " + filepath.Join(run, "exports") + ")" // a file export needs its folder
		}
	}
	if realPath(path) == dir {
		return usagef("%s %s is %s: anything written there is lost; write to %s", flag, path, why, where)
	}
	return usagef("%s %s lies in %s, %s: anything written there is lost; write to %s", flag, path, dir, why, where)
}
