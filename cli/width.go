package cli

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"golang.org/x/term"
)

// Fitting output to the terminal: tables and progress lines written to a terminal fit its width (the memory table
// is about 215 columns wide, the training progress line about 150); written anywhere else (a file, a pipe, a
// test's buffer) they keep their full one-line-per-row layout, stable for programs that read it.

// terminalColumns returns the width of the terminal w writes to, 0 when w is not a terminal.
var terminalColumns = func(w io.Writer) int {
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return 0
	}
	cols, _, err := term.GetSize(int(f.Fd()))
	if err != nil || cols <= 0 {
		return 80
	}
	return cols
}

// fitLine joins parts with spaces, leaving out the trailing parts that would make it wider than cols (0: no
// limit; the first part is kept, cut with "…" when it alone is too wide).
func fitLine(parts []string, cols int) string {
	line := ""
	for i, p := range parts {
		next := p
		if i > 0 {
			next = line + " " + p
		}
		if cols > 0 && utf8.RuneCountInString(next) > cols {
			if i == 0 {
				return cut(p, cols)
			}
			break
		}
		line = next
	}
	return line
}

// cut shortens s to cols runes, its end replaced by "…".
func cut(s string, cols int) string {
	if cols <= 0 || utf8.RuneCountInString(s) <= cols {
		return s
	}
	r := []rune(s)
	if cols == 1 {
		return "…"
	}
	return string(r[:cols-1]) + "…"
}

// wrapText breaks s at spaces into lines of at most cols runes (0: no limit), continuation lines indented two
// spaces more than s; a word wider than a line stays whole.
func wrapText(s string, cols int) string {
	if cols <= 0 || utf8.RuneCountInString(s) <= cols {
		return s
	}
	body := strings.TrimLeft(s, " ")
	indent := s[:len(s)-len(body)]
	var out []string
	line := indent
	for _, word := range strings.Fields(body) {
		switch {
		case strings.TrimSpace(line) == "":
			line += word
		case utf8.RuneCountInString(line)+1+utf8.RuneCountInString(word) > cols:
			out = append(out, line)
			line = indent + "  " + word
		default:
			line += " " + word
		}
	}
	return strings.Join(append(out, line), "\n")
}

// writeTable writes rows (the first is the header) as right-aligned columns two spaces apart (as tabwriter's
// AlignRight with padding 2 writes them; a first cell starting with spaces indents its row). With cols > 0 (a terminal that wide) a
// table wider than that is split into several, one below the other with a blank line between, each repeating
// the first column and holding as many of the next columns as fit.
func writeTable(w io.Writer, rows [][]string, cols int) error {
	if len(rows) == 0 {
		return nil
	}
	n := len(rows[0])
	width := make([]int, n)
	for _, r := range rows {
		for j, c := range r {
			width[j] = max(width[j], utf8.RuneCountInString(c)+2)
		}
	}
	var groups [][]int
	group, used := []int{0}, width[0]
	for j := 1; j < n; j++ {
		if cols > 0 && len(group) > 1 && used+width[j] > cols {
			groups = append(groups, group)
			group, used = []int{0}, width[0]
		}
		group, used = append(group, j), used+width[j]
	}
	groups = append(groups, group)
	for g, idx := range groups {
		if g > 0 {
			if _, err := fmt.Fprintln(w); err != nil {
				return err
			}
		}
		var buf bytes.Buffer
		tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', tabwriter.AlignRight)
		for _, r := range rows {
			for _, j := range idx {
				fmt.Fprintf(tw, "%s\t", r[j])
			}
			fmt.Fprintln(tw)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if _, err := w.Write(buf.Bytes()); err != nil {
			return err
		}
	}
	return nil
}

// barLayout returns, for a progress bar of total steps on a terminal cols wide, the bar's width and the most runes
// its description may take so that the whole line fits: the bar takes a fifth of the line (10 to 30), the rest
// is its percentage, count ("(1000/2000)"), rate when shown (", 123 it/s") and times ("[1m2s:3m4s]").
func barLayout(cols, total int, rate bool) (bar, desc int) {
	digits := len(fmt.Sprint(total))
	overhead := 7 + 2 + (2*digits + 3) + 22 + 1
	if rate {
		overhead += 20
	}
	bar = min(30, max(10, cols/5))
	desc = cols - bar - overhead
	if desc < 10 {
		bar = max(3, bar+desc-10)
		desc = cols - bar - overhead
	}
	return bar, max(desc, 0)
}
