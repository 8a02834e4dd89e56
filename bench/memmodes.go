package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/memfit/memfit/internal/readfile"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/plan"
)

// Sides of a memory-mode row.
const (
	SideMemfit  = "memfit"
	SidePyTorch = "pytorch+peft"
)

// MemoryModeRow is one row of bench/gpu/memory_modes.sh's memory-modes.json: one model x method x memory mode on
// the GPU, with the figures issue 35 asks for. A figure that was not obtained (a compile-only row has no device
// peak or step time) is null.
type MemoryModeRow struct {
	// Model is the preset name (vit-b16, llama-1b, llama-7b); Method lora-all, lora-qv (ViT), lora (llama-1b,
	// LoRA on every linear layer), qlora (llama-7b), or for PyTorch's stand-in of QLoRA lora-bf16-for-qlora;
	// Mode the memory mode (plain, approx-act, approx-act+mesa, grad-ckpt, approx-act+ms-norm, ...).
	Model  string `json:"model"`
	Method string `json:"method"`
	Mode   string `json:"mode"`
	// DevicePeakBytes is the device's measured peak bytes in use over the process (memfit: PJRT's device memory
	// statistics, preallocation off; PyTorch: torch.cuda.max_memory_allocated).
	DevicePeakBytes *int64 `json:"device_peak_bytes"`
	// CompiledPeakBytes is XLA's compiled peak: of the device-resident training step's program when real steps
	// ran (bench step), else of the gradient step's program plus the optimizer state held beside it (finetune
	// memory, compile only); CompiledSource says which.
	CompiledPeakBytes *int64 `json:"compiled_peak_bytes"`
	// PlannedBytes is the pure-Go planner's total (step peak + optimizer state) for the same step: what a plan
	// made on another machine (memory --plan --for-backend xla:cuda) counts.
	PlannedBytes *int64 `json:"planned_bytes"`
	// StepSeconds is the median timed step.
	StepSeconds *float64 `json:"step_seconds"`

	Side string `json:"side"`
	// Ties says whether memfit's ordering ties were on (MEMFIT_XLA_TIES); Layers is the number of transformer
	// blocks of a cut model (the compile-only before/after rows), 0 for the whole model.
	Ties   *bool `json:"ties,omitempty"`
	Layers int   `json:"layers,omitempty"`
	// XLAPlannedBytes is the planner's total on XLA itself (compiled gradient step + optimizer state: what
	// memory --plan counts when it runs on the GPU); SavedActivationBytes the exact saved activations.
	XLAPlannedBytes      *int64 `json:"xla_planned_bytes,omitempty"`
	SavedActivationBytes *int64 `json:"saved_activation_bytes,omitempty"`
	CompiledSource       string `json:"compiled_source,omitempty"`
	// Files are the result files the row was read from (relative to the folder).
	Files []string `json:"files"`
	Note  string   `json:"note,omitempty"`
}

// MemoryModeCheck is one of issue 35's targets evaluated on the rows: Status PASS, FAIL or SKIP (a figure is
// missing).
type MemoryModeCheck struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	Detail string `json:"detail"`
}

// MemoryModes is what ReadMemoryModes found in a memory_modes.sh output folder.
type MemoryModes struct {
	Rows   []MemoryModeRow   `json:"rows"`
	Checks []MemoryModeCheck `json:"checks"`
}

// memoryModeFile is one result file's name, split: KIND__MODEL__METHOD__REST.json with "__" between fields
// (model, method and mode names hold dashes and pluses, never two underscores).
type memoryModeFile struct {
	kind, model, method string
	rest                []string
	name                string
}

func parseMemoryModeFile(name string) (memoryModeFile, bool) {
	base, ok := strings.CutSuffix(name, ".json")
	if !ok {
		return memoryModeFile{}, false
	}
	parts := strings.Split(base, "__")
	if len(parts) < 3 {
		return memoryModeFile{}, false
	}
	return memoryModeFile{kind: parts[0], model: parts[1], method: parts[2], rest: parts[3:], name: name}, true
}

// ReadMemoryModes reads the result files bench/gpu/memory_modes.sh writes into dir and returns the rows of
// memory-modes.json and the targets checked on them:
//
//   - compile__MODEL__METHOD__ties{0,1}[__L{n}].json: finetune memory --json on XLA with --beside go (one
//     variant per mode): compiled peaks, the XLA and pure-Go planners' totals; L{n}: a model cut to n blocks;
//   - step__MODEL__METHOD__MODE.json: finetune bench step (ties on): device peak, compiled peak of the
//     device-resident step, median step time;
//   - pytorch__MODEL__METHOD__MODE.json: bench/pytorch/peft_compare.py: PyTorch + PEFT's peak and step time.
//
// Full-model memfit rows (ties on) merge a model x method x mode's compile and step files.
func ReadMemoryModes(dir string) (*MemoryModes, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	type key struct {
		side, model, method, mode string
		ties                      bool
		layers                    int
	}
	rows := map[key]*MemoryModeRow{}
	var order []key
	row := func(k key) *MemoryModeRow {
		if r, ok := rows[k]; ok {
			return r
		}
		ties := k.ties
		r := &MemoryModeRow{Model: k.model, Method: k.method, Mode: k.mode, Side: k.side, Layers: k.layers}
		if k.side == SideMemfit {
			r.Ties = &ties
		}
		rows[k] = r
		order = append(order, k)
		return r
	}
	found := 0
	for _, e := range entries {
		f, ok := parseMemoryModeFile(e.Name())
		if !ok || e.IsDir() {
			continue
		}
		path := filepath.Join(dir, e.Name())
		switch f.kind {
		case "compile":
			ties, layers, err := compileFileSuffix(f)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", e.Name(), err)
			}
			var rep plan.Report
			if err := readJSONFile(path, &rep); err != nil {
				return nil, err
			}
			if rep.Ties != ties {
				return nil, fmt.Errorf("%s: the report says ordering ties %v, its name says %v", e.Name(), rep.Ties, ties)
			}
			for _, v := range rep.Variants {
				r := row(key{SideMemfit, f.model, f.method, v.Name, ties, layers})
				r.Files = append(r.Files, e.Name())
				r.XLAPlannedBytes = ptr(v.TotalBytes)
				r.SavedActivationBytes = ptr(v.SavedActivationBytes)
				if v.BesideTotalBytes > 0 {
					r.PlannedBytes = ptr(v.BesideTotalBytes)
				}
				if _, unavailable := memory.Method(v.PeakMethod).Unavailable(); !unavailable && r.CompiledSource == "" {
					r.CompiledPeakBytes = ptr(v.PeakBytes + v.OptimizerBytes)
					r.CompiledSource = "gradient step's program (finetune memory) + optimizer state"
				}
				if !strings.HasPrefix(rep.Backend, "xla") {
					r.Note = joinNote(r.Note, "planned on "+rep.Backend+", not XLA")
				}
			}
			found++
		case "step":
			if len(f.rest) != 1 {
				return nil, fmt.Errorf("%s: want step__MODEL__METHOD__MODE.json", e.Name())
			}
			var s StepResult
			if err := readJSONFile(path, &s); err != nil {
				return nil, err
			}
			r := row(key{SideMemfit, f.model, f.method, f.rest[0], true, 0})
			r.Files = append(r.Files, e.Name())
			if s.DevicePeakBytes > 0 {
				r.DevicePeakBytes = ptr(s.DevicePeakBytes)
			}
			if _, unavailable := memory.Method(s.PeakMethod).Unavailable(); !unavailable && s.PeakBytes > 0 {
				r.CompiledPeakBytes = ptr(s.PeakBytes)
				r.CompiledSource = "device-resident training step's program (bench step)"
			}
			if s.StepSeconds > 0 {
				r.StepSeconds = ptrf(s.StepSeconds)
			}
			if r.SavedActivationBytes == nil && s.SavedActivationBytes > 0 {
				r.SavedActivationBytes = ptr(s.SavedActivationBytes)
			}
			found++
		case "pytorch":
			if len(f.rest) != 1 {
				return nil, fmt.Errorf("%s: want pytorch__MODEL__METHOD__MODE.json", e.Name())
			}
			var p struct {
				PeakBytes   int64   `json:"peak_bytes"`
				PeakMethod  string  `json:"peak_method"`
				StepSeconds float64 `json:"step_seconds"`
				Compute     string  `json:"compute"`
				Device      string  `json:"device"`
			}
			if err := readJSONFile(path, &p); err != nil {
				return nil, err
			}
			r := row(key{SidePyTorch, f.model, f.method, f.rest[0], false, 0})
			r.Files = append(r.Files, e.Name())
			if p.PeakBytes > 0 {
				r.DevicePeakBytes = ptr(p.PeakBytes)
			}
			if p.StepSeconds > 0 {
				r.StepSeconds = ptrf(p.StepSeconds)
			}
			r.Note = joinNote(r.Note, strings.TrimSpace(p.PeakMethod+", "+p.Compute))
			if strings.Contains(f.method, "for-qlora") {
				r.Note = joinNote(r.Note, "PyTorch LoRA over bfloat16 weights stands in for QLoRA (no bitsandbytes on the GPU machine)")
			}
			found++
		}
	}
	if found == 0 {
		return nil, fmt.Errorf("%s: no compile__*.json, step__*.json or pytorch__*.json result (bench/gpu/memory_modes.sh writes them)", dir)
	}
	sort.SliceStable(order, func(i, j int) bool {
		a, b := order[i], order[j]
		if a.model != b.model {
			return a.model < b.model
		}
		if a.method != b.method {
			return a.method < b.method
		}
		if a.layers != b.layers {
			return a.layers < b.layers
		}
		if a.side != b.side {
			return a.side == SideMemfit
		}
		if a.ties != b.ties {
			return b.ties
		}
		return modeRank(a.mode) < modeRank(b.mode) || (modeRank(a.mode) == modeRank(b.mode) && a.mode < b.mode)
	})
	out := &MemoryModes{}
	for _, k := range order {
		out.Rows = append(out.Rows, *rows[k])
	}
	out.Checks = memoryModeChecks(out.Rows)
	return out, nil
}

// compileFileSuffix reads ties{0,1} and an optional L{n} from a compile file's name.
func compileFileSuffix(f memoryModeFile) (ties bool, layers int, err error) {
	if len(f.rest) < 1 || len(f.rest) > 2 || (f.rest[0] != "ties0" && f.rest[0] != "ties1") {
		return false, 0, fmt.Errorf("want compile__MODEL__METHOD__ties{0,1}[__L{n}].json")
	}
	ties = f.rest[0] == "ties1"
	if len(f.rest) == 2 {
		n, err := strconv.Atoi(strings.TrimPrefix(f.rest[1], "L"))
		if err != nil || !strings.HasPrefix(f.rest[1], "L") || n <= 0 {
			return false, 0, fmt.Errorf("the block count %q is not L{n}", f.rest[1])
		}
		layers = n
	}
	return ties, layers, nil
}

// modeRank orders the modes plain first, as the issue lists them.
func modeRank(mode string) int {
	for i, m := range []string{"plain", "approx-act", "ms-norm", "approx-act+ms-norm", "approx-act+mesa", "grad-ckpt"} {
		if m == mode {
			return i
		}
	}
	return 100
}

func joinNote(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}

func ptr(v int64) *int64      { return &v }
func ptrf(v float64) *float64 { return &v }
func readJSONFile(path string, v any) error {
	b, err := readfile.Read(path, 64<<20) // a JSON result of one run: kilobytes

	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// peakOf returns the row's peak for comparisons: the device's when measured, else XLA's compiled one, with which.
func (r MemoryModeRow) peakOf(device bool) (int64, bool) {
	if device {
		if r.DevicePeakBytes == nil {
			return 0, false
		}
		return *r.DevicePeakBytes, true
	}
	if r.CompiledPeakBytes == nil {
		return 0, false
	}
	return *r.CompiledPeakBytes, true
}

// memoryModeChecks evaluates issue 35's targets on the full-model memfit rows with ties on: every mode's peak
// at or below plain's; approx-act+ms-norm at or below 0.75x plain on ViT-B/16 LoRA all-linear and q,v and on
// LLaMA-7B QLoRA; on llama-1b grad-ckpt at or below 0.6x plain and approx-act+mesa below approx-act; throughput
// of approx-act+ms-norm at least 0.97x plain's; the planned total within 10% of the measured peak. Peaks are
// compared device to device where both rows have one, else compiled to compiled (said in the detail).
func memoryModeChecks(rows []MemoryModeRow) []MemoryModeCheck {
	type caseKey struct{ model, method string }
	cases := map[caseKey]map[string]MemoryModeRow{}
	var order []caseKey
	for _, r := range rows {
		if r.Side != SideMemfit || r.Ties == nil || !*r.Ties || r.Layers != 0 {
			continue
		}
		k := caseKey{r.Model, r.Method}
		if cases[k] == nil {
			cases[k] = map[string]MemoryModeRow{}
			order = append(order, k)
		}
		cases[k][r.Mode] = r
	}
	var checks []MemoryModeCheck
	add := func(name, status, format string, args ...any) {
		checks = append(checks, MemoryModeCheck{Name: name, Status: status, Detail: fmt.Sprintf(format, args...)})
	}
	// ratio compares a's peak with b's: device to device when both have one, else compiled.
	ratio := func(a, b MemoryModeRow) (float64, string, bool) {
		for _, device := range []bool{true, false} {
			pa, oka := a.peakOf(device)
			pb, okb := b.peakOf(device)
			if oka && okb && pb > 0 {
				what := "compiled"
				if device {
					what = "device"
				}
				return float64(pa) / float64(pb), what, true
			}
		}
		return 0, "", false
	}
	for _, k := range order {
		modes := cases[k]
		name := k.model + " " + k.method
		plain, ok := modes["plain"]
		var names []string
		for m := range modes {
			names = append(names, m)
		}
		sort.Slice(names, func(i, j int) bool { return modeRank(names[i]) < modeRank(names[j]) })
		for _, m := range names {
			r := modes[m]
			if m != "plain" {
				if !ok {
					add(name+" "+m+" <= plain", "SKIP", "no plain row")
				} else if x, what, ok := ratio(r, plain); !ok {
					add(name+" "+m+" <= plain", "SKIP", "no peak figure for both")
				} else {
					add(name+" "+m+" <= plain", passIf(x <= 1), "%s peak %.3fx plain's", what, x)
				}
			}
			// Planned within 10% of the measured (device) peak, else of the compiled one.
			if r.PlannedBytes != nil {
				for _, device := range []bool{true, false} {
					if p, ok := r.peakOf(device); ok && p > 0 {
						what := map[bool]string{true: "device", false: "compiled"}[device]
						x := float64(*r.PlannedBytes) / float64(p)
						add(name+" "+m+" planned within 10%", passIf(x >= 0.9 && x <= 1.1), "pure-Go planner %s, %s peak %s: %.3fx",
							memory.FormatBytes(*r.PlannedBytes), what, memory.FormatBytes(p), x)
						break
					}
				}
			}
		}
		target := func(mode string, limit float64) {
			r, have := modes[mode]
			label := fmt.Sprintf("%s %s <= %.2fx plain", name, mode, limit)
			if !have || !ok {
				add(label, "SKIP", "no %s or plain row", mode)
				return
			}
			if x, what, ok := ratio(r, plain); ok {
				add(label, passIf(x <= limit), "%s peak %.3fx plain's", what, x)
			} else {
				add(label, "SKIP", "no peak figure for both")
			}
		}
		switch {
		case k.model == "vit-b16" || k.method == "qlora":
			target("approx-act+ms-norm", 0.75)
		case k.model == "llama-1b":
			target("grad-ckpt", 0.6)
			label := name + " approx-act+mesa < approx-act"
			mesa, m1 := modes["approx-act+mesa"]
			approx, m2 := modes["approx-act"]
			if !m1 || !m2 {
				add(label, "SKIP", "no approx-act+mesa or approx-act row")
			} else if x, what, ok := ratio(mesa, approx); ok {
				add(label, passIf(x < 1), "%s peak %.3fx approx-act's", what, x)
			} else {
				add(label, "SKIP", "no peak figure for both")
			}
		}
		if r, have := modes["approx-act+ms-norm"]; have && ok {
			label := name + " approx-act+ms-norm throughput >= 0.97x plain"
			if r.StepSeconds == nil || plain.StepSeconds == nil {
				add(label, "SKIP", "no step times (compile only)")
			} else {
				x := *plain.StepSeconds / *r.StepSeconds
				add(label, passIf(x >= 0.97), "%.3fx plain's throughput (steps %.2f ms vs %.2f ms)", x, 1000**r.StepSeconds, 1000**plain.StepSeconds)
			}
		}
	}
	return checks
}

func passIf(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

// Missing lists the memfit rows (full model, ties on) that miss a peak target (a FAIL among the "<= plain",
// "<= 0.75x/0.6x plain" and "approx-act+mesa < approx-act" checks) as "MODEL METHOD MODE" lines: the modes
// memory_modes.sh dumps and digests.
func (m *MemoryModes) Missing() []string {
	seen := map[string]bool{}
	var out []string
	for _, c := range m.Checks {
		if c.Status != "FAIL" || strings.Contains(c.Name, "planned") || strings.Contains(c.Name, "throughput") {
			continue
		}
		f := strings.Fields(c.Name) // MODEL METHOD MODE ...
		if len(f) < 3 || seen[strings.Join(f[:3], " ")] {
			continue
		}
		seen[strings.Join(f[:3], " ")] = true
		out = append(out, strings.Join(f[:3], " "))
	}
	return out
}

// WriteMarkdown writes the rows (full models, then the cut models' before/after rows with the ties' ratio) and
// the checks as markdown tables.
func (m *MemoryModes) WriteMarkdown(w io.Writer) error {
	cell := func(p *int64) string {
		if p == nil {
			return "-"
		}
		return memory.FormatBytes(*p)
	}
	fmt.Fprintln(w, "| model | method | mode | side | device peak | compiled peak | planned (pure-Go) | XLA planner | step |")
	fmt.Fprintln(w, "|---|---|---|---|---:|---:|---:|---:|---:|")
	for _, r := range m.Rows {
		if r.Layers != 0 {
			continue
		}
		side := r.Side
		if r.Ties != nil && !*r.Ties {
			side += " (ties off)"
		}
		step := "-"
		if r.StepSeconds != nil {
			step = fmt.Sprintf("%.2f ms", 1000**r.StepSeconds)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.Model, r.Method, r.Mode, side, cell(r.DevicePeakBytes),
			cell(r.CompiledPeakBytes), cell(r.PlannedBytes), cell(r.XLAPlannedBytes), step)
	}
	// The compile-only before/after rows of cut models: the compiled peak with ties off and on.
	type abKey struct {
		model, method, mode string
		layers              int
	}
	ab := map[abKey][2]*int64{}
	var abOrder []abKey
	for _, r := range m.Rows {
		if r.Layers == 0 || r.Ties == nil {
			continue
		}
		k := abKey{r.Model, r.Method, r.Mode, r.Layers}
		v, seen := ab[k]
		if !seen {
			abOrder = append(abOrder, k)
		}
		if *r.Ties {
			v[1] = r.CompiledPeakBytes
		} else {
			v[0] = r.CompiledPeakBytes
		}
		ab[k] = v
	}
	if len(abOrder) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Before/after the ordering ties (MEMFIT_XLA_TIES=0 / 1), compiled peaks of models cut to a few blocks:")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| model | method | blocks | mode | ties off | ties on | on / off |")
		fmt.Fprintln(w, "|---|---|---:|---|---:|---:|---:|")
		for _, k := range abOrder {
			v := ab[k]
			x := "-"
			if v[0] != nil && v[1] != nil && *v[0] > 0 {
				x = fmt.Sprintf("%.3f", float64(*v[1])/float64(*v[0]))
			}
			fmt.Fprintf(w, "| %s | %s | %d | %s | %s | %s | %s |\n", k.model, k.method, k.layers, k.mode, cell(v[0]), cell(v[1]), x)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| check | result | figure |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, c := range m.Checks {
		fmt.Fprintf(w, "| %s | %s | %s |\n", c.Name, c.Status, c.Detail)
	}
	return nil
}
