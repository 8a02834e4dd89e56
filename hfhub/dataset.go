package hfhub

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// ErrNotParquet is what a Selector returns (wrapped) when the files it would read are not parquet (CSV, JSON,
// text, ... or none): Dataset then reads the Hub's parquet conversion of the dataset instead.
var ErrNotParquet = errors.New("not parquet")

// ConvertRevision is the branch where the Hub keeps its parquet conversion of a dataset (CONFIG/SPLIT/NNNN.parquet).
const ConvertRevision = "refs/convert/parquet"

// Selector picks the files to read in a dataset's file list, given as a file system rooted at the dataset (or at
// the folder its URL names): paths relative to that root. Reading a file of fsys (its README.md, for the
// card's configs) downloads it. name is the listing's hf:// URL, for messages; converted says it is the Hub's
// parquet conversion (CONFIG/SPLIT/NNNN.parquet). It is the same function that picks them in a local dataset
// folder.
type Selector func(fsys fs.FS, name string, converted bool) ([]string, error)

// DataSnapshot is a dataset's files at one commit, in the cache.
type DataSnapshot struct {
	// Repo is the repository and revision read: the Hub's parquet conversion (refs/convert/parquet) when the
	// dataset has no parquet files of its own.
	Repo   Repo
	Commit string
	// Dir is snapshots/COMMIT in the cache; Path the local path of what the URL named (Dir itself, a folder in
	// it, or a file).
	Dir, Path string
	// Files are the files made available (paths relative to Path's folder; the file itself for a file).
	Files []string
	// Converted says the files are the Hub's parquet conversion; Config is then the config folder Path is.
	Converted bool
	Config    string
}

// Dataset makes the files of a dataset that sel picks available in the cache (downloading what it lacks) and
// returns where they are: a dataset folder (or file) memfit reads as any other. Online it resolves the revision
// (/api/datasets/ID/revision/REV) and lists the commit's files (/api/datasets/ID/tree/COMMIT?recursive=true,
// all pages); a URL naming a file downloads that file alone. A dataset whose selected files are not parquet is
// read from the Hub's parquet conversion (the refs/convert/parquet branch). Offline (HF_HUB_OFFLINE) it reads
// refs/, the cached file list and the snapshot alone.
func (c *Client) Dataset(ctx context.Context, ref DataRef, sel Selector) (_ *DataSnapshot, err error) {
	defer func() { err = c.cacheWriteError(err) }()
	r := ref.Repo
	r.Kind = Dataset
	commit, files, err := c.listing(ctx, r)
	if err != nil {
		return nil, err
	}
	snap := &DataSnapshot{Repo: r, Commit: commit, Dir: c.SnapshotDir(r, commit)}
	root := ref.Path
	if root != "" {
		if i := slices.IndexFunc(files, func(f File) bool { return f.Path == root }); i >= 0 {
			local, err := c.get(ctx, r, commit, files[i])
			if err != nil {
				return nil, err
			}
			snap.Path, snap.Files = local, []string{path.Base(root)}
			return snap, nil
		}
		var sub []File
		for _, f := range files {
			if rest, ok := strings.CutPrefix(f.Path, root+"/"); ok {
				f.Path = rest
				sub = append(sub, f)
			}
		}
		if len(sub) == 0 {
			return nil, errorf(ErrNoFile, "%s has no file or folder %s", r.describe(), root)
		}
		files = sub
	}
	picked, err := c.pick(ctx, r, commit, root, files, sel, ref.String(), false)
	switch {
	case errors.Is(err, ErrNotParquet) && root != "":
		return nil, errorf(ErrNoFile, "%s: %s holds no parquet files (%s): name the dataset without /%s to read the Hub's parquet conversion of it, or name one file", r.describe(), root, fileList(files), root)
	case errors.Is(err, ErrNotParquet) && r.Rev() != DefaultRevision:
		return nil, errorf(ErrNoFile, "%s holds no parquet files (%s), and the Hub's parquet conversion (%s) is of its main branch only", r.describe(), fileList(files), ConvertRevision)
	case errors.Is(err, ErrNotParquet):
		return c.converted(ctx, r, sel, fileList(files), firstDataFile(files))
	case err != nil:
		return nil, err
	}
	snap.Path = filepath.Join(snap.Dir, filepath.FromSlash(root))
	snap.Files = picked
	return snap, nil
}

// fileList names a dataset's data files (not its card or git attributes) for messages: "its files: a, b, c and
// N more".
func fileList(files []File) string {
	var names []string
	for _, f := range files {
		if f.Path != "README.md" && f.Path != ".gitattributes" {
			names = append(names, f.Path)
		}
	}
	switch {
	case len(names) == 0:
		return "no data files"
	case len(names) > 3:
		return fmt.Sprintf("its files: %s and %d more", strings.Join(names[:3], ", "), len(names)-3)
	}
	return "its files: " + strings.Join(names, ", ")
}

// firstDataFile is the first data file of a listing (PATH in messages when there is none).
func firstDataFile(files []File) string {
	for _, f := range files {
		if f.Path != "README.md" && f.Path != ".gitattributes" {
			return f.Path
		}
	}
	return "PATH"
}

// converted reads the dataset's parquet conversion (have: the dataset's own files, for messages; example: one
// of them).
func (c *Client) converted(ctx context.Context, r Repo, sel Selector, have, example string) (*DataSnapshot, error) {
	conv := Repo{Kind: Dataset, ID: r.ID, Revision: ConvertRevision}
	commit, files, err := c.listing(ctx, conv)
	if errors.Is(err, ErrRevision) {
		return nil, errorf(ErrNoFile, "%s holds no parquet files (%s) and the Hub has no parquet conversion of it (%s): name one file, e.g. hf://datasets/%s/%s", r.describe(), have, ConvertRevision, r.ID, example)
	}
	if err != nil {
		return nil, err
	}
	c.note("%s holds no parquet files (%s): reading the Hub's parquet conversion of it (%s, commit %s)", r.describe(), have, ConvertRevision, commit[:12])
	picked, err := c.pick(ctx, conv, commit, "", files, sel, DataRef{Repo: conv}.String(), true)
	if err != nil {
		return nil, err
	}
	// The conversion is CONFIG/SPLIT/NNNN.parquet: the files of one config are read as a dataset folder of
	// their own, the config's folder.
	dir := c.SnapshotDir(conv, commit)
	snap := &DataSnapshot{Repo: conv, Commit: commit, Dir: dir, Path: dir, Files: picked, Converted: true}
	if top, _, ok := strings.Cut(picked[0], "/"); ok && !slices.ContainsFunc(picked, func(p string) bool { return !strings.HasPrefix(p, top+"/") }) {
		snap.Path = filepath.Join(dir, top)
		for i, p := range picked {
			snap.Files[i] = strings.TrimPrefix(p, top+"/")
		}
		snap.Config = top
	}
	return snap, nil
}

// listing resolves a dataset revision and lists its commit's files (offline: from the cache).
func (c *Client) listing(ctx context.Context, r Repo) (string, []File, error) {
	if c.env.Offline {
		commit := c.cachedCommit(r)
		if commit == "" {
			return "", nil, errorf(ErrOffline, "HF_HUB_OFFLINE is set and %s is not in the cache (%s): run once without it, or fetch it first with `finetune download hf://datasets/%s`", r.describe(), c.env.Cache, r)
		}
		files := c.readTree(r, commit)
		if files == nil {
			files = snapshotFiles(c.SnapshotDir(r, commit))
		}
		return commit, files, nil
	}
	commit, _, err := c.info(ctx, r, false)
	if err != nil {
		return "", nil, c.withCacheHint(r, err)
	}
	if err := c.writeRef(r, commit); err != nil {
		return "", nil, err
	}
	if files := c.readTree(r, commit); files != nil {
		return commit, files, nil // a commit's list never changes
	}
	files, err := c.tree(ctx, r, commit, "")
	if err != nil {
		return "", nil, err
	}
	if err := c.writeTree(r, commit, files); err != nil {
		return "", nil, err
	}
	return commit, files, nil
}

// pick runs the selector over the listing (files relative to root) and makes the picked files available.
func (c *Client) pick(ctx context.Context, r Repo, commit, root string, files []File, sel Selector, name string, converted bool) ([]string, error) {
	by := map[string]File{}
	for _, f := range files {
		by[f.Path] = f
	}
	open := func(name string) (fs.File, error) {
		f := by[name]
		f.Path = path.Join(root, name)
		local, err := c.get(ctx, r, commit, f)
		if err != nil {
			return nil, err
		}
		return os.Open(local)
	}
	picked, err := sel(newListFS(files, open), name, converted)
	if err != nil {
		return nil, err
	}
	var need []File
	for _, p := range picked {
		f, ok := by[p]
		if !ok {
			return nil, errorf(ErrNoFile, "%s has no file %s", r.describe(), path.Join(root, p))
		}
		f.Path = path.Join(root, p)
		need = append(need, f)
	}
	if !c.env.Offline {
		if err := c.checkTotalSpace(r, need); err != nil {
			return nil, err
		}
	}
	for _, f := range need {
		if _, err := c.get(ctx, r, commit, f); err != nil {
			return nil, err
		}
	}
	return picked, nil
}

// get is fetch, or offline the cached file (an error when the cache lacks it).
func (c *Client) get(ctx context.Context, r Repo, commit string, f File) (string, error) {
	if !c.env.Offline {
		return c.fetch(ctx, r, commit, f)
	}
	local := filepath.Join(c.SnapshotDir(r, commit), filepath.FromSlash(f.Path))
	if !fileExists(local) {
		return "", errorf(ErrOffline, "HF_HUB_OFFLINE is set and the cached %s (commit %s) lacks %s: run once without it, or fetch it with `finetune download`", r.describe(), commit[:12], f.Path)
	}
	return local, nil
}
