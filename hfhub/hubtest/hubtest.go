// Package hubtest is a local stand-in of the Hugging Face Hub's HTTP API for tests: repositories held in memory,
// served with the endpoints, status codes and headers the real Hub answers with, so that memfit's Hub client is
// tested without the network. What it models, and where that comes from (huggingface_hub's source: constants.py,
// file_download.py, hf_api.py, utils/_http.py, utils/_pagination.py, _tree_cache.py):
//
//   - GET /api/{models,datasets}/ORG/NAME/revision/REV[?blobs=true]: the repository's info with "sha" (the
//     commit) and "siblings" ({"rfilename"}, plus "size", "blobId" and "lfs": {"sha256", "size",
//     "pointerSize"} with blobs=true), "private" and "gated" (hf_api.py model_info/dataset_info, RepoSibling,
//     BlobLfsInfo). REV arrives quoted whole (refs%2Fconvert%2Fparquet).
//   - GET /api/{models,datasets}/ORG/NAME/tree/REV[/PATH]?recursive=true: the files ({"type": "file", "oid",
//     "size", "path", "lfs": {"oid", "size", "pointerSize"}}) and folders ({"type": "directory"}), in pages
//     linked by a Link header with rel="next" (hf_api.py list_repo_tree, RepoFile; utils/_pagination.py).
//   - HEAD and GET /[datasets/]ORG/NAME/resolve/REV/PATH: a file in git answers 200 with its bytes, ETag (its
//     git blob id, quoted), Content-Length and X-Repo-Commit; an LFS file answers 302 to the storage host (a
//     second server: another host, as the real CDN is) with X-Linked-Etag (its sha256, quoted), X-Linked-Size
//     and X-Repo-Commit (file_download.py get_hf_file_metadata, constants.py HUGGINGFACE_HEADER_X_*). The
//     storage serves byte ranges (Range/206), names the object by an ETag of its own (an S3-style MD5, not the
//     sha256: a client must take X-Linked-Etag from the 302), and refuses a request that also carries an
//     Authorization header, as S3 does with a presigned URL.
//   - Errors as utils/_http.py hf_raise_for_status reads them: X-Error-Code RepoNotFound (401 without a token
//     for a missing or private repository, 404 with one), GatedRepo (401 without a token, 403 with a token not
//     granted), RevisionNotFound (404, "Invalid rev id"), EntryNotFound (404), and 401 with X-Error-Message
//     "Invalid credentials in Authorization header" for an unknown token. A gated repository's info is public.
//
// Faults for tests: a connection cut after N bytes of a file (once, then the file serves whole: a resume must
// continue where it stopped), bytes served corrupt (a wrong sha256), and a log of every request.
package hubtest

import (
	"bytes"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/memfit/memfit/internal/readfile"
)

// Hub is the stand-in: the Hub's API and resolve endpoints on one server, LFS storage on another.
type Hub struct {
	// Hub serves the API and resolve URLs (HF_ENDPOINT is its URL); CDN serves LFS files.
	Hub, CDN *httptest.Server
	// PageSize is how many tree entries one page holds (the real Hub's is 1000).
	PageSize int
	// Tokens are the valid tokens (a request with another one is refused as invalid credentials).
	Tokens []string

	mu       sync.Mutex
	repos    map[string]*Repo
	blobs    map[string][]byte // sha256 -> content, served by the CDN
	cuts     map[string]int64  // file path or sha256 -> bytes to send before cutting the connection (once)
	corrupt  map[string]bool   // sha256 -> serve a flipped byte
	requests []string
}

// Repo is one repository: its commits (each a full file set) and branches.
type Repo struct {
	Kind string // "model" or "dataset"
	ID   string
	// Private repositories are readable with a token in Readers only; gated ones (info public) too.
	Private, Gated bool
	Readers        []string
	Branches       map[string]string            // branch or ref (main, refs/convert/parquet) -> commit
	Commits        map[string]map[string][]byte // commit -> path -> content
}

// New starts the stand-in (closed when the test ends).
func New(t testing.TB) *Hub {
	h := &Hub{PageSize: 1000, repos: map[string]*Repo{}, blobs: map[string][]byte{}, cuts: map[string]int64{}, corrupt: map[string]bool{}}
	h.CDN = httptest.NewServer(http.HandlerFunc(h.serveCDN))
	h.Hub = httptest.NewServer(http.HandlerFunc(h.serveHub))
	t.Cleanup(func() { h.Hub.Close(); h.CDN.Close() })
	return h
}

// URL is the Hub's address, for HF_ENDPOINT.
func (h *Hub) URL() string { return h.Hub.URL }

// Add creates a repository (kind "model" or "dataset") whose branch main holds files, and returns it.
func (h *Hub) Add(kind, id string, files map[string][]byte) *Repo {
	h.mu.Lock()
	defer h.mu.Unlock()
	r := &Repo{Kind: kind, ID: id, Branches: map[string]string{}, Commits: map[string]map[string][]byte{}}
	h.repos[kind+":"+id] = r
	h.commitLocked(r, "main", files)
	return r
}

// AddDir is Add with the files of a folder (recursively; paths relative to it).
func (h *Hub) AddDir(t testing.TB, kind, id, dir string) *Repo {
	t.Helper()
	files := map[string][]byte{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := readfile.Read(p, readfile.Data)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		files[filepath.ToSlash(rel)] = data
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return h.Add(kind, id, files)
}

// Commit makes a new commit on branch (created if new) holding files, and returns its id.
func (h *Hub) Commit(r *Repo, branch string, files map[string][]byte) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.commitLocked(r, branch, files)
}

func (h *Hub) commitLocked(r *Repo, branch string, files map[string][]byte) string {
	sum := sha1.New()
	fmt.Fprintf(sum, "%s %s %s %d", r.ID, branch, time.Now().String(), len(r.Commits))
	for _, p := range slices.Sorted(maps.Keys(files)) {
		fmt.Fprintf(sum, "%s %x\n", p, sha256.Sum256(files[p]))
	}
	commit := hex.EncodeToString(sum.Sum(nil))
	r.Commits[commit] = files
	r.Branches[branch] = commit
	for p, data := range files {
		if IsLFS(p, data) {
			h.blobs[SHA256(data)] = data
		}
	}
	return commit
}

// CutAfter makes the next download of the file with this content (by path in any repository, or sha256) stop
// after n bytes by dropping the connection; later requests serve it whole.
func (h *Hub) CutAfter(key string, n int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cuts[key] = n
}

// Corrupt makes every download of the LFS object with this sha256 carry one wrong byte.
func (h *Hub) Corrupt(sha string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.corrupt[sha] = true
}

// Repos returns the repositories by "KIND:ORG/NAME" (model:ORG/NAME, dataset:ORG/NAME).
func (h *Hub) Repos() map[string]*Repo {
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.repos)
}

// Requests returns the requests served so far ("HEAD /path", "GET /path Range: bytes=N-"), Hub and CDN.
func (h *Hub) Requests() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.requests)
}

// IsLFS says whether the Hub keeps a file in LFS: safetensors, parquet and other binary formats, and anything
// over 10 MB (the Hub's default .gitattributes and its size rule).
func IsLFS(path string, data []byte) bool {
	for _, ext := range []string{".safetensors", ".parquet", ".bin", ".gguf", ".pt", ".pth", ".arrow", ".tar", ".gz", ".zip", ".model"} {
		if strings.HasSuffix(path, ext) {
			return true
		}
	}
	return len(data) > 10<<20
}

// SHA256 is the hex sha256 of data (an LFS file's X-Linked-Etag and blob name).
func SHA256(data []byte) string {
	s := sha256.Sum256(data)
	return hex.EncodeToString(s[:])
}

// GitBlobID is git's id of a file in git (sha1 of "blob SIZE\0" and the content): its ETag and blob name.
func GitBlobID(data []byte) string {
	h := sha1.New()
	fmt.Fprintf(h, "blob %d\x00", len(data))
	h.Write(data)
	return hex.EncodeToString(h.Sum(nil))
}

// pointer is the git LFS pointer file of an LFS file (what git stores; its blob id is the sibling's blobId).
func pointer(data []byte) []byte {
	return fmt.Appendf(nil, "version https://git-lfs.github.com/spec/v1\noid sha256:%s\nsize %d\n", SHA256(data), len(data))
}

func (h *Hub) log(r *http.Request) {
	line := r.Method + " " + r.URL.EscapedPath()
	if q := r.URL.RawQuery; q != "" {
		line += "?" + q
	}
	if rg := r.Header.Get("Range"); rg != "" {
		line += " Range: " + rg
	}
	h.mu.Lock()
	h.requests = append(h.requests, line)
	h.mu.Unlock()
}

func hubError(w http.ResponseWriter, status int, code, msg string) {
	if code != "" {
		w.Header().Set("X-Error-Code", code)
	}
	w.Header().Set("X-Error-Message", msg)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

// access checks the token against the repository: "" when it may be read, else the error it got.
func (h *Hub) access(w http.ResponseWriter, r *http.Request, repo *Repo, kind, id string, files bool) bool {
	token, hasToken := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if hasToken && !slices.Contains(h.Tokens, token) {
		hubError(w, http.StatusUnauthorized, "", "Invalid credentials in Authorization header")
		return false
	}
	if repo == nil || (repo.Private && !slices.Contains(repo.Readers, token)) {
		status := http.StatusUnauthorized
		if hasToken {
			status = http.StatusNotFound
		}
		hubError(w, status, "RepoNotFound", "Repository not found")
		return false
	}
	if repo.Gated && files && !slices.Contains(repo.Readers, token) {
		if !hasToken {
			hubError(w, http.StatusUnauthorized, "GatedRepo", fmt.Sprintf("Access to %s %s is restricted. You must have access to it and be authenticated to access it. Please log in.", kind, id))
		} else {
			hubError(w, http.StatusForbidden, "GatedRepo", fmt.Sprintf("Access to %s %s is restricted and you are not in the authorized list. Visit %s/%s to ask for access.", kind, id, h.URL(), id))
		}
		return false
	}
	return true
}

// commitOf resolves a revision: a branch or ref name, or a commit id.
func (repo *Repo) commitOf(rev string) (string, bool) {
	if c, ok := repo.Branches[rev]; ok {
		return c, true
	}
	if _, ok := repo.Commits[rev]; ok {
		return rev, true
	}
	return "", false
}

// serveHub routes the Hub's URLs.
func (h *Hub) serveHub(w http.ResponseWriter, r *http.Request) {
	h.log(r)
	parts := strings.Split(strings.TrimPrefix(r.URL.EscapedPath(), "/"), "/")
	unescape := func(s string) string {
		u, err := url.PathUnescape(s)
		if err != nil {
			return s
		}
		return u
	}
	kind := "model"
	if parts[0] == "api" && len(parts) >= 6 && (parts[1] == "models" || parts[1] == "datasets") {
		kind = strings.TrimSuffix(parts[1], "s")
		id := parts[2] + "/" + parts[3]
		h.mu.Lock()
		repo := h.repos[kind+":"+id]
		h.mu.Unlock()
		if r.Method != http.MethodGet {
			hubError(w, http.StatusMethodNotAllowed, "", "method not allowed")
			return
		}
		if !h.access(w, r, repo, kind, id, false) {
			return
		}
		rev := unescape(parts[5])
		commit, ok := repo.commitOf(rev)
		if !ok {
			hubError(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id: "+rev)
			return
		}
		switch parts[4] {
		case "revision":
			h.serveInfo(w, r, repo, commit)
		case "tree":
			var sub []string
			for _, p := range parts[6:] {
				sub = append(sub, unescape(p))
			}
			h.serveTree(w, r, repo, commit, rev, strings.Join(sub, "/"))
		default:
			hubError(w, http.StatusNotFound, "", "Sorry, we can't find the page you are looking for.")
		}
		return
	}
	if parts[0] == "datasets" {
		kind, parts = "dataset", parts[1:]
	}
	if len(parts) >= 5 && parts[2] == "resolve" {
		id := parts[0] + "/" + parts[1]
		h.mu.Lock()
		repo := h.repos[kind+":"+id]
		h.mu.Unlock()
		if !h.access(w, r, repo, kind, id, true) {
			return
		}
		rev := unescape(parts[3])
		commit, ok := repo.commitOf(rev)
		if !ok {
			hubError(w, http.StatusNotFound, "RevisionNotFound", "Invalid rev id: "+rev)
			return
		}
		var p []string
		for _, s := range parts[4:] {
			p = append(p, unescape(s))
		}
		h.serveResolve(w, r, repo, commit, strings.Join(p, "/"))
		return
	}
	hubError(w, http.StatusNotFound, "", "Sorry, we can't find the page you are looking for.")
}

type lfsJSON struct {
	SHA256      string `json:"sha256,omitempty"`
	OID         string `json:"oid,omitempty"`
	Size        int    `json:"size"`
	PointerSize int    `json:"pointerSize"`
}

func (h *Hub) serveInfo(w http.ResponseWriter, r *http.Request, repo *Repo, commit string) {
	blobs := r.URL.Query().Get("blobs")
	withBlobs := blobs == "true" || blobs == "True" || blobs == "1"
	files := repo.Commits[commit]
	var siblings []map[string]any
	for _, p := range slices.Sorted(maps.Keys(files)) {
		s := map[string]any{"rfilename": p}
		if withBlobs {
			data := files[p]
			s["size"] = len(data)
			s["blobId"] = GitBlobID(data)
			if IsLFS(p, data) {
				s["blobId"] = GitBlobID(pointer(data))
				s["lfs"] = lfsJSON{SHA256: SHA256(data), Size: len(data), PointerSize: len(pointer(data))}
			}
		}
		siblings = append(siblings, s)
	}
	var gated any = false
	if repo.Gated {
		gated = "manual"
	}
	info := map[string]any{"_id": GitBlobID([]byte(repo.ID))[:24], "id": repo.ID, "author": strings.Split(repo.ID, "/")[0],
		"sha": commit, "lastModified": "2026-11-27T00:00:00.000Z", "private": repo.Private, "gated": gated, "disabled": false,
		"tags": []string{}, "downloads": 0, "likes": 0, "siblings": siblings, "createdAt": "2026-11-27T00:00:00.000Z"}
	if repo.Kind == "model" {
		info["modelId"] = repo.ID
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	_ = json.NewEncoder(w).Encode(info)
}

func (h *Hub) serveTree(w http.ResponseWriter, r *http.Request, repo *Repo, commit, rev, sub string) {
	files := repo.Commits[commit]
	recursive := r.URL.Query().Get("recursive") == "true" || r.URL.Query().Get("recursive") == "True"
	var items []map[string]any
	dirs := map[string]bool{}
	for _, p := range slices.Sorted(maps.Keys(files)) {
		rel := p
		if sub != "" {
			var ok bool
			if rel, ok = strings.CutPrefix(p, sub+"/"); !ok {
				continue
			}
		}
		if i := strings.Index(rel, "/"); i >= 0 {
			// Folders on the way (each once); a non-recursive listing stops at the first.
			parts := strings.Split(rel, "/")
			for k := 1; k < len(parts); k++ {
				d := strings.Join(parts[:k], "/")
				if !dirs[d] && (recursive || k == 1) {
					dirs[d] = true
					items = append(items, map[string]any{"type": "directory", "oid": GitBlobID([]byte(d)), "size": 0, "path": joinPath(sub, d)})
				}
			}
			if !recursive {
				continue
			}
		}
		data := files[p]
		it := map[string]any{"type": "file", "oid": GitBlobID(data), "size": len(data), "path": p}
		if IsLFS(p, data) {
			it["oid"] = GitBlobID(pointer(data))
			it["lfs"] = lfsJSON{OID: SHA256(data), Size: len(data), PointerSize: len(pointer(data))}
		}
		items = append(items, it)
	}
	if sub != "" && len(items) == 0 {
		hubError(w, http.StatusNotFound, "EntryNotFound", fmt.Sprintf("%s does not exist on %q", sub, rev))
		return
	}
	start, _ := strconv.Atoi(r.URL.Query().Get("cursor"))
	end := min(start+h.PageSize, len(items))
	if start > len(items) {
		start = len(items)
	}
	if end < len(items) {
		next := *r.URL
		q := next.Query()
		q.Set("cursor", strconv.Itoa(end))
		next.RawQuery = q.Encode()
		w.Header().Set("Link", fmt.Sprintf(`<%s%s>; rel="next"`, h.URL(), next.RequestURI()))
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	page := items[start:end]
	if page == nil {
		page = []map[string]any{}
	}
	_ = json.NewEncoder(w).Encode(page)
}

func joinPath(a, b string) string {
	if a == "" {
		return b
	}
	return a + "/" + b
}

func (h *Hub) serveResolve(w http.ResponseWriter, r *http.Request, repo *Repo, commit, path string) {
	data, ok := repo.Commits[commit][path]
	if !ok {
		hubError(w, http.StatusNotFound, "EntryNotFound", "Entry not found")
		return
	}
	w.Header().Set("X-Repo-Commit", commit)
	if IsLFS(path, data) {
		sha := SHA256(data)
		w.Header().Set("X-Linked-Etag", `"`+sha+`"`)
		w.Header().Set("X-Linked-Size", strconv.Itoa(len(data)))
		w.Header().Set("ETag", `"`+GitBlobID(pointer(data))+`"`)
		w.Header().Set("Location", fmt.Sprintf("%s/repos/%s/%s/%s?X-Amz-Signature=stand-in&response-content-disposition=%s",
			h.CDN.URL, sha[:2], sha[2:4], sha, url.QueryEscape("attachment; filename*=UTF-8''"+filepath.Base(path))))
		w.WriteHeader(http.StatusFound)
		return
	}
	w.Header().Set("ETag", `"`+GitBlobID(data)+`"`)
	h.serveBytes(w, r, path, data)
}

// serveCDN serves LFS objects by sha256, with byte ranges.
func (h *Hub) serveCDN(w http.ResponseWriter, r *http.Request) {
	h.log(r)
	if r.Header.Get("Authorization") != "" {
		// S3 with a presigned URL: "Only one auth mechanism allowed".
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, "<Error><Code>InvalidArgument</Code><Message>Only one auth mechanism allowed; only the X-Amz-Algorithm query parameter, Signature query string parameter or the Authorization header should be specified</Message></Error>")
		return
	}
	sha := filepath.Base(r.URL.Path)
	h.mu.Lock()
	data, ok := h.blobs[sha]
	corrupt := h.corrupt[sha]
	h.mu.Unlock()
	if !ok || r.URL.Query().Get("X-Amz-Signature") == "" {
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprint(w, "<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>")
		return
	}
	if corrupt {
		data = bytes.Clone(data)
		data[len(data)/2] ^= 0xff
	}
	m := md5.Sum(data)
	w.Header().Set("ETag", `"`+hex.EncodeToString(m[:])+`"`)
	h.serveBytes(w, r, sha, data)
}

// serveBytes answers GET/HEAD with byte ranges, cutting the connection where a test asked for it.
func (h *Hub) serveBytes(w http.ResponseWriter, r *http.Request, key string, data []byte) {
	if r.Method == http.MethodGet {
		h.mu.Lock()
		n, cut := h.cuts[key]
		if !cut {
			n, cut = h.cuts[SHA256(data)]
			key = SHA256(data)
		}
		if cut {
			delete(h.cuts, key)
		}
		h.mu.Unlock()
		if cut {
			start := int64(0)
			if rg := r.Header.Get("Range"); rg != "" {
				fmt.Sscanf(rg, "bytes=%d-", &start)
			}
			w.Header().Set("Content-Length", strconv.FormatInt(int64(len(data))-start, 10))
			if start > 0 {
				w.Header().Set("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, len(data)-1, len(data)))
				w.WriteHeader(http.StatusPartialContent)
			}
			end := min(start+n, int64(len(data)))
			_, _ = w.Write(data[start:end])
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			}
			panic(http.ErrAbortHandler) // the connection drops mid-body
		}
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(data))
}
