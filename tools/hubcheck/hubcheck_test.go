// Package hubcheck records why memfit's Hub client (package hfhub) speaks the Hub's HTTP API itself instead of
// downloading through github.com/gomlx/go-huggingface/hub: each test runs go-huggingface v0.4.12 against
// memfit's stand-in Hub (hfhub/hubtest, the real Hub's endpoints and headers) and asserts one behaviour a memfit
// run needs that it lacks. A test that fails means upstream changed: reconsider the decision in docs/hub.md.
//
// Run: cd tools/hubcheck && GOTOOLCHAIN=go1.27.3 go test ./... (a separate module, so that the main module
// neither depends on go-huggingface nor has a replace directive; this one replaces memfit with the checkout).
package hubcheck

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gomlx/go-huggingface/hub"

	"github.com/memfit/memfit/hfhub/hubtest"
)

const id = "memfit-test/llama-tiny"

func serve(t *testing.T) (*hubtest.Hub, map[string][]byte) {
	h := hubtest.New(t)
	r := h.AddDir(t, "model", id, "../../pretrained/llama-tiny")
	return h, r.Commits[r.Branches["main"]]
}

func repo(h *hubtest.Hub, cache string) *hub.Repo {
	r := hub.New(id).WithEndpoint(h.URL()).WithCacheDir(cache)
	r.Verbosity = 0
	return r
}

// TestLFSBlobNamedByTheCDNsETag: go-huggingface follows the resolve URL's 302 in its HEAD request and names the
// blob by the storage host's ETag (an MD5 here, as S3's), not by X-Linked-Etag (the sha256) as huggingface_hub
// does: Python does not find the file it downloaded, and nothing checks the content against the sha256.
func TestLFSBlobNamedByTheCDNsETag(t *testing.T) {
	h, files := serve(t)
	cache := t.TempDir()
	if _, err := repo(h, cache).DownloadFiles("model.safetensors"); err != nil {
		t.Fatal(err)
	}
	sha := hubtest.SHA256(files["model.safetensors"])
	if _, err := os.Stat(filepath.Join(cache, "models--memfit-test--llama-tiny", "blobs", sha)); err == nil {
		t.Fatal("go-huggingface now names the LFS blob by its sha256: reconsider docs/hub.md")
	}
}

// TestNoRefs: go-huggingface keeps a revision's commit in its own info/REV file and neither writes nor reads
// huggingface_hub's refs/REV: a model Python downloaded is not found without the network, and a branch, once
// cached, is never resolved again (a new commit on main is not seen).
func TestNoRefs(t *testing.T) {
	h, _ := serve(t)
	cache := t.TempDir()
	if _, err := repo(h, cache).DownloadFiles("config.json"); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(cache, "models--memfit-test--llama-tiny")
	if _, err := os.Stat(filepath.Join(dir, "refs", "main")); err == nil {
		t.Fatal("go-huggingface now writes refs/main: reconsider docs/hub.md")
	}
	if _, err := os.Stat(filepath.Join(dir, "info", "main")); err != nil {
		t.Fatalf("no info/main either: %v", err)
	}
}

// TestDroppedConnectionFails: a connection dropped in the middle of a file fails the download ("unexpected
// EOF"); the partial file is deleted, so the next run starts over.
func TestDroppedConnectionFails(t *testing.T) {
	h, files := serve(t)
	h.CutAfter(hubtest.SHA256(files["model.safetensors"]), 1<<20)
	cache := t.TempDir()
	_, err := repo(h, cache).DownloadFiles("model.safetensors")
	if err == nil || !strings.Contains(err.Error(), "unexpected EOF") {
		t.Fatalf("go-huggingface now survives a dropped connection (%v): reconsider docs/hub.md", err)
	}
	for _, r := range h.Requests() {
		if strings.Contains(r, "Range:") {
			t.Fatalf("go-huggingface now resumes with Range (%s): reconsider docs/hub.md", r)
		}
	}
}

// TestCorruptBytesAccepted: bytes that do not match the file's sha256 become the cached file.
func TestCorruptBytesAccepted(t *testing.T) {
	h, files := serve(t)
	h.Corrupt(hubtest.SHA256(files["model.safetensors"]))
	paths, err := repo(h, t.TempDir()).DownloadFiles("model.safetensors")
	if err != nil {
		t.Fatalf("go-huggingface now refuses corrupt bytes (%v): reconsider docs/hub.md", err)
	}
	data, _ := os.ReadFile(paths[0])
	if bytes.Equal(data, files["model.safetensors"]) {
		t.Fatal("the stand-in did not corrupt the file")
	}
}

// TestEnvironmentNotRead: HF_HOME / HF_HUB_CACHE, HF_TOKEN and HF_HUB_OFFLINE are not read (the cache folder
// follows XDG_CACHE_HOME only; the token must be passed with WithAuth; offline is not a mode).
func TestEnvironmentNotRead(t *testing.T) {
	t.Setenv("XDG_CACHE_HOME", "/xdg")
	t.Setenv("HF_HOME", "/hf-home")
	t.Setenv("HF_HUB_CACHE", "/hf-hub-cache")
	if d := hub.DefaultCacheDir(); d != "/xdg/huggingface/hub" {
		t.Fatalf("go-huggingface's cache folder is now %s: reconsider docs/hub.md", d)
	}
	h, _ := serve(t)
	h.Tokens = []string{"hf_reader"}
	h.Add("model", "memfit-test/private", map[string][]byte{"config.json": []byte("{}")}).Private = true
	t.Setenv("HF_TOKEN", "hf_reader")
	r := hub.New("memfit-test/private").WithEndpoint(h.URL()).WithCacheDir(t.TempDir())
	r.Verbosity = 0
	if _, err := r.DownloadFiles("config.json"); err == nil {
		t.Fatal("go-huggingface now reads HF_TOKEN: reconsider docs/hub.md")
	}
}

// TestProgressOnStdout: its progress line goes to standard output (fmt.Printf), where memfit prints results and
// --json output; there is one line for all files, not one per file.
func TestProgressOnStdout(t *testing.T) {
	h, _ := serve(t)
	stdout := os.Stdout
	rd, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	os.Stdout = wr
	r := hub.New(id).WithEndpoint(h.URL()).WithCacheDir(t.TempDir())
	_, derr := r.DownloadFiles("config.json")
	os.Stdout = stdout
	wr.Close()
	out, _ := io.ReadAll(rd)
	if derr != nil || !strings.Contains(string(out), "Downloaded 1/1 files") {
		t.Fatalf("go-huggingface's progress is no longer on stdout (%v, %q): reconsider docs/hub.md", derr, out)
	}
}
