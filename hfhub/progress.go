package hfhub

import (
	"fmt"
	"time"

	"github.com/schollz/progressbar/v3"
)

// progress shows one file's download on the client's log: a bar with bytes and rate on a terminal, else a line
// when it starts, one every ProgressEvery, and one when it ends.
type progress struct {
	c            *Client
	name         string
	total, start int64
	done         int64
	began, last  time.Time
	bar          *progressbar.ProgressBar
}

func (c *Client) startProgress(r Repo, path string, total, have int64) *progress {
	p := &progress{c: c, name: r.ID + " " + path, total: total, start: have, done: have, began: time.Now(), last: time.Now()}
	if c.Terminal {
		p.bar = progressbar.NewOptions64(total, progressbar.OptionSetWriter(c.log), progressbar.OptionSetDescription(p.name),
			progressbar.OptionShowBytes(true), progressbar.OptionShowCount(), progressbar.OptionSetWidth(20),
			progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionShowElapsedTimeOnFinish(),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(c.log) }), progressbar.OptionSetRenderBlankState(true))
		_ = p.bar.Set64(have)
		c.barDrawn = true
		return p
	}
	from := ""
	if have > 0 {
		from = ", resuming at " + formatBytes(have)
	}
	c.note("downloading %s (%s%s)", p.name, formatBytes(total), from)
	return p
}

func (p *progress) add(n int64) {
	p.done += n
	if p.bar != nil {
		_ = p.bar.Add64(n)
		return
	}
	if time.Since(p.last) >= p.c.ProgressEvery {
		p.last = time.Now()
		p.c.note("%s: %s of %s (%.0f%%), %s", p.name, formatBytes(p.done), formatBytes(p.total), 100*float64(p.done)/float64(max(p.total, 1)), p.rate())
	}
}

// restart is a download that starts over from byte 0.
func (p *progress) restart() {
	p.done, p.start, p.began = 0, 0, time.Now()
	if p.bar != nil {
		p.bar.Reset()
	}
}

func (p *progress) rate() string {
	s := time.Since(p.began).Seconds()
	if s <= 0 {
		return "-"
	}
	return formatBytes(int64(float64(p.done-p.start)/s)) + "/s"
}

func (p *progress) stop(ok bool) {
	if p.bar != nil {
		p.c.barDrawn = false
		if ok {
			_ = p.bar.Finish()
		} else {
			fmt.Fprintln(p.c.log)
		}
		return
	}
	if ok {
		p.c.note("%s: %s in %.1fs (%s)", p.name, formatBytes(p.total), time.Since(p.began).Seconds(), p.rate())
	}
}
