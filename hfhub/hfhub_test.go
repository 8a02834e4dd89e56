package hfhub_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/memfit/memfit/hfhub"
	"github.com/memfit/memfit/hfhub/hubtest"
)

const tinyDir = "../pretrained/llama-tiny"

// client returns a client of the stand-in with a cache in a temporary folder, quick retries, and its log.
func client(t *testing.T, hub *hubtest.Hub, cache string, edit ...func(*hfhub.Env)) (*hfhub.Client, *strings.Builder) {
	t.Helper()
	env := hfhub.Env{Endpoint: hub.URL(), Cache: cache}
	for _, e := range edit {
		e(&env)
	}
	var log strings.Builder
	c := hfhub.New(env, &syncWriter{b: &log})
	c.Backoff, c.MaxBackoff = 5*time.Millisecond, 20*time.Millisecond
	return c, &log
}

type syncWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// tinyRepo serves llama-tiny as ORG/NAME, with the copies in other formats a real repository has beside it.
func tinyRepo(t *testing.T, hub *hubtest.Hub, id string) *hubtest.Repo {
	t.Helper()
	r := hub.AddDir(t, "model", id, tinyDir)
	files := r.Commits[r.Branches["main"]]
	files["pytorch_model.bin"] = []byte("a pickle memfit must not download")
	files["original/consolidated.00.pth"] = []byte("Meta's checkpoint")
	files["onnx/model.onnx"] = []byte("onnx")
	files["README.md"] = []byte("---\nlicense: apache-2.0\n---\n# tiny\n")
	files["generation_config.json"] = []byte(`{"bos_token_id": 4093, "eos_token_id": 4094}`)
	return r
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestModelDownloadsIntoTheHubCache: a model repository is downloaded into the huggingface_hub layout (refs/main,
// snapshots/COMMIT links to blobs named by sha256 or git blob id, trees/COMMIT.json, CACHEDIR.TAG) with the
// served bytes and only the files a run reads; the token goes to the Hub and never to the LFS storage; a second
// run downloads nothing; an offline run finds it with no request at all.
func TestModelDownloadsIntoTheHubCache(t *testing.T) {
	hub := hubtest.New(t)
	hub.Tokens = []string{"hf_reader"}
	repo := tinyRepo(t, hub, "memfit-test/llama-tiny")
	commit := repo.Branches["main"]
	files := repo.Commits[commit]
	cache := filepath.Join(t.TempDir(), "hub")
	c, _ := client(t, hub, cache, func(e *hfhub.Env) { e.Token, e.TokenFrom = "hf_reader", "HF_TOKEN" })
	snap, err := c.Model(context.Background(), hfhub.Repo{Kind: hfhub.Model, ID: "memfit-test/llama-tiny"})
	if err != nil {
		t.Fatal(err)
	}
	repoDir := filepath.Join(cache, "models--memfit-test--llama-tiny")
	if snap.Commit != commit || snap.Dir != filepath.Join(repoDir, "snapshots", commit) {
		t.Fatalf("snapshot %+v, commit %s", snap, commit)
	}
	want := []string{"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
	if !slices.Equal(snap.Files, want) {
		t.Errorf("files %v, want %v", snap.Files, want)
	}
	if ref := readFile(t, filepath.Join(repoDir, "refs", "main")); string(ref) != commit {
		t.Errorf("refs/main holds %q", ref)
	}
	for _, name := range want {
		p := filepath.Join(snap.Dir, name)
		link, err := os.Readlink(p)
		if err != nil {
			t.Fatalf("%s is not a link: %v", name, err)
		}
		etag := hubtest.GitBlobID(files[name])
		if hubtest.IsLFS(name, files[name]) {
			etag = hubtest.SHA256(files[name])
		}
		if link != filepath.Join("..", "..", "blobs", etag) {
			t.Errorf("%s -> %s, want ../../blobs/%s", name, link, etag)
		}
		if !bytes.Equal(readFile(t, p), files[name]) {
			t.Errorf("%s: not the served bytes", name)
		}
	}
	for _, p := range []string{"pytorch_model.bin", "original", "onnx", "README.md"} {
		if _, err := os.Lstat(filepath.Join(snap.Dir, p)); err == nil {
			t.Errorf("%s was downloaded", p)
		}
	}
	var tree struct {
		FormatVersion int `json:"format_version"`
		Files         map[string]struct {
			Size      int64  `json:"size"`
			LFSSHA256 string `json:"lfs_sha256"`
		} `json:"files"`
	}
	if err := json.Unmarshal(readFile(t, filepath.Join(repoDir, "trees", commit+".json")), &tree); err != nil || tree.FormatVersion != 1 ||
		len(tree.Files) != len(files) || tree.Files["model.safetensors"].LFSSHA256 != hubtest.SHA256(files["model.safetensors"]) {
		t.Errorf("trees/%s.json: %v %+v", commit, err, tree)
	}
	if _, err := os.Stat(filepath.Join(cache, "CACHEDIR.TAG")); err != nil {
		t.Error(err)
	}
	var gets []string
	for _, r := range hub.Requests() {
		if strings.HasPrefix(r, "GET /repos/") {
			gets = append(gets, r)
		}
		if strings.Contains(r, "pytorch_model.bin") || strings.Contains(r, "onnx") {
			t.Errorf("request for a file memfit does not read: %s", r)
		}
	}
	if len(gets) != 1 {
		t.Errorf("LFS downloads from the storage host: %v", gets)
	}

	before := len(hub.Requests())
	again, err := c.Model(context.Background(), hfhub.Repo{Kind: hfhub.Model, ID: "memfit-test/llama-tiny"})
	if err != nil || again.Dir != snap.Dir {
		t.Fatalf("second run: %v, %+v", err, again)
	}
	if reqs := hub.Requests()[before:]; len(reqs) != 1 || !strings.HasPrefix(reqs[0], "GET /api/models/memfit-test/llama-tiny/revision/main?blobs=true") {
		t.Errorf("second run's requests: %v", reqs)
	}

	hub.Hub.Close()
	before = len(hub.Requests())
	off, _ := client(t, hub, cache, func(e *hfhub.Env) { e.Offline = true })
	snapOff, err := off.Model(context.Background(), hfhub.Repo{Kind: hfhub.Model, ID: "memfit-test/llama-tiny"})
	if err != nil || snapOff.Dir != snap.Dir || !slices.Equal(snapOff.Files, want) {
		t.Fatalf("offline: %v, %+v", err, snapOff)
	}
	if n := len(hub.Requests()) - before; n != 0 {
		t.Errorf("offline run made %d requests", n)
	}
}

// TestDroppedConnectionResumes: a connection dropped in the middle of the weights is resumed within the same run
// with a Range request from where it stopped, and the file is whole and checked; a partial file left by an
// interrupted earlier run is resumed too, and one whose bytes are wrong is downloaded again from the start.
func TestDroppedConnectionResumes(t *testing.T) {
	hub := hubtest.New(t)
	repo := tinyRepo(t, hub, "memfit-test/llama-tiny")
	weights := repo.Commits[repo.Branches["main"]]["model.safetensors"]
	sha := hubtest.SHA256(weights)
	const cut = 1 << 20
	hub.CutAfter(sha, cut)
	cache := filepath.Join(t.TempDir(), "hub")
	c, log := client(t, hub, cache)
	snap, err := c.Model(context.Background(), hfhub.Repo{Kind: hfhub.Model, ID: "memfit-test/llama-tiny"})
	if err != nil {
		t.Fatalf("%v\n%s", err, log)
	}
	if !bytes.Equal(readFile(t, filepath.Join(snap.Dir, "model.safetensors")), weights) {
		t.Fatal("the resumed file differs from the served one")
	}
	var ranges []string
	for _, r := range hub.Requests() {
		if strings.HasPrefix(r, "GET /repos/") {
			ranges = append(ranges, r[strings.LastIndex(r, " ")+1:])
		}
	}
	if len(ranges) != 2 || !strings.Contains(ranges[0], "X-Amz-Signature") || ranges[1] != "bytes=1048576-" {
		t.Errorf("storage requests %v: want the whole file, then bytes=%d-", ranges, cut)
	}
	if !strings.Contains(log.String(), "resuming (try 1 of 5)") {
		t.Errorf("the log does not say it resumed:\n%s", log)
	}

	// An earlier run's partial file: resumed from its end.
	repoDir := filepath.Join(t.TempDir(), "hub2")
	c2, log2 := client(t, hub, repoDir)
	blobs := filepath.Join(repoDir, "models--memfit-test--llama-tiny", "blobs")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(blobs, sha+".incomplete"), weights[:3000], 0o644); err != nil {
		t.Fatal(err)
	}
	before := len(hub.Requests())
	if _, err := c2.Model(context.Background(), hfhub.Repo{Kind: hfhub.Model, ID: "memfit-test/llama-tiny"}); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(hub.Requests()[before:], func(r string) bool { return strings.HasSuffix(r, "Range: bytes=3000-") }) {
		t.Errorf("no resume from byte 3000: %v", hub.Requests()[before:])
	}
	if !strings.Contains(log2.String(), "resuming at 2.9 KiB") {
		t.Errorf("log: %s", log2)
	}

	// A partial file with wrong bytes: caught by the sha256 check, downloaded again whole.
	dir3 := filepath.Join(t.TempDir(), "hub3")
	c3, log3 := client(t, hub, dir3)
	blobs3 := filepath.Join(dir3, "models--memfit-test--llama-tiny", "blobs")
	if err := os.MkdirAll(blobs3, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(blobs3, sha+".incomplete"), bytes.Repeat([]byte{7}, 3000), 0o644); err != nil {
		t.Fatal(err)
	}
	snap3, err := c3.Model(context.Background(), hfhub.Repo{Kind: hfhub.Model, ID: "memfit-test/llama-tiny"})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readFile(t, filepath.Join(snap3.Dir, "model.safetensors")), weights) || !strings.Contains(log3.String(), "downloading it again from the start") {
		t.Errorf("a bad partial file was not replaced: %s", log3)
	}
}

// TestWrongSHA256: bytes whose sha256 is not the file's X-Linked-Etag are refused with one line, and nothing
// becomes visible in snapshots/ or blobs/.
func TestWrongSHA256(t *testing.T) {
	hub := hubtest.New(t)
	repo := tinyRepo(t, hub, "memfit-test/llama-tiny")
	sha := hubtest.SHA256(repo.Commits[repo.Branches["main"]]["model.safetensors"])
	hub.Corrupt(sha)
	cache := filepath.Join(t.TempDir(), "hub")
	c, _ := client(t, hub, cache)
	_, err := c.Model(context.Background(), hfhub.Repo{Kind: hfhub.Model, ID: "memfit-test/llama-tiny"})
	if !errors.Is(err, hfhub.ErrChecksum) || !strings.Contains(err.Error(), "sha256") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("error %v", err)
	}
	repoDir := filepath.Join(cache, "models--memfit-test--llama-tiny")
	if _, err := os.Lstat(filepath.Join(repoDir, "snapshots", repo.Branches["main"], "model.safetensors")); err == nil {
		t.Error("the corrupt file is in snapshots/")
	}
	if _, err := os.Stat(filepath.Join(repoDir, "blobs", sha)); err == nil {
		t.Error("the corrupt blob is in blobs/")
	}
}

// TestHubErrors: each way a repository cannot be read is one line saying what to do.
func TestHubErrors(t *testing.T) {
	hub := hubtest.New(t)
	hub.Tokens = []string{"hf_owner", "hf_other"}
	private := tinyRepo(t, hub, "memfit-test/private")
	private.Private, private.Readers = true, []string{"hf_owner"}
	gated := tinyRepo(t, hub, "memfit-test/gated")
	gated.Gated, gated.Readers = true, []string{"hf_owner"}
	hub.Add("model", "memfit-test/pickles", map[string][]byte{"config.json": []byte(`{"model_type": "llama"}`), "pytorch_model.bin": []byte("pickle")})
	tinyRepo(t, hub, "memfit-test/llama-tiny")
	cache := filepath.Join(t.TempDir(), "hub")
	token := func(tok string) func(*hfhub.Env) {
		return func(e *hfhub.Env) { e.Token, e.TokenFrom = tok, "HF_TOKEN" }
	}
	cases := []struct {
		name, id, rev string
		env           []func(*hfhub.Env)
		kind          error
		want          []string
	}{
		{"private without a token", "memfit-test/private", "", nil, hfhub.ErrNotFound, []string{"or it is private", "HF_TOKEN", "huggingface-cli login"}},
		{"private with another account's token", "memfit-test/private", "", []func(*hfhub.Env){token("hf_other")}, hfhub.ErrNotFound, []string{"that the token from HF_TOKEN can read"}},
		{"gated without a token", "memfit-test/gated", "", nil, hfhub.ErrGated, []string{"is gated: accept its terms on " + hub.URL() + "/memfit-test/gated", "then set HF_TOKEN"}},
		{"gated, not granted", "memfit-test/gated", "", []func(*hfhub.Env){token("hf_other")}, hfhub.ErrGated, []string{"has no access to it yet: accept its terms on " + hub.URL() + "/memfit-test/gated"}},
		{"missing repository", "memfit-test/nope", "", nil, hfhub.ErrNotFound, []string{"model memfit-test/nope: no such model on " + hub.URL()}},
		{"missing revision", "memfit-test/llama-tiny", "v9", nil, hfhub.ErrRevision, []string{`has no revision "v9"`}},
		{"invalid token", "memfit-test/llama-tiny", "", []func(*hfhub.Env){token("hf_forged")}, hfhub.ErrToken, []string{"refused the token from HF_TOKEN", "/settings/tokens"}},
		{"no safetensors", "memfit-test/pickles", "", nil, hfhub.ErrNoFile, []string{"has no safetensors weights (only pytorch_model.bin"}},
		{"offline, not cached", "memfit-test/llama-tiny", "", []func(*hfhub.Env){func(e *hfhub.Env) { e.Offline = true }}, hfhub.ErrOffline, []string{"HF_HUB_OFFLINE is set and model memfit-test/llama-tiny is not in the cache", "finetune download memfit-test/llama-tiny"}},
	}
	for _, tc := range cases {
		c, _ := client(t, hub, cache, tc.env...)
		_, err := c.Model(context.Background(), hfhub.Repo{Kind: hfhub.Model, ID: tc.id, Revision: tc.rev})
		if !errors.Is(err, tc.kind) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v (want %v, one line)", tc.name, err, tc.kind)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q lacks %q", tc.name, err, w)
			}
		}
	}
	// The owner's token reads both.
	for _, id := range []string{"memfit-test/private", "memfit-test/gated"} {
		c, _ := client(t, hub, cache, token("hf_owner"))
		if _, err := c.Model(context.Background(), hfhub.Repo{Kind: hfhub.Model, ID: id}); err != nil {
			t.Errorf("%s with the owner's token: %v", id, err)
		}
	}
	// The Hub unreachable: the error says whether the cache has the repository (then HF_HUB_OFFLINE=1 uses it).
	url := hub.URL()
	hub.Hub.Close()
	for id, want := range map[string]string{"memfit-test/gated": "set HF_HUB_OFFLINE=1 to use it", "memfit-test/llama-tiny": "nothing of model memfit-test/llama-tiny is in the cache"} {
		c, _ := client(t, hub, cache, token("hf_owner"))
		_, err := c.Model(context.Background(), hfhub.Repo{Kind: hfhub.Model, ID: id})
		if !errors.Is(err, hfhub.ErrUnreachable) || !strings.Contains(err.Error(), "cannot reach the Hub at "+url) || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s unreachable: %v (want %q)", id, err, want)
		}
	}
}

// TestShardedModel: a sharded checkpoint brings its index and the shards it names, not the consolidated copy
// beside them.
func TestShardedModel(t *testing.T) {
	hub := hubtest.New(t)
	files := map[string][]byte{
		"config.json":                      []byte(`{"model_type": "llama"}`),
		"model.safetensors.index.json":     []byte(`{"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors", "c": "model-00001-of-00002.safetensors"}}`),
		"model-00001-of-00002.safetensors": []byte("shard one"),
		"model-00002-of-00002.safetensors": []byte("shard two"),
		"consolidated.safetensors":         []byte("mistral's own copy"),
		"tokenizer.model":                  []byte("sentencepiece"),
	}
	hub.Add("model", "memfit-test/sharded", files)
	c, _ := client(t, hub, filepath.Join(t.TempDir(), "hub"))
	snap, err := c.Model(context.Background(), hfhub.Repo{Kind: hfhub.Model, ID: "memfit-test/sharded"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "model.safetensors.index.json", "tokenizer.model"}
	if !slices.Equal(snap.Files, want) {
		t.Errorf("files %v, want %v", snap.Files, want)
	}
	if _, err := os.Lstat(filepath.Join(snap.Dir, "consolidated.safetensors")); err == nil {
		t.Error("the consolidated copy was downloaded")
	}
}

// TestNoDiskSpace: a download the disk has no room for is refused before a byte of it is requested.
func TestNoDiskSpace(t *testing.T) {
	hub := hubtest.New(t)
	tinyRepo(t, hub, "memfit-test/llama-tiny")
	c, _ := client(t, hub, filepath.Join(t.TempDir(), "hub"))
	c.FreeSpace = func(string) (int64, error) { return 1 << 20, nil }
	_, err := c.Model(context.Background(), hfhub.Repo{Kind: hfhub.Model, ID: "memfit-test/llama-tiny"})
	if !errors.Is(err, hfhub.ErrNoSpace) || !strings.Contains(err.Error(), "1.0 MiB is free") || !strings.Contains(err.Error(), "HF_HUB_CACHE") {
		t.Fatalf("error %v", err)
	}
	for _, r := range hub.Requests() {
		if strings.Contains(r, "/resolve/") || strings.HasPrefix(r, "GET /repos/") {
			t.Errorf("a file was requested: %s", r)
		}
	}
}

// TestConcurrentDownloadsShareOne: clients downloading the same model at once download each file once (the
// blob's lock), and all get the whole model.
func TestConcurrentDownloadsShareOne(t *testing.T) {
	hub := hubtest.New(t)
	repo := tinyRepo(t, hub, "memfit-test/llama-tiny")
	weights := repo.Commits[repo.Branches["main"]]["model.safetensors"]
	cache := filepath.Join(t.TempDir(), "hub")
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			c, _ := client(t, hub, cache)
			snap, err := c.Model(context.Background(), hfhub.Repo{Kind: hfhub.Model, ID: "memfit-test/llama-tiny"})
			if err == nil {
				if data, rerr := os.ReadFile(filepath.Join(snap.Dir, "model.safetensors")); rerr != nil || !bytes.Equal(data, weights) {
					err = errors.New("weights differ")
				}
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("client %d: %v", i, err)
		}
	}
	n := 0
	for _, r := range hub.Requests() {
		if strings.HasPrefix(r, "GET /repos/") {
			n++
		}
	}
	if n != 1 {
		t.Errorf("the weights were downloaded %d times", n)
	}
}
