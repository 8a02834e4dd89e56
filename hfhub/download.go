package hfhub

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/memfit/memfit/internal/filelock"
)

// fileMeta is what a HEAD of a file's resolve URL says (huggingface_hub's HfFileMetadata, from
// get_hf_file_metadata): the commit (X-Repo-Commit), the blob name (X-Linked-Etag of an LFS file, else ETag),
// the size (X-Linked-Size, else Content-Length) and where the bytes are (an LFS file's Location: the CDN).
type fileMeta struct {
	commit, etag, location string
	size                   int64
}

// head asks the Hub for a file's metadata, following redirects within the Hub only.
func (c *Client) head(ctx context.Context, r Repo, commit, path string) (fileMeta, error) {
	u := c.resolveURL(r, commit, path)
	resp, err := c.do(ctx, r, path, http.MethodHead, u, http.Header{"Accept-Encoding": {"identity"}})
	if err != nil {
		return fileMeta{}, err
	}
	drain(resp)
	h := resp.Header
	m := fileMeta{commit: h.Get("X-Repo-Commit"), etag: normalizeETag(firstNonEmpty(h.Get("X-Linked-Etag"), h.Get("ETag"))),
		location: resp.Request.URL.String()}
	if loc := h.Get("Location"); loc != "" && resp.StatusCode >= 300 {
		next, err := resp.Request.URL.Parse(loc)
		if err != nil {
			return fileMeta{}, errorf(ErrUnreachable, "%s %s: the Hub redirects to %q: %v", r.describe(), path, loc, err)
		}
		m.location = next.String()
	}
	size := h.Get("X-Linked-Size")
	if size == "" && resp.StatusCode < 300 {
		size = h.Get("Content-Length")
	}
	if m.size, err = strconv.ParseInt(size, 10, 64); err != nil || m.size < 0 {
		return fileMeta{}, errorf(ErrUnreachable, "%s %s: the Hub's answer has no size (X-Linked-Size or Content-Length)", r.describe(), path)
	}
	switch {
	case m.commit == "":
		return fileMeta{}, errorf(ErrUnreachable, "%s %s: the answer has no X-Repo-Commit: HF_ENDPOINT (%s) does not look like a Hugging Face Hub (a proxy or firewall in between?)", r.describe(), path, c.env.Endpoint)
	case m.etag == "" || strings.ContainsAny(m.etag, `/\`) || m.etag == "." || m.etag == "..":
		return fileMeta{}, errorf(ErrUnreachable, "%s %s: the Hub's answer has no usable ETag (%q), so its content cannot be checked", r.describe(), path, m.etag)
	}
	return m, nil
}

// normalizeETag is huggingface_hub's _normalize_etag: a weak ETag's W/ and the quotes removed.
func normalizeETag(s string) string { return strings.Trim(strings.TrimPrefix(s, "W/"), `"`) }

var sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)

// fetch makes the file available in snapshots/COMMIT (downloading its blob unless the cache has it) and returns
// its path there.
func (c *Client) fetch(ctx context.Context, r Repo, commit string, f File) (string, error) {
	snap := filepath.Join(c.SnapshotDir(r, commit), filepath.FromSlash(f.Path))
	if st, err := os.Stat(snap); err == nil && st.Mode().IsRegular() {
		return snap, nil
	}
	if e := f.etag(); e != "" && !strings.ContainsAny(e, `/\`) && fileExists(c.blobPath(r, e)) {
		return c.link(r, commit, f.Path, c.blobPath(r, e))
	}
	m, err := c.head(ctx, r, commit, f.Path)
	if err != nil {
		return "", err
	}
	if f.LFSSHA256 != "" && m.etag != f.LFSSHA256 {
		return "", errorf(ErrChecksum, "%s %s: the file list says sha256 %s, the file's X-Linked-Etag %s: the repository changed under the download; run again", r.describe(), f.Path, f.LFSSHA256, m.etag)
	}
	blob := c.blobPath(r, m.etag)
	if !fileExists(blob) {
		if err := c.downloadLocked(ctx, r, f, m, blob); err != nil {
			return "", err
		}
	}
	return c.link(r, commit, f.Path, blob)
}

// downloadLocked downloads a blob under its lock (the lock file huggingface_hub takes too), unless another
// process did while this one waited.
func (c *Client) downloadLocked(ctx context.Context, r Repo, f File, m fileMeta, blob string) error {
	if err := os.MkdirAll(filepath.Dir(blob), 0o755); err != nil {
		return err
	}
	c.tagCache()
	lock := c.lockPath(r, m.etag)
	release, ok, err := filelock.TryLock(lock)
	if err != nil {
		return err
	}
	if !ok {
		c.note("%s %s: another process is downloading it; waiting for it (%s)", r.describe(), f.Path, lock)
		if release, err = filelock.Lock(lock); err != nil {
			return err
		}
	}
	defer release()
	if fileExists(blob) {
		return nil
	}
	return c.download(ctx, r, f.Path, m, blob)
}

// download writes the blob's bytes to blob.incomplete, resuming what an earlier try (of this process or an
// interrupted one) left there with an HTTP Range request, trying again with back-off after a dropped
// connection; checks the whole file against the ETag (sha256 for an LFS file, the git blob id for others)
// before renaming it into place; a file that fails the check after a resume is downloaded once more from the
// start.
func (c *Client) download(ctx context.Context, r Repo, path string, m fileMeta, blob string) error {
	part := blob + ".incomplete"
	f, err := os.OpenFile(part, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	have, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return err
	}
	if have > m.size {
		if err := truncate(f); err != nil {
			return err
		}
		have = 0
	}
	if err := c.checkSpace(r, path, filepath.Dir(blob), m.size-have); err != nil {
		return err
	}
	resumed := have > 0
	bar := c.startProgress(r, path, m.size, have)
	for {
		err := c.transfer(ctx, r, path, m, f, bar)
		if err != nil {
			bar.stop(false)
			return err
		}
		ok, got, err := verify(f, m.etag, m.size)
		if err != nil {
			bar.stop(false)
			return err
		}
		if ok {
			break
		}
		if err := truncate(f); err != nil {
			return err
		}
		if !resumed {
			bar.stop(false)
			return errorf(ErrChecksum, "%s %s: the downloaded bytes have %s %s, the Hub says %s: the download is corrupt (a proxy in between?); run again", r.describe(), path, hashName(m.etag), got, m.etag)
		}
		c.note("%s %s: the resumed download does not match its %s: downloading it again from the start", r.describe(), path, hashName(m.etag))
		resumed = false
		bar.restart()
	}
	bar.stop(true)
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(part, blob)
}

func truncate(f *os.File) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	_, err := f.Seek(0, io.SeekStart)
	return err
}

// transfer appends the rest of the file to f (positioned at its end) until it holds m.size bytes, resuming
// after dropped connections: each try asks for the bytes from where f ends (Range), and Retries tries in a row
// without a new byte give up.
func (c *Client) transfer(ctx context.Context, r Repo, path string, m fileMeta, f *os.File, bar *progress) error {
	fails := 0
	for {
		have, err := f.Seek(0, io.SeekCurrent)
		if err != nil {
			return err
		}
		if have == m.size {
			return nil
		}
		got, retryAfter, err := c.getRange(ctx, r, path, m, f, have, bar)
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var hubErr *Error
		if errors.As(err, &hubErr) && !errors.Is(err, ErrUnreachable) {
			return err // the Hub's answer: no retry helps
		}
		if got > 0 {
			fails = 0
		}
		if fails >= c.Retries {
			return errorf(ErrUnreachable, "%s %s: download failed after %d tries at %s of %s: %v", r.describe(), path, fails+1, formatBytes(have+got), formatBytes(m.size), err)
		}
		now, _ := f.Seek(0, io.SeekCurrent)
		c.note("%s %s: %v at %s of %s: resuming (try %d of %d)", r.describe(), path, err, formatBytes(now), formatBytes(m.size), fails+1, c.Retries)
		if err := c.wait(ctx, fails, retryAfter); err != nil {
			return err
		}
		fails++
	}
}

// getRange GETs the file from byte `from` on and appends what arrives to f; got is how many bytes arrived.
func (c *Client) getRange(ctx context.Context, r Repo, path string, m fileMeta, f *os.File, from int64, bar *progress) (got int64, retryAfter string, err error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	req, err := c.newRequest(ctx, http.MethodGet, m.location)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Accept-Encoding", "identity") // byte ranges of the file itself, not of a compressed stream
	if from > 0 {
		req.Header.Set("Range", fmt.Sprintf("bytes=%d-", from))
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, "", errors.New(shortNetError(err))
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusPartialContent:
		if start, ok := rangeStart(resp.Header.Get("Content-Range")); !ok || start != from {
			// Not the bytes asked for: start over.
			if err := truncate(f); err != nil {
				return 0, "", err
			}
			bar.restart()
			return 0, "", fmt.Errorf("the server sent bytes %q for a resume at %d", resp.Header.Get("Content-Range"), from)
		}
	case resp.StatusCode == http.StatusOK:
		if from > 0 { // the server ignored Range: the whole file comes again
			if err := truncate(f); err != nil {
				return 0, "", err
			}
			bar.restart()
		}
	case resp.StatusCode == http.StatusRequestedRangeNotSatisfiable:
		if err := truncate(f); err != nil {
			return 0, "", err
		}
		bar.restart()
		return 0, "", errors.New("the server refused the resume range")
	case retryable(resp.StatusCode):
		return 0, resp.Header.Get("Retry-After"), fmt.Errorf("the server answered %s", resp.Status)
	default:
		if sameHost(m.location, c.env.Endpoint) {
			return 0, "", c.statusError(r, path, resp)
		}
		return 0, "", errorf(ErrUnreachable, "%s %s: the file's storage (%s) answered %s: run again (its signed link may have expired)", r.describe(), path, hostOf(m.location), resp.Status)
	}
	// A stalled connection (no byte for StallTimeout) is dropped, to be resumed.
	stall := time.AfterFunc(c.StallTimeout, func() { cancel(errors.New("no data for " + c.StallTimeout.String())) })
	defer stall.Stop()
	buf := make([]byte, 256<<10)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			stall.Reset(c.StallTimeout)
			pos, _ := f.Seek(0, io.SeekCurrent)
			if pos+int64(n) > m.size {
				return got, "", errorf(ErrChecksum, "%s %s: the server sent more than the %d bytes the Hub announced", r.describe(), path, m.size)
			}
			if _, err := f.Write(buf[:n]); err != nil {
				return got, "", err
			}
			got += int64(n)
			bar.add(int64(n))
		}
		if rerr == io.EOF {
			if pos, _ := f.Seek(0, io.SeekCurrent); pos < m.size {
				return got, "", io.ErrUnexpectedEOF
			}
			return got, "", nil
		}
		if rerr != nil {
			if cause := context.Cause(ctx); cause != nil {
				return got, "", cause // a stall, or the caller's cancel
			}
			return got, "", errors.New(shortNetError(rerr))
		}
	}
}

// rangeStart parses Content-Range "bytes START-END/TOTAL".
func rangeStart(h string) (int64, bool) {
	rest, ok := strings.CutPrefix(h, "bytes ")
	if !ok {
		return 0, false
	}
	start, _, ok := strings.Cut(rest, "-")
	n, err := strconv.ParseInt(start, 10, 64)
	return n, ok && err == nil
}

func hostOf(u string) string {
	if p, err := url.Parse(u); err == nil {
		return p.Host
	}
	return u
}

// verify hashes the whole file: an ETag of 64 hex digits is an LFS file's sha256, one of 40 a git blob id
// (sha1 of "blob SIZE\0" and the content); any other ETag is not a content hash and only the size is checked.
func verify(f *os.File, etag string, size int64) (ok bool, got string, err error) {
	st, err := f.Stat()
	if err != nil {
		return false, "", err
	}
	if st.Size() != size {
		return false, fmt.Sprintf("size %d", st.Size()), nil
	}
	var h hash.Hash
	switch {
	case sha256RE.MatchString(etag):
		h = sha256.New()
	case commitRE.MatchString(etag):
		h = sha1.New()
		fmt.Fprintf(h, "blob %d\x00", size)
	default:
		return true, "", nil
	}
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, size)); err != nil {
		return false, "", err
	}
	got = hex.EncodeToString(h.Sum(nil))
	return got == etag, got, nil
}

func hashName(etag string) string {
	if sha256RE.MatchString(etag) {
		return "sha256"
	}
	return "git blob id"
}

// checkSpace refuses a download the disk has no room for, before a byte of it is written.
func (c *Client) checkSpace(r Repo, what, dir string, need int64) error {
	if c.FreeSpace == nil || need <= 0 {
		return nil
	}
	free, err := c.FreeSpace(dir)
	if err != nil || free < 0 {
		return nil // unknown: the write itself will say
	}
	if free < need {
		return errorf(ErrNoSpace, "%s %s: not enough disk space: it needs %s, %s is free in %s: free some, or set HF_HUB_CACHE to a folder on a larger disk", r.describe(), what, formatBytes(need), formatBytes(free), dir)
	}
	return nil
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// formatBytes is a size in B, KiB, MiB or GiB.
func formatBytes(n int64) string {
	const k = 1024
	switch {
	case n < k:
		return fmt.Sprintf("%d B", n)
	case n < k*k:
		return fmt.Sprintf("%.1f KiB", float64(n)/k)
	case n < k*k*k:
		return fmt.Sprintf("%.1f MiB", float64(n)/(k*k))
	}
	return fmt.Sprintf("%.2f GiB", float64(n)/(k*k*k))
}
