package hfhub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/memfit/memfit/internal/readfile"
)

// Snapshot is a repository's files at one commit, in the cache.
type Snapshot struct {
	Repo Repo
	// Commit is the commit the revision resolved to.
	Commit string
	// Dir is snapshots/COMMIT in the cache: a model folder memfit reads as any other.
	Dir string
	// Files are the files made available (paths in the repository).
	Files []string
}

// Weights and index of a transformers checkpoint, and of a PEFT adapter.
const (
	weightsFile        = "model.safetensors"
	weightsIndexFile   = "model.safetensors.index.json"
	adapterConfigFile  = "adapter_config.json"
	adapterWeightsFile = "adapter_model.safetensors"
)

// modelFile says whether a top-level file of a model repository is one a run reads: the configs (config.json,
// generation_config.json, preprocessor_config.json, adapter_config.json, ...), the tokenizer (tokenizer.json,
// tokenizer_config.json, special_tokens_map.json, added_tokens.json, tokenizer.model and other SentencePiece
// models, vocab.json, merges.txt, vocab.txt) and chat templates. The weights are chosen by modelFiles; copies in
// other formats (.bin, .pth, .pt, .onnx, .gguf, .msgpack, .h5) and subfolders (original/, onnx/) are not read.
func modelFile(name string) bool {
	if strings.Contains(name, "/") {
		return false
	}
	switch path.Ext(name) {
	case ".json":
		return !strings.HasSuffix(name, ".index.json") || name == weightsIndexFile
	case ".model", ".jinja":
		return true
	}
	return name == "merges.txt" || name == "vocab.txt"
}

// modelFiles picks the files a run needs from a model repository's list: modelFile's, and the safetensors
// weights (model.safetensors, or the shards model.safetensors.index.json names, resolved once the index is
// read: shards is nil until then; adapter_model.safetensors for a PEFT adapter).
func (c *Client) modelFiles(r Repo, files []File, index []byte) (need []File, err error) {
	by := map[string]File{}
	for _, f := range files {
		by[f.Path] = f
	}
	_, hasConfig := by["config.json"]
	_, hasAdapter := by[adapterConfigFile]
	if !hasConfig && !hasAdapter {
		return nil, errorf(ErrNoFile, "%s has neither config.json nor %s: it is not a transformers model or PEFT adapter memfit reads", r.describe(), adapterConfigFile)
	}
	for _, f := range files {
		if modelFile(f.Path) {
			need = append(need, f)
		}
	}
	add := func(name string) error {
		f, ok := by[name]
		if !ok {
			return errorf(ErrNoFile, "%s: %s names the shard %s, which the repository does not have", r.describe(), weightsIndexFile, name)
		}
		if !slices.ContainsFunc(need, func(g File) bool { return g.Path == name }) {
			need = append(need, f)
		}
		return nil
	}
	if _, ok := by[adapterWeightsFile]; ok {
		need = append(need, by[adapterWeightsFile])
	}
	switch _, hasIndex := by[weightsIndexFile]; {
	case hasIndex && index != nil:
		var idx struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(index, &idx); err != nil || len(idx.WeightMap) == 0 {
			return nil, errorf(ErrNoFile, "%s: its %s is not a safetensors index (no weight_map)", r.describe(), weightsIndexFile)
		}
		shards := map[string]bool{}
		for _, s := range idx.WeightMap {
			shards[s] = true
		}
		for _, s := range slices.Sorted(maps.Keys(shards)) {
			if strings.Contains(s, "/") || strings.Contains(s, "\\") || !strings.HasSuffix(s, ".safetensors") {
				return nil, errorf(ErrNoFile, "%s: its %s names %q, not a safetensors file beside it", r.describe(), weightsIndexFile, s)
			}
			if err := add(s); err != nil {
				return nil, err
			}
		}
	case hasIndex:
	case hasConfig:
		if _, ok := by[weightsFile]; !ok {
			var others []string
			for _, f := range files {
				if !strings.Contains(f.Path, "/") && isWeights(f.Path) {
					others = append(others, f.Path)
				}
			}
			have := "no weights file"
			if len(others) > 0 {
				have = "only " + strings.Join(others, ", ")
			}
			return nil, errorf(ErrNoFile, "%s has no safetensors weights (%s; memfit reads %s or %s): many repositories have them on a branch such as refs/pr/N (see %s/discussions), or save the model with transformers' save_pretrained", r.describe(), have, weightsFile, weightsIndexFile, c.page(r))
		}
		if err := add(weightsFile); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(need, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	return need, nil
}

func isWeights(name string) bool {
	for _, ext := range []string{".bin", ".pth", ".pt", ".safetensors", ".ckpt", ".h5", ".msgpack", ".onnx", ".gguf"} {
		if strings.HasSuffix(name, ext) {
			return true
		}
	}
	return false
}

// Model makes the files a memfit run needs from a model (or PEFT adapter) repository available in the cache,
// downloading what the cache lacks, and returns the snapshot: a folder memfit reads as any model folder. Online
// it resolves the revision with /api/models/ID/revision/REV?blobs=true (which lists the files with their sizes
// and sha256s) and records it in refs/; offline (HF_HUB_OFFLINE) it reads refs/ and the snapshot alone.
func (c *Client) Model(ctx context.Context, r Repo) (_ *Snapshot, err error) {
	defer func() { err = c.cacheWriteError(err) }()
	if c.env.Offline {
		return c.offlineModel(r)
	}
	commit, files, err := c.info(ctx, r, true)
	if err != nil {
		return nil, c.withCacheHint(r, err)
	}
	if err := c.writeRef(r, commit); err != nil {
		return nil, err
	}
	if err := c.writeTree(r, commit, files); err != nil {
		return nil, err
	}
	need, err := c.modelFiles(r, files, nil)
	if err != nil {
		return nil, err
	}
	if err := c.checkTotalSpace(r, need); err != nil {
		return nil, err
	}
	snap := &Snapshot{Repo: r, Commit: commit, Dir: c.SnapshotDir(r, commit)}
	for _, f := range need {
		if _, err := c.fetch(ctx, r, commit, f); err != nil {
			return nil, err
		}
	}
	if slices.ContainsFunc(need, func(f File) bool { return f.Path == weightsIndexFile }) {
		index, err := readfile.Read(filepath.Join(snap.Dir, weightsIndexFile), readfile.Config)
		if err != nil {
			return nil, err
		}
		if need, err = c.modelFiles(r, files, index); err != nil {
			return nil, err
		}
		if err := c.checkTotalSpace(r, need); err != nil {
			return nil, err
		}
		for _, f := range need {
			if _, err := c.fetch(ctx, r, commit, f); err != nil {
				return nil, err
			}
		}
	}
	for _, f := range need {
		snap.Files = append(snap.Files, f.Path)
	}
	return snap, nil
}

// offlineModel finds a model in the cache alone.
func (c *Client) offlineModel(r Repo) (*Snapshot, error) {
	commit := c.cachedCommit(r)
	if commit == "" {
		return nil, errorf(ErrOffline, "HF_HUB_OFFLINE is set and %s is not in the cache (%s): run once without it, or fetch it first with `finetune download %s`", r.describe(), c.env.Cache, r)
	}
	dir := c.SnapshotDir(r, commit)
	files := c.readTree(r, commit)
	if files == nil {
		files = snapshotFiles(dir)
	}
	var index []byte
	if slices.ContainsFunc(files, func(f File) bool { return f.Path == weightsIndexFile }) {
		var err error
		if index, err = readfile.Read(filepath.Join(dir, weightsIndexFile), readfile.Config); err != nil {
			return nil, c.offlineMissing(r, commit, weightsIndexFile)
		}
	}
	need, err := c.modelFiles(r, files, index)
	if err != nil {
		return nil, err
	}
	snap := &Snapshot{Repo: r, Commit: commit, Dir: dir}
	for _, f := range need {
		if !fileExists(filepath.Join(dir, filepath.FromSlash(f.Path))) {
			return nil, c.offlineMissing(r, commit, f.Path)
		}
		snap.Files = append(snap.Files, f.Path)
	}
	return snap, nil
}

func (c *Client) offlineMissing(r Repo, commit, file string) error {
	return errorf(ErrOffline, "HF_HUB_OFFLINE is set and the cached %s (commit %s) lacks %s: run once without it, or fetch it with `finetune download %s`", r.describe(), commit[:12], file, r)
}

// withCacheHint adds to an unreachable Hub's error whether the cache has the repository (then HF_HUB_OFFLINE=1
// uses it).
func (c *Client) withCacheHint(r Repo, err error) error {
	if !errors.Is(err, ErrUnreachable) {
		return err
	}
	if commit := c.cachedCommit(r); commit != "" {
		return errorf(ErrUnreachable, "%v: %s is in the cache (commit %s): set HF_HUB_OFFLINE=1 to use it without the Hub", err, r.describe(), commit[:12])
	}
	return errorf(ErrUnreachable, "%v: nothing of %s is in the cache (%s); check the network, or HF_ENDPOINT for a mirror", err, r.describe(), c.env.Cache)
}

// checkTotalSpace refuses, before any download, files whose blobs the cache lacks and the disk has no room for.
func (c *Client) checkTotalSpace(r Repo, files []File) error {
	var need int64
	for _, f := range files {
		if e := f.etag(); e == "" || !fileExists(c.blobPath(r, e)) {
			need += f.Size
			if st, err := os.Stat(c.blobPath(r, e) + ".incomplete"); e != "" && err == nil {
				need -= min(st.Size(), f.Size)
			}
		}
	}
	return c.checkSpace(r, fmt.Sprintf("(%d files)", len(files)), filepath.Join(c.repoDir(r), "blobs"), need)
}

// ModelConfig is Model for a run that reads only the model's config.json (or a PEFT adapter's
// adapter_config.json): the planners of `finetune memory`, which need no weights.
func (c *Client) ModelConfig(ctx context.Context, r Repo) (_ *Snapshot, err error) {
	defer func() { err = c.cacheWriteError(err) }()
	var commit string
	var files []File
	if c.env.Offline {
		if commit = c.cachedCommit(r); commit == "" {
			return nil, errorf(ErrOffline, "HF_HUB_OFFLINE is set and %s is not in the cache (%s): run once without it, or fetch it first with `finetune download %s`", r.describe(), c.env.Cache, r)
		}
		if files = c.readTree(r, commit); files == nil {
			files = snapshotFiles(c.SnapshotDir(r, commit))
		}
	} else {
		var err error
		if commit, files, err = c.info(ctx, r, true); err != nil {
			return nil, c.withCacheHint(r, err)
		}
		if err := c.writeRef(r, commit); err != nil {
			return nil, err
		}
		if err := c.writeTree(r, commit, files); err != nil {
			return nil, err
		}
	}
	for _, name := range []string{"config.json", adapterConfigFile} {
		i := slices.IndexFunc(files, func(f File) bool { return f.Path == name })
		if i < 0 {
			continue
		}
		snap := &Snapshot{Repo: r, Commit: commit, Dir: c.SnapshotDir(r, commit), Files: []string{name}}
		if c.env.Offline {
			if !fileExists(filepath.Join(snap.Dir, name)) {
				return nil, c.offlineMissing(r, commit, name)
			}
			return snap, nil
		}
		if _, err := c.fetch(ctx, r, commit, files[i]); err != nil {
			return nil, err
		}
		return snap, nil
	}
	return nil, errorf(ErrNoFile, "%s has neither config.json nor %s: it is not a transformers model or PEFT adapter memfit reads", r.describe(), adapterConfigFile)
}

// Resolve finds the commit a repository's revision resolves to (the Hub's answer, or offline the cache's
// refs/), recording it in refs/, and downloads nothing: the snapshot's Dir is where its files go.
func (c *Client) Resolve(ctx context.Context, r Repo) (_ *Snapshot, err error) {
	defer func() { err = c.cacheWriteError(err) }()
	var commit string
	if c.env.Offline {
		if commit = c.cachedCommit(r); commit == "" {
			return nil, errorf(ErrOffline, "HF_HUB_OFFLINE is set and %s is not in the cache (%s): run once without it, or fetch it first with `finetune download %s`", r.describe(), c.env.Cache, r)
		}
	} else {
		var err error
		if commit, _, err = c.info(ctx, r, false); err != nil {
			return nil, c.withCacheHint(r, err)
		}
		if err := c.writeRef(r, commit); err != nil {
			return nil, err
		}
	}
	return &Snapshot{Repo: r, Commit: commit, Dir: c.SnapshotDir(r, commit)}, nil
}
