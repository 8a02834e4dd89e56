package hfhub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Client reads repositories from the Hub into the huggingface_hub cache (or, offline, from the cache alone).
type Client struct {
	env  Env
	http *http.Client
	log  io.Writer
	// Retries is how often a request, or a download that made no progress since the last try, is tried again
	// after a dropped connection, a timeout, or a 408/429/5xx answer (5, as huggingface_hub's http_get).
	Retries int
	// Backoff is the wait before the first retry, doubled for each next one up to MaxBackoff (1 s and 10 s).
	Backoff, MaxBackoff time.Duration
	// StallTimeout drops a download that received nothing for this long, to resume it (60 s).
	StallTimeout time.Duration
	// FreeSpace reports the bytes free for new files in a folder (the file system's, by default); tests
	// replace it.
	FreeSpace func(dir string) (int64, error)
	// Terminal draws progress bars (else one line per file and one every ProgressEvery).
	Terminal      bool
	ProgressEvery time.Duration
	barDrawn      bool // a progress bar is on the log's current line
}

// New returns a client for env that writes its progress and notes to log (nil: silent).
func New(env Env, log io.Writer) *Client {
	if log == nil {
		log = io.Discard
	}
	transport := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 60 * time.Second,
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   4,
	}
	c := &Client{env: env, log: log, Retries: 5, Backoff: time.Second, MaxBackoff: 10 * time.Second,
		StallTimeout: 60 * time.Second, FreeSpace: freeSpace, ProgressEvery: 10 * time.Second}
	c.http = &http.Client{Transport: transport, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		if len(via) >= 10 {
			return errors.New("more than 10 redirects")
		}
		// HEAD follows only redirects within the Hub (a renamed repository), as huggingface_hub's
		// _httpx_follow_relative_redirects does: a redirect to the CDN carries the file's metadata in its
		// headers (X-Linked-Etag, X-Linked-Size, Location).
		if req.Method == http.MethodHead && req.URL.Host != via[0].URL.Host {
			return http.ErrUseLastResponse
		}
		if req.URL.Host != via[0].URL.Host {
			req.Header.Del("Authorization") // the token goes to the Hub only, never to a CDN
		}
		return nil
	}}
	return c
}

// Env is the configuration the client was made with.
func (c *Client) Env() Env { return c.env }

// The kinds of Hub errors, for errors.Is; every error the package returns is one line saying what to do.
var (
	// ErrNotFound: no such repository, or a private one the token (or no token) cannot read.
	ErrNotFound = errors.New("repository not found")
	// ErrGated: a gated repository whose terms the token's account has not been granted.
	ErrGated = errors.New("gated repository")
	// ErrToken: the Hub refused the token.
	ErrToken = errors.New("token refused")
	// ErrRevision: no such branch, tag or commit.
	ErrRevision = errors.New("revision not found")
	// ErrNoFile: no such file at that revision (or no file memfit can use).
	ErrNoFile = errors.New("file not found")
	// ErrUnreachable: the Hub could not be reached or kept failing.
	ErrUnreachable = errors.New("hub unreachable")
	// ErrOffline: HF_HUB_OFFLINE is set and the cache lacks what is needed.
	ErrOffline = errors.New("offline and not cached")
	// ErrChecksum: a downloaded file's content does not match its sha256 (or git blob id).
	ErrChecksum = errors.New("checksum mismatch")
	// ErrNoSpace: the disk lacks room for the download.
	ErrNoSpace = errors.New("not enough disk space")
)

// Error is a Hub error: its Kind for errors.Is and its one-line message.
type Error struct {
	Kind error
	Msg  string
}

func (e *Error) Error() string { return e.Msg }
func (e *Error) Unwrap() error { return e.Kind }

func errorf(kind error, format string, args ...any) error {
	return &Error{Kind: kind, Msg: fmt.Sprintf(format, args...)}
}

// page is the repository's page on the Hub (where its terms are accepted).
func (c *Client) page(r Repo) string { return c.env.Endpoint + "/" + r.urlPrefix() + r.ID }

// tokenWords names the token in messages: "the token from HF_TOKEN", or "no token".
func (c *Client) tokenWords() string {
	if c.env.Token == "" {
		return "no token"
	}
	return "the token from " + c.env.TokenFrom
}

// statusError turns a Hub error answer into one line, by its X-Error-Code as huggingface_hub's
// hf_raise_for_status reads it (utils/_http.py): RevisionNotFound, EntryNotFound, GatedRepo, RepoNotFound (also
// a 401 without a code: the Hub answers 401 for missing and private repositories alike when no token is sent).
func (c *Client) statusError(r Repo, file string, resp *http.Response) error {
	code, msg := resp.Header.Get("X-Error-Code"), resp.Header.Get("X-Error-Message")
	switch {
	case code == "RevisionNotFound":
		return errorf(ErrRevision, "%s has no revision %q (a branch, tag or commit of it): see %s/tree", r.describe(), r.Rev(), c.page(r))
	case code == "EntryNotFound" || (resp.StatusCode == http.StatusNotFound && code == "" && file != ""):
		return errorf(ErrNoFile, "%s has no file %s", r.describe(), file)
	case code == "GatedRepo" && c.env.Token == "":
		return errorf(ErrGated, "%s is gated: accept its terms on %s, then set HF_TOKEN (or run `huggingface-cli login`) with a token of that account", r.describe(), c.page(r))
	case code == "GatedRepo":
		return errorf(ErrGated, "%s is gated and %s has no access to it yet: accept its terms on %s with that token's account (some repositories also wait for the authors' approval)", r.describe(), c.tokenWords(), c.page(r))
	case msg == "Invalid credentials in Authorization header" || (resp.StatusCode == http.StatusUnauthorized && code == "" && c.env.Token != ""):
		return errorf(ErrToken, "the Hub (%s) refused %s (invalid credentials): make a new token on %s/settings/tokens", c.env.Endpoint, c.tokenWords(), c.env.Endpoint)
	case code == "" && resp.StatusCode == http.StatusNotFound && file == "" && (msg == "" || strings.Contains(msg, "can't find the page")):
		// The Hub names a missing repository (X-Error-Code); a bare 404, or its "no such page", to an API URL
		// says the address is not the Hub's API (probe e4, e5: a wrong HF_ENDPOINT was reported as a missing
		// repository).
		return errorf(ErrNotFound, "%s: the server at %s answered %s to the Hub's API address (%s): HF_ENDPOINT is not a Hugging Face Hub (or mirror) address, or the repository is not there", r.describe(), c.env.Endpoint, resp.Status, firstNonEmpty(msg, "no Hub error headers"))
	case code == "RepoNotFound" || resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusNotFound:
		if c.env.Token == "" {
			return errorf(ErrNotFound, "%s: no such %s on %s, or it is private: if it is, set HF_TOKEN (or run `huggingface-cli login`) with a token that can read it", r.describe(), r.Kind, c.env.Endpoint)
		}
		return errorf(ErrNotFound, "%s: no such %s on %s that %s can read: check the id, and the token's permissions", r.describe(), r.Kind, c.env.Endpoint, c.tokenWords())
	case resp.StatusCode == http.StatusForbidden:
		return errorf(ErrToken, "%s: the Hub forbids it to %s (%s): check the token's permissions", r.describe(), c.tokenWords(), firstNonEmpty(msg, resp.Status))
	}
	what := r.describe()
	if file != "" {
		what += " " + file
	}
	return errorf(ErrUnreachable, "%s: the Hub (%s) answered %s%s", what, c.env.Endpoint, resp.Status, suffix(": ", msg))
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func suffix(sep, s string) string {
	if s == "" {
		return ""
	}
	return sep + s
}

// retryable says whether an answer is worth trying again: 408, 429 and 5xx (huggingface_hub's
// _DEFAULT_RETRY_ON_STATUS_CODES).
func retryable(status int) bool {
	return status == http.StatusRequestTimeout || status == http.StatusTooManyRequests || status >= 500
}

// fatalNetError says whether a transport error means the Hub cannot be reached at all (no retry: the address
// does not resolve, or nothing listens there).
func fatalNetError(err error) bool {
	var dns *net.DNSError
	return errors.As(err, &dns) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH)
}

// wait sleeps the backoff of retry n (or the server's Retry-After, up to MaxBackoff), or until ctx ends.
func (c *Client) wait(ctx context.Context, n int, retryAfter string) error {
	d := c.Backoff << n
	if d > c.MaxBackoff || d <= 0 {
		d = c.MaxBackoff
	}
	if s, err := strconv.Atoi(retryAfter); err == nil && s >= 0 {
		d = min(time.Duration(s)*time.Second, c.MaxBackoff)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// newRequest makes a request with memfit's user agent, and the token when it goes to the Hub itself.
func (c *Client) newRequest(ctx context.Context, method, u string) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("User-Agent", "memfit; go/"+runtime.Version())
	if c.env.Token != "" && sameHost(u, c.env.Endpoint) {
		req.Header.Set("Authorization", "Bearer "+c.env.Token)
	}
	return req, nil
}

func sameHost(a, b string) bool {
	ua, err1 := url.Parse(a)
	ub, err2 := url.Parse(b)
	return err1 == nil && err2 == nil && ua.Host == ub.Host
}

// do sends a request, trying again with back-off after a dropped connection, a timeout or a retryable answer.
// A 2xx or 3xx answer is returned (its body to be closed by the caller); another answer is a statusError.
func (c *Client) do(ctx context.Context, r Repo, file, method, u string, header http.Header) (*http.Response, error) {
	if c.env.Offline {
		return nil, errorf(ErrOffline, "%s: HF_HUB_OFFLINE is set: no request to the Hub", r.describe())
	}
	if e, err := url.Parse(c.env.Endpoint); err != nil || (e.Scheme != "http" && e.Scheme != "https") || e.Host == "" {
		// No retry helps an address that is not one (probe e1, e2: five tries, 25 s, then "unsupported protocol").
		return nil, errorf(ErrUnreachable, "cannot reach the Hub at %s: HF_ENDPOINT is not an http(s) address (give one such as https://huggingface.co or a mirror's)", c.env.Endpoint)
	}
	for n := 0; ; n++ {
		req, err := c.newRequest(ctx, method, u)
		if err != nil {
			return nil, err
		}
		for k, v := range header {
			req.Header[k] = v
		}
		resp, err := c.http.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if n < c.Retries && !fatalNetError(err) {
				c.note("%s: %v: trying again (%d of %d)", r.describe(), shortNetError(err), n+1, c.Retries)
				if err := c.wait(ctx, n, ""); err != nil {
					return nil, err
				}
				continue
			}
			return nil, errorf(ErrUnreachable, "cannot reach the Hub at %s (%s)", c.env.Endpoint, shortNetError(err))
		}
		if resp.StatusCode < 400 {
			return resp, nil
		}
		retryAfter := resp.Header.Get("Retry-After")
		err = c.statusError(r, file, resp)
		drain(resp)
		if retryable(resp.StatusCode) && n < c.Retries {
			c.note("%s: the Hub answered %s: trying again (%d of %d)", r.describe(), resp.Status, n+1, c.Retries)
			if err := c.wait(ctx, n, retryAfter); err != nil {
				return nil, err
			}
			continue
		}
		return nil, err
	}
}

// shortNetError is a transport error without Go's "Get \"URL\": " prefix.
func shortNetError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return err.Error()
}

func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
}

func (c *Client) note(format string, args ...any) {
	if c.barDrawn {
		fmt.Fprintln(c.log) // off the progress bar's line
	}
	fmt.Fprintf(c.log, format+"\n", args...)
}

// getJSON GETs an API answer into v (at most 256 MiB), returning the response's headers.
func (c *Client) getJSON(ctx context.Context, r Repo, u string, v any) (http.Header, error) {
	resp, err := c.do(ctx, r, "", http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, errorf(ErrUnreachable, "%s: the Hub (%s) answered %s to %s", r.describe(), c.env.Endpoint, resp.Status, u)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return nil, errorf(ErrUnreachable, "%s: reading the Hub's answer: %v", r.describe(), err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return nil, errorf(ErrUnreachable, "%s: the Hub's answer to %s is not the JSON expected (%v): is HF_ENDPOINT (%s) a Hugging Face Hub?", r.describe(), u, err, c.env.Endpoint)
	}
	return resp.Header, nil
}

// repoInfo is the part of /api/{models,datasets}/ID/revision/REV[?blobs=true] memfit reads (huggingface_hub's
// ModelInfo / DatasetInfo with RepoSibling and BlobLfsInfo, hf_api.py).
type repoInfo struct {
	SHA      string `json:"sha"`
	Siblings []struct {
		RFilename string `json:"rfilename"`
		Size      int64  `json:"size"`
		BlobID    string `json:"blobId"`
		LFS       *struct {
			SHA256 string `json:"sha256"`
			Size   int64  `json:"size"`
		} `json:"lfs"`
	} `json:"siblings"`
}

// info resolves a revision to its commit, with the file list when blobs is set.
func (c *Client) info(ctx context.Context, r Repo, blobs bool) (commit string, files []File, err error) {
	u := fmt.Sprintf("%s/api/%ss/%s/revision/%s", c.env.Endpoint, r.Kind, r.ID, url.PathEscape(r.Rev()))
	if blobs {
		u += "?blobs=true"
	}
	var info repoInfo
	if _, err := c.getJSON(ctx, r, u, &info); err != nil {
		return "", nil, err
	}
	if !IsCommit(info.SHA) {
		return "", nil, errorf(ErrUnreachable, "%s: the Hub's answer names no commit (sha %q): is HF_ENDPOINT (%s) a Hugging Face Hub?", r.describe(), info.SHA, c.env.Endpoint)
	}
	for _, s := range info.Siblings {
		f := File{Path: s.RFilename, Size: s.Size, BlobID: s.BlobID}
		if s.LFS != nil {
			f.LFSSHA256, f.Size = s.LFS.SHA256, s.LFS.Size
		}
		files = append(files, f)
	}
	return info.SHA, files, nil
}

// treeItem is one entry of /api/{models,datasets}/ID/tree/REV[/PATH]?recursive=true (huggingface_hub's
// RepoFile / RepoFolder: an LFS file's sha256 is lfs.oid there).
type treeItem struct {
	Type string `json:"type"`
	Path string `json:"path"`
	Size int64  `json:"size"`
	OID  string `json:"oid"`
	LFS  *struct {
		OID  string `json:"oid"`
		Size int64  `json:"size"`
	} `json:"lfs"`
}

// tree lists the files of a commit under path ("" for all), following the Link header's next pages as
// huggingface_hub's paginate does.
func (c *Client) tree(ctx context.Context, r Repo, commit, path string) ([]File, error) {
	u := fmt.Sprintf("%s/api/%ss/%s/tree/%s", c.env.Endpoint, r.Kind, r.ID, url.PathEscape(commit))
	if path != "" {
		u += "/" + url.PathEscape(path)
	}
	u += "?recursive=true"
	var files []File
	for pages := 0; u != ""; pages++ {
		if pages > 10000 {
			return nil, errorf(ErrUnreachable, "%s: the Hub's file list did not end after %d pages", r.describe(), pages)
		}
		var items []treeItem
		h, err := c.getJSON(ctx, r, u, &items)
		if err != nil {
			if errors.Is(err, ErrNoFile) || errors.Is(err, ErrNotFound) && path != "" {
				return nil, errorf(ErrNoFile, "%s has no file or folder %s", r.describe(), path)
			}
			return nil, err
		}
		for _, it := range items {
			if it.Type != "file" {
				continue
			}
			f := File{Path: it.Path, Size: it.Size, BlobID: it.OID}
			if it.LFS != nil {
				f.LFSSHA256, f.Size = it.LFS.OID, it.LFS.Size
			}
			files = append(files, f)
		}
		u = nextLink(h.Get("Link"))
	}
	return files, nil
}

// nextLink is the rel="next" URL of a Link header ("" when none).
func nextLink(h string) string {
	for _, part := range strings.Split(h, ",") {
		target, params, ok := strings.Cut(part, ";")
		if ok && strings.Contains(strings.ReplaceAll(params, " ", ""), `rel="next"`) {
			return strings.Trim(strings.TrimSpace(target), "<>")
		}
	}
	return ""
}

// resolveURL is the file's download URL: /[datasets/]ID/resolve/REV/PATH (huggingface_hub's hf_hub_url, the
// revision quoted whole and the path per part).
func (c *Client) resolveURL(r Repo, commit, path string) string {
	parts := strings.Split(path, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return fmt.Sprintf("%s/%s%s/resolve/%s/%s", c.env.Endpoint, r.urlPrefix(), r.ID, url.PathEscape(commit), strings.Join(parts, "/"))
}
