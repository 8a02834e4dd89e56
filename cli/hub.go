package cli

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/memfit/memfit/data/hfdata"
	"github.com/memfit/memfit/finetune"
	"github.com/memfit/memfit/hfhub"
)

// Hub ids are resolved here, at the edge: every library call below takes local paths (a snapshot folder of the
// huggingface_hub cache is a model folder like any other).

// hubWants says what a command reads of a model repository.
type hubWants int

const (
	// hubFiles: the files a run reads (config, weights, tokenizer); hubConfig: config.json alone (memory's
	// planners); hubResolve: the commit only, nothing downloaded (--dry-run).
	hubFiles hubWants = iota
	hubConfig
	hubResolve
)

// hubClient is a Hub client configured from the environment, its progress and notes on the command's stderr.
func hubClient(cmd *cobra.Command) *hfhub.Client {
	w := cmd.ErrOrStderr()
	c := hfhub.New(hfhub.FromEnv(), w)
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		c.Terminal = true
	}
	return c
}

// interruptible is a context that Ctrl-C or SIGTERM cancels (a download stops, its partial file kept for the
// next run to resume); the signal is kept for the exit code (interrupted).
func interruptible() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case s := <-ch:
			lastInterrupt.Store(s)
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, func() { signal.Stop(ch); cancel() }
}

// lastInterrupt is the signal that last stopped a download.
var lastInterrupt atomic.Value

// interrupted is the error of a download stopped by a signal: exit 130 for Ctrl-C, 143 for SIGTERM, as an
// interrupted training run (probe 2026-11-27-b, k2: it exited 1).
func interrupted(flag, value string) error {
	code := ExitFailure
	if s, ok := lastInterrupt.Load().(os.Signal); ok {
		code = signalExitCode(s)
	}
	return exitError{code: code, err: fmt.Errorf("%s %s: download interrupted (what arrived is kept: run again to resume)", flag, value)}
}

// hubModel resolves the value of a flag that takes a model (or PEFT adapter) folder: the value itself when a
// file or folder of that name exists, or when it is not spelled as a Hub id (ORG/NAME[@REVISION], hf://...; the
// command's own checks then say what is wrong with it); else the repository's snapshot folder in the
// huggingface_hub cache, its files downloaded as needed (progress on stderr), and where it came from.
func hubModel(cmd *cobra.Command, flag, value string, wants hubWants) (string, *finetune.HubSource, error) {
	if value == "" {
		return value, nil, nil
	}
	if st, err := os.Lstat(value); err == nil {
		if _, isID, _ := hfhub.ParseModel(value); isID && st.IsDir() && !holdsAny(value, "config.json", finetune.AdapterConfig, finetune.StateFile, finetune.RunFile) {
			// A folder named like a Hub id that is no model: say that the Hub was not asked (probe s1).
			return "", nil, usagef("%s %s: the folder %s here holds no model (no config.json or %s); to read the Hub's %s instead, name it hf://%s", flag, value, value, finetune.AdapterConfig, value, value)
		}
		return value, nil, nil
	}
	r, ok, err := hfhub.ParseModel(value)
	if err != nil {
		return "", nil, usagef("%s %v", flag, err)
	}
	if !ok {
		return value, nil, nil
	}
	ctx, stop := interruptible()
	defer stop()
	c := hubClient(cmd)
	var snap *hfhub.Snapshot
	switch wants {
	case hubFiles:
		snap, err = c.Model(ctx, r)
	case hubConfig:
		snap, err = c.ModelConfig(ctx, r)
	case hubResolve:
		snap, err = c.Resolve(ctx, r)
	}
	if err != nil {
		return "", nil, hubError(flag, value, err)
	}
	return snap.Dir, &finetune.HubSource{Repo: r.ID, Revision: r.Revision, Commit: snap.Commit}, nil
}

// holdsAny says whether the folder dir holds a file of one of names.
func holdsAny(dir string, names ...string) bool {
	for _, n := range names {
		if _, err := os.Stat(filepath.Join(dir, n)); err == nil {
			return true
		}
	}
	return false
}

// hubError is a Hub error for a flag's value: for a name that is neither a local path nor a repository the Hub
// knows, both are said (it may be a mistyped folder).
func hubError(flag, value string, err error) error {
	if strings.HasPrefix(flag, "--") && (errors.Is(err, hfhub.ErrNotFound) || errors.Is(err, hfhub.ErrOffline)) {
		return fmt.Errorf("%s %s: no such file or folder here, and %v", flag, value, err)
	}
	if !strings.HasPrefix(flag, "--") && flag != "download" { // a run's recorded source (restoreHub): no local path was given
		return fmt.Errorf("%s: %w", flag, err)
	}
	if errors.Is(err, context.Canceled) {
		return interrupted(flag, value)
	}
	return err
}

// hubFolders resolves a command's --model and --adapter in place (hubModel; "" stays ""), and says where each
// came from (nil: a local path).
func hubFolders(cmd *cobra.Command, model, adapter *string) (modelHub, adapterHub *finetune.HubSource, err error) {
	if *model, modelHub, err = hubModel(cmd, "--model", *model, hubFiles); err != nil {
		return nil, nil, err
	}
	if *adapter, adapterHub, err = hubModel(cmd, "--adapter", *adapter, hubFiles); err != nil {
		return nil, nil, err
	}
	return modelHub, adapterHub, nil
}

// hubSources are where train's inputs came from (nil: local paths).
type hubSources struct {
	model, data, evalData, initAdapter *finetune.HubSource
}

// hubData resolves a flag that takes data: an hf://datasets/ORG/NAME[@REVISION][/PATH] URL becomes the local
// path of the files the run reads (opts's config and split, as finetune reads them: the same selection), in the
// huggingface_hub cache; anything else is returned as it is.
func hubData(cmd *cobra.Command, flag, value string, opts finetune.DataOptions) (string, *finetune.HubSource, error) {
	if !hfhub.IsDataURL(value) {
		if _, err := os.Lstat(value); err != nil && value != "" {
			if id, _, _ := strings.Cut(value, "@"); hfhub.ValidID(id) {
				// datasets' load_dataset("ORG/NAME") spelling (probe u1)
				return "", nil, usagef("%s %s: no such file or folder here; a Hub dataset is named hf://datasets/%s", flag, value, value)
			}
		}
		return value, nil, nil
	}
	ref, err := hfhub.ParseData(value)
	if err != nil {
		return "", nil, usagef("%s %v", flag, err)
	}
	ctx, stop := interruptible()
	defer stop()
	var config string
	snap, err := hubClient(cmd).Dataset(ctx, ref, dataSelector(opts, &config))
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return "", nil, interrupted(flag, value)
		}
		return "", nil, err
	}
	src := &finetune.HubSource{Repo: ref.ID, Revision: snap.Repo.Revision, Commit: snap.Commit, Path: ref.Path, Config: config}
	if snap.Converted {
		src.Path, src.Config = snap.Config, ""
	}
	return snap.Path, src, nil
}

// dataSelector picks a dataset's files as finetune's parquet loader picks them in a local folder
// (hfdata.SelectListing: the same selection), with the card that chose them; *config is set to the config
// chosen (the card's default, or the conversion's only or "default" one), which the local read is then given.
func dataSelector(opts finetune.DataOptions, config *string) hfhub.Selector {
	*config = opts.Config
	return func(fsys fs.FS, name string, converted bool) ([]string, error) {
		if converted && *config == "" {
			// The conversion has a folder per config: the one the card chose was kept in *config; else its only
			// one, or the one named default.
			entries, _ := fs.ReadDir(fsys, ".")
			var names []string
			for _, e := range entries {
				if e.IsDir() {
					names = append(names, e.Name())
				}
			}
			switch {
			case len(names) == 1:
				*config = names[0]
			case slices.Contains(names, "default"):
				*config = "default"
			default:
				return nil, fmt.Errorf("%s holds several configs (%s): choose one with --data-config", name, strings.Join(names, ", "))
			}
		}
		split := opts.Split
		if split == "" && opts.ValidationSplit { // validation data: the first validation split the dataset has
			for _, s := range hfdata.EvalSplits {
				if _, _, err := hfdata.SelectListing(fsys, name, *config, s); err == nil {
					split = s
					break
				}
			}
		}
		files, chosen, err := hfdata.SelectListing(fsys, name, *config, split)
		*config = chosen
		if errors.Is(err, hfdata.ErrNotParquet) {
			return nil, fmt.Errorf("%w: %v", hfhub.ErrNotParquet, err)
		}
		if err != nil {
			return nil, err
		}
		if _, err := fs.Stat(fsys, hfdata.CardFile); err == nil {
			files = append(files, hfdata.CardFile)
		}
		return files, nil
	}
}

// restoreHub makes a saved run's Hub inputs local again where their folders in the cache are gone (a cleared or
// moved cache, another machine): each is fetched anew at the commit run.yaml recorded (offline: found in the
// cache), so a resumed or exported run reads exactly what it started from.
func restoreHub(cmd *cobra.Command, spec *finetune.RunSpec) error {
	gone := func(p string) bool {
		_, err := os.Stat(p)
		return p != "" && err != nil
	}
	var err error
	if src := spec.ModelHub; src != nil && gone(spec.Model) {
		if spec.Model, _, err = hubModel(cmd, "the run's base model", src.Repo+"@"+src.Commit, hubFiles); err != nil {
			return err
		}
	}
	if src := spec.DataHub; src != nil && gone(spec.Data) {
		if spec.Data, _, err = hubData(cmd, "the run's data", dataURL(src), spec.DataOptions); err != nil {
			return err
		}
	}
	if src := spec.EvalDataHub; src != nil && gone(spec.EvalData) {
		if spec.EvalData, _, err = hubData(cmd, "the run's validation data", dataURL(src), spec.EvalDataOptions()); err != nil {
			return err
		}
	}
	return nil
}

// dataURL is the hf:// URL of a recorded dataset, pinned to its commit.
func dataURL(src *finetune.HubSource) string {
	u := "hf://datasets/" + src.Repo + "@" + src.Commit
	if src.Path != "" {
		u += "/" + src.Path
	}
	return u
}
