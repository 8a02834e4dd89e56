package hfhub

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/memfit/memfit/internal/readfile"
)

// The huggingface_hub cache layout (file_download.py, _tree_cache.py), which memfit writes and reads as Python
// does, so that either finds what the other downloaded:
//
//	CACHE/models--ORG--NAME/
//	  blobs/ETAG                 a file's bytes, named by its sha256 (LFS files) or git blob id (others)
//	  blobs/ETAG.incomplete      a download under way (memfit resumes it)
//	  snapshots/COMMIT/PATH      a relative link to ../../blobs/ETAG, made once the blob is checked
//	  refs/REVISION              the commit a branch or tag last resolved to (refs/refs/convert/parquet too)
//	  trees/COMMIT.json          the commit's file list (format_version 1)
//	CACHE/.locks/models--ORG--NAME/ETAG.lock   held while ETAG downloads
//	CACHE/CACHEDIR.TAG

// commitRE is huggingface_hub's REGEX_COMMIT_HASH.
var commitRE = regexp.MustCompile(`^[0-9a-f]{40}$`)

// IsCommit says whether rev is a full commit hash.
func IsCommit(rev string) bool { return commitRE.MatchString(rev) }

func (c *Client) repoDir(r Repo) string { return filepath.Join(c.env.Cache, r.folder()) }

// SnapshotDir is the folder of a commit's files in the cache.
func (c *Client) SnapshotDir(r Repo, commit string) string {
	return filepath.Join(c.repoDir(r), "snapshots", commit)
}

func (c *Client) blobPath(r Repo, etag string) string {
	return filepath.Join(c.repoDir(r), "blobs", etag)
}

func (c *Client) lockPath(r Repo, etag string) string {
	return filepath.Join(c.env.Cache, ".locks", r.folder(), etag+".lock")
}

// cachedCommit is the commit r's revision resolves to in the cache: the revision itself when it is a commit
// with a snapshot, else what refs/REVISION holds ("" when neither).
func (c *Client) cachedCommit(r Repo) string {
	rev := r.Rev()
	if IsCommit(rev) {
		if _, err := os.Stat(c.SnapshotDir(r, rev)); err == nil {
			return rev
		}
		return ""
	}
	data, err := readfile.Read(filepath.Join(c.repoDir(r), "refs", filepath.FromSlash(rev)), readfile.Small)
	if err != nil {
		return ""
	}
	if commit := strings.TrimSpace(string(data)); IsCommit(commit) {
		return commit
	}
	return ""
}

// writeRef records that r's revision resolved to commit (nothing for a revision that is the commit), atomically
// as huggingface_hub's _cache_commit_hash_for_specific_revision does.
func (c *Client) writeRef(r Repo, commit string) error {
	rev := r.Rev()
	if rev == commit {
		return nil
	}
	path := filepath.Join(c.repoDir(r), "refs", filepath.FromSlash(rev))
	if old, err := readfile.Read(path, readfile.Small); err == nil && string(old) == commit {
		return nil
	}
	if err := c.makeRepoDir(r); err != nil {
		return err
	}
	return writeAtomic(path, []byte(commit))
}

// makeRepoDir makes the repository's cache folder with its snapshots/ (huggingface_hub's scan_cache_dir calls
// a repository folder without one corrupted).
func (c *Client) makeRepoDir(r Repo) error {
	return os.MkdirAll(filepath.Join(c.repoDir(r), "snapshots"), 0o755)
}

// File is one file of a repository at a commit, as the Hub lists it.
type File struct {
	// Path is the file's path in the repository (slash-separated).
	Path string
	// Size is its size in bytes; BlobID its git blob id.
	Size   int64
	BlobID string
	// LFSSHA256 is the sha256 of an LFS file's content ("" for a file in git).
	LFSSHA256 string
}

// etag is the name of the file's blob: the sha256 of an LFS file, else its git blob id (what the Hub's
// X-Linked-Etag or ETag says).
func (f File) etag() string {
	if f.LFSSHA256 != "" {
		return f.LFSSHA256
	}
	return f.BlobID
}

// treeFile is huggingface_hub's trees/COMMIT.json (format_version 1).
type treeFile struct {
	FormatVersion int                  `json:"format_version"`
	Files         map[string]treeEntry `json:"files"`
}

type treeEntry struct {
	Size      int64  `json:"size"`
	BlobID    string `json:"blob_id"`
	LFSSHA256 string `json:"lfs_sha256,omitempty"`
	LFSSize   int64  `json:"lfs_size,omitempty"`
}

func (c *Client) treePath(r Repo, commit string) string {
	return filepath.Join(c.repoDir(r), "trees", commit+".json")
}

// writeTree caches the whole file list of a commit (a commit never changes, so the list never goes stale).
func (c *Client) writeTree(r Repo, commit string, files []File) error {
	t := treeFile{FormatVersion: 1, Files: map[string]treeEntry{}}
	for _, f := range files {
		e := treeEntry{Size: f.Size, BlobID: f.BlobID, LFSSHA256: f.LFSSHA256}
		if f.LFSSHA256 != "" {
			e.LFSSize = f.Size
		}
		t.Files[f.Path] = e
	}
	data, err := json.MarshalIndent(t, "", "  ")
	if err != nil {
		return err
	}
	if err := c.makeRepoDir(r); err != nil {
		return err
	}
	return writeAtomic(c.treePath(r, commit), data)
}

// readTree reads a cached file list (nil when there is none or it is not one memfit reads).
func (c *Client) readTree(r Repo, commit string) []File {
	data, err := readfile.Read(c.treePath(r, commit), readfile.Config)
	if err != nil {
		return nil
	}
	var t treeFile
	if json.Unmarshal(data, &t) != nil || t.FormatVersion != 1 {
		return nil
	}
	files := make([]File, 0, len(t.Files))
	for p, e := range t.Files {
		files = append(files, File{Path: p, Size: e.Size, BlobID: e.BlobID, LFSSHA256: e.LFSSHA256})
	}
	slices.SortFunc(files, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	return files
}

// snapshotFiles lists the files a cached snapshot holds (links whose blob is there), for an offline run of a
// commit whose file list was not cached.
func snapshotFiles(dir string) []File {
	var files []File
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		st, err := os.Stat(p) // follows the link: a dangling one is not a file
		if err != nil || !st.Mode().IsRegular() {
			return nil
		}
		rel, _ := filepath.Rel(dir, p)
		files = append(files, File{Path: filepath.ToSlash(rel), Size: st.Size()})
		return nil
	})
	return files
}

var linkSeq atomic.Int64

// link makes snapshots/COMMIT/PATH a relative link to the blob, as huggingface_hub's _create_symlink does.
func (c *Client) link(r Repo, commit, path, blob string) (string, error) {
	dst := filepath.Join(c.SnapshotDir(r, commit), filepath.FromSlash(path))
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return "", err
	}
	rel, err := filepath.Rel(filepath.Dir(dst), blob)
	if err != nil {
		rel = blob
	}
	if cur, err := os.Readlink(dst); err == nil && cur == rel {
		return dst, nil
	}
	tmp := fmt.Sprintf("%s.%d-%d.tmp", dst, os.Getpid(), linkSeq.Add(1))
	if err := os.Symlink(rel, tmp); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.Remove(tmp)
		return "", err
	}
	return dst, nil
}

// cacheDirTag is the CACHEDIR.TAG huggingface_hub writes (backup tools skip a folder holding it).
const cacheDirTag = "Signature: 8a477f597d28d172789f06886806bc55\n# This file is a cache directory tag created by huggingface_hub.\n# For information about cache directory tags, see:\n#\thttps://bford.info/cachedir/\n"

func (c *Client) tagCache() {
	path := filepath.Join(c.env.Cache, "CACHEDIR.TAG")
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		_ = writeAtomic(path, []byte(cacheDirTag))
	}
}

// cacheWriteError turns an error writing the cache (a read-only file system, no permission) into one line that
// names the cache and what to do (probe 2026-11-27-b r2, r3, r5: it named a hidden temporary file or a lock).
func (c *Client) cacheWriteError(err error) error {
	var pe *fs.PathError
	if err == nil || !errors.As(err, &pe) || !(errors.Is(err, syscall.EROFS) || errors.Is(err, fs.ErrPermission)) {
		return err
	}
	if rel, rerr := filepath.Rel(c.env.Cache, pe.Path); rerr != nil || strings.HasPrefix(rel, "..") {
		return err
	}
	return fmt.Errorf("the Hub cache %s cannot be written (%v): set HF_HUB_CACHE (or HF_HOME) to a folder you can write, or, if everything the run reads is cached, HF_HUB_OFFLINE=1", c.env.Cache, pe.Err)
}

// writeAtomic writes data to path through a temporary file renamed into place (readers see all or nothing).
func writeAtomic(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(f.Name())
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Chmod(f.Name(), 0o644); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), path); err != nil {
		os.Remove(f.Name())
		return err
	}
	return nil
}
