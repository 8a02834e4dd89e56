package memory

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// XLADumpBuffer is one value XLA's buffer assignment holds at the program's peak.
type XLADumpBuffer struct {
	// Name is the HLO value ("fusion.12", "custom-call.3{0}"), Shape its HLO shape ("f32[1024,5632]{1,0}").
	Name  string `json:"name"`
	Shape string `json:"shape,omitempty"`
	// Bytes is its size in the buffer assignment.
	Bytes int64 `json:"bytes"`
	// Op is what made it: the opcode of the instruction in the optimised HLO, with a fusion's kind or a custom
	// call's target ("fusion kLoop", "custom-call __cublas$gemm", "parameter"), or "" when the HLO text was not
	// found.
	Op string `json:"op,omitempty"`
	// Start and End are its live range in the schedule (HloLiveRange's logical times).
	Start int `json:"start"`
	End   int `json:"end"`
	// Kind is its allocation's kind in the buffer assignment ("parameter 3", "preallocated-temp",
	// "maybe-live-out", "constant", ...).
	Kind string `json:"kind,omitempty"`
}

// XLADigest is what XLADumpDigest read from an XLA dump: the program's peak and the largest buffers live there.
type XLADigest struct {
	// Module is the dumped module's file name prefix ("module_0012.train-step.sm_9.0_gpu_after_optimizations").
	Module string `json:"module"`
	// PeakTime is the schedule time of the peak and PeakBytes the bytes live then (the sum of every live value's
	// size, as HloLiveRange computes it: values sharing a buffer are counted each).
	PeakTime  int   `json:"peak_time"`
	PeakBytes int64 `json:"peak_bytes"`
	// TotalBytes is the buffer assignment's own total ("Total bytes used"), or 0 when it has none.
	TotalBytes int64 `json:"total_bytes,omitempty"`
	// Live are the largest values live at the peak, largest first (at most the number asked for).
	Live []XLADumpBuffer `json:"live"`
	// ByOp sums the bytes live at the peak by Op (and shape), largest first.
	ByOp []XLADumpGroup `json:"by_op"`
	// Values is the number of values live at the peak.
	Values int `json:"values"`
}

// XLADumpGroup is the bytes of the values live at the peak that one kind of op made, in one shape.
type XLADumpGroup struct {
	Op    string `json:"op"`
	Shape string `json:"shape"`
	Count int    `json:"count"`
	Bytes int64  `json:"bytes"`
}

var (
	dumpAllocation = regexp.MustCompile(`^allocation (\d+): size (\d+), (.*):$`)
	dumpValue      = regexp.MustCompile(`^\s*value: <\d+ (\S+) @\d+> \(size=(\d+),offset=\d+\): (\S+)`)
	dumpRange      = regexp.MustCompile(`^\s+(\S+):(\d+)-(\d+)\s*$`)
	dumpPeakAt     = regexp.MustCompile(`^\s*Live ranges at (\d+) \(peak\):`)
	dumpTotal      = regexp.MustCompile(`^Total bytes used: (\d+)`)
	// An HLO instruction line of the optimised module: "  %fusion.12 = f32[2,3]{1,0} fusion(...), kind=kLoop, ..."
	// (the % is optional in newer dumps; ROOT may lead).
	dumpInstr = regexp.MustCompile(`^\s*(?:ROOT\s+)?%?([\w.\-]+) = (\S+(?:\{[^}]*\})?|\([^=]*\)) ([\w\-]+)\(`)
	dumpKind  = regexp.MustCompile(`kind=(k\w+)`)
	dumpCall  = regexp.MustCompile(`custom_call_target="([^"]+)"`)
)

// XLADumpDigest reads an XLA dump folder (XLA_FLAGS=--xla_dump_to=DIR --xla_dump_hlo_as_text) and returns the
// largest values live at the peak of its largest module (by buffer-assignment total; match, when not empty, must
// be part of the module's file name), with the op that made each: the "what is alive at the peak" that tells a
// memory mode's failure on XLA apart (docs/memory-saving.md). It reads the module's buffer-assignment file
// (allocations and values, and the HloLiveRange section with each value's live range: in the file itself, or in
// the -live-range.txt file newer XLA versions write beside it) and, when present, the optimised HLO text for the
// ops. The peak is HloLiveRange's own "Live ranges at T (peak)" when the dump has it, else the time at which the
// live values' sizes sum highest.
func XLADumpDigest(dir, match string, top int) (*XLADigest, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*buffer-assignment.txt"))
	if err != nil {
		return nil, err
	}
	best, bestTotal := "", int64(-1)
	for _, f := range files {
		if match != "" && !strings.Contains(filepath.Base(f), match) {
			continue
		}
		st, err := os.Stat(f)
		if err != nil {
			continue
		}
		total := dumpTotalBytes(f)
		if total < 0 {
			total = st.Size()
		}
		if total > bestTotal {
			best, bestTotal = f, total
		}
	}
	if best == "" {
		return nil, fmt.Errorf("%s: no XLA buffer-assignment file (*buffer-assignment.txt%s): run with XLA_FLAGS=\"--xla_dump_to=%s --xla_dump_hlo_as_text\"",
			dir, map[bool]string{true: " matching " + match, false: ""}[match != ""], dir)
	}
	module := strings.TrimSuffix(filepath.Base(best), "-buffer-assignment.txt")
	d := &XLADigest{Module: module}
	values := map[string]*XLADumpBuffer{} // by the name BufferLiveRange uses: name{index}
	ranges := map[string][2]int{}
	peakAt := -1
	var peakNames []string
	read := func(path string) error {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		kind, section := "", ""
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "allocation "):
				if m := dumpAllocation.FindStringSubmatch(line); m != nil {
					kind = m[3]
				}
				section = ""
				continue
			case strings.Contains(line, "BufferLiveRange:"):
				section = "ranges"
				continue
			case dumpPeakAt.MatchString(line):
				m := dumpPeakAt.FindStringSubmatch(line)
				peakAt, _ = strconv.Atoi(m[1])
				section = "peak"
				continue
			case strings.HasPrefix(strings.TrimSpace(line), "InstructionSequence:"), strings.HasPrefix(line, "HloLiveRange"),
				strings.HasPrefix(strings.TrimSpace(line), "Stack trace breakdown"):
				section = ""
				continue
			}
			if m := dumpTotal.FindStringSubmatch(line); m != nil {
				d.TotalBytes, _ = strconv.ParseInt(m[1], 10, 64)
				continue
			}
			if m := dumpValue.FindStringSubmatch(line); m != nil && section == "" {
				name := m[1]
				if !strings.Contains(name, "{") {
					name += "{}"
				}
				size, _ := strconv.ParseInt(m[2], 10, 64)
				if v, ok := values[name]; !ok || size > v.Bytes {
					values[name] = &XLADumpBuffer{Name: name, Shape: m[3], Bytes: size, Kind: kind}
				}
				continue
			}
			switch section {
			case "ranges":
				if m := dumpRange.FindStringSubmatch(line); m != nil {
					s, _ := strconv.Atoi(m[2])
					e, _ := strconv.Atoi(m[3])
					ranges[m[1]] = [2]int{s, e}
				}
			case "peak":
				// "    name{}: 16 bytes (cumulative: 16 bytes)" or, in older XLA, "    name: 16 bytes"
				if name, _, ok := strings.Cut(strings.TrimSpace(line), ": "); ok && name != "" {
					if !strings.Contains(name, "{") {
						name += "{}"
					}
					peakNames = append(peakNames, name)
				}
			}
		}
		return sc.Err()
	}
	if err := read(best); err != nil {
		return nil, err
	}
	if len(ranges) == 0 {
		lr := strings.TrimSuffix(best, "-buffer-assignment.txt") + "-live-range.txt"
		if _, err := os.Stat(lr); err == nil {
			if err := read(lr); err != nil {
				return nil, err
			}
		}
	}
	if len(ranges) == 0 {
		return nil, fmt.Errorf("%s: no HloLiveRange section (BufferLiveRange) in the buffer assignment: this XLA writes it elsewhere; add --xla_dump_buffer_assignment_analysis to XLA_FLAGS", best)
	}
	ops := dumpOps(strings.TrimSuffix(best, "-buffer-assignment.txt") + ".txt")

	live := func(t int) (names []string, bytes int64) {
		for name, r := range ranges {
			if v, ok := values[name]; ok && r[0] <= t && t <= r[1] {
				names = append(names, name)
				bytes += v.Bytes
			}
		}
		return names, bytes
	}
	if peakAt < 0 {
		// The time with the most bytes live: a sweep over the ranges' starts and ends.
		type event struct {
			t     int
			delta int64
		}
		var events []event
		for name, r := range ranges {
			if v, ok := values[name]; ok {
				events = append(events, event{r[0], v.Bytes}, event{r[1] + 1, -v.Bytes})
			}
		}
		sort.Slice(events, func(i, j int) bool {
			if events[i].t != events[j].t {
				return events[i].t < events[j].t
			}
			return events[i].delta < events[j].delta
		})
		var cur, most int64
		for i, e := range events {
			cur += e.delta
			if (i == len(events)-1 || events[i+1].t != e.t) && cur > most {
				most, peakAt = cur, e.t
			}
		}
	}
	names, bytes := live(peakAt)
	if len(peakNames) > 0 {
		names, bytes = nil, 0
		for _, n := range peakNames {
			if v, ok := values[n]; ok {
				names = append(names, n)
				bytes += v.Bytes
			}
		}
	}
	d.PeakTime, d.PeakBytes, d.Values = peakAt, bytes, len(names)
	groups := map[[2]string]*XLADumpGroup{}
	var all []XLADumpBuffer
	for _, n := range names {
		v := *values[n]
		r := ranges[n]
		v.Start, v.End = r[0], r[1]
		base, _, _ := strings.Cut(n, "{")
		v.Op = ops[base]
		if v.Op == "" && strings.HasPrefix(v.Kind, "parameter") {
			v.Op = "parameter"
		}
		all = append(all, v)
		key := [2]string{v.Op, stripLayout(v.Shape)}
		if groups[key] == nil {
			groups[key] = &XLADumpGroup{Op: key[0], Shape: key[1]}
		}
		groups[key].Count++
		groups[key].Bytes += v.Bytes
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].Bytes != all[j].Bytes {
			return all[i].Bytes > all[j].Bytes
		}
		return all[i].Name < all[j].Name
	})
	if top > 0 && len(all) > top {
		all = all[:top]
	}
	d.Live = all
	for _, g := range groups {
		d.ByOp = append(d.ByOp, *g)
	}
	sort.Slice(d.ByOp, func(i, j int) bool {
		if d.ByOp[i].Bytes != d.ByOp[j].Bytes {
			return d.ByOp[i].Bytes > d.ByOp[j].Bytes
		}
		return d.ByOp[i].Op+d.ByOp[i].Shape < d.ByOp[j].Op+d.ByOp[j].Shape
	})
	if top > 0 && len(d.ByOp) > top {
		d.ByOp = d.ByOp[:top]
	}
	return d, nil
}

// dumpTotalBytes returns a buffer-assignment file's "Total bytes used", or -1.
func dumpTotalBytes(path string) int64 {
	f, err := os.Open(path)
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		if m := dumpTotal.FindStringSubmatch(sc.Text()); m != nil {
			n, _ := strconv.ParseInt(m[1], 10, 64)
			return n
		}
	}
	return -1
}

// dumpOps reads the optimised HLO text at path (if any) and returns, by instruction name, its opcode with a
// fusion's kind or a custom call's target.
func dumpOps(path string) map[string]string {
	ops := map[string]string{}
	f, err := os.Open(path)
	if err != nil {
		return ops
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	entry := false
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "ENTRY ") {
			entry = true
			continue
		}
		if !entry {
			continue // only the entry computation's instructions own buffers (fused computations' do not)
		}
		if strings.HasPrefix(line, "}") {
			entry = false
			continue
		}
		m := dumpInstr.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		op := m[3]
		if k := dumpKind.FindStringSubmatch(line); k != nil && op == "fusion" {
			op += " " + k[1]
		}
		if c := dumpCall.FindStringSubmatch(line); c != nil {
			op += " " + c[1]
		}
		ops[m[1]] = op
	}
	return ops
}

// stripLayout drops the layout of an HLO shape ("f32[2,3]{1,0}" -> "f32[2,3]").
func stripLayout(s string) string {
	if i := strings.Index(s, "{"); i > 0 {
		return s[:i]
	}
	return s
}

// WriteText prints the digest: the peak, the bytes by op and shape, and the largest values.
func (d *XLADigest) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "%s: peak %s at schedule time %d (%d values live", d.Module, FormatBytes(d.PeakBytes), d.PeakTime, d.Values)
	if d.TotalBytes > 0 {
		fmt.Fprintf(w, "; buffer assignment total %s", FormatBytes(d.TotalBytes))
	}
	fmt.Fprintln(w, ")")
	fmt.Fprintln(w, "live at the peak, by the op that made them:")
	for _, g := range d.ByOp {
		op := g.Op
		if op == "" {
			op = "?"
		}
		fmt.Fprintf(w, "  %10s  %3d x %-28s %s\n", FormatBytes(g.Bytes), g.Count, g.Shape, op)
	}
	fmt.Fprintln(w, "largest values live at the peak:")
	for _, v := range d.Live {
		fmt.Fprintf(w, "  %10s  %-28s %-32s %s [%d-%d] %s\n", FormatBytes(v.Bytes), stripLayout(v.Shape), v.Name, v.Op, v.Start, v.End, v.Kind)
	}
	return nil
}
