//go:build unix

package cli_test

import (
	"net/http"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// TestProbeBDownloadInterrupted: Ctrl-C during a download exits 130, as an interrupted training run does (probe
// 2026-11-27-b k2: it exited 1), with the one line saying what arrived is kept.
func TestProbeBDownloadInterrupted(t *testing.T) {
	hub, _ := standIn(t)
	started := make(chan struct{})
	var once sync.Once
	cdn := hub.CDN.Config.Handler
	hub.CDN.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			w.Header().Set("Content-Length", "5054928")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			once.Do(func() { close(started) })
			<-r.Context().Done() // a download that does not end until the client goes
			return
		}
		cdn.ServeHTTP(w, r)
	})
	type result struct {
		stderr string
		code   int
	}
	done := make(chan result, 1)
	go func() {
		_, stderr, code := run(t, "download", "memfit-test/llama-tiny")
		done <- result{stderr, code}
	}()
	<-started
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	r := <-done
	lines := strings.Split(strings.TrimSpace(r.stderr), "\n")
	if last := lines[len(lines)-1]; r.code != 130 || last != "finetune: download memfit-test/llama-tiny: download interrupted (what arrived is kept: run again to resume)" {
		t.Errorf("exit %d, last line %q", r.code, last)
	}
}
