package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/memfit/memfit/internal/readfile"
	"github.com/memfit/memfit/memory"
	"github.com/memfit/memfit/safetensors"
)

// CPUSpec is what one process of the CPU benchmark runs, written to a JSON file that both sides read: the case,
// the training settings, the batch file and the adapter-initialisation file.
type CPUSpec struct {
	Case     CPUCase     `json:"case"`
	Settings CPUSettings `json:"settings"`
	// BatchFile is the safetensors batch both sides train on (WriteCPUBatch).
	BatchFile string `json:"batch_file"`
	// InitFile is where memfit's first variant writes its initial adapter tensors and where the reference reads
	// them (LoRA methods; empty for full fine-tuning).
	InitFile string `json:"init_file,omitempty"`
}

// ReadCPUSpec reads a spec file.
func ReadCPUSpec(path string) (CPUSpec, error) {
	var s CPUSpec
	b, err := readfile.Read(path, readfile.Config)
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// CPUCompareOptions configure RunCPUCompare.
type CPUCompareOptions struct {
	Cases []CPUCase
	// Variants are memfit's variants, the first ("plain") the baseline of the x-plain ratios.
	Variants []string
	Settings CPUSettings
	// LossTol is the largest relative difference between the two sides' first-step losses.
	LossTol float64
	// WorkDir receives the specs, batches and adapter-initialisation files; OutDir the processes' JSON results
	// and logs (OutDir/processes) and is where the caller writes the table.
	WorkDir, OutDir string
	// Memfit is the command (program and leading arguments) that runs `finetune bench cpu step`, Python the
	// reference's (interpreter and script); each process gets its flags appended.
	Memfit, Python []string
	// MemfitEnv is the environment of memfit's processes (nil: this process's).
	MemfitEnv []string
	// Profile has each memfit process write a CPU profile of its timed steps to OutDir/processes/NAME.pprof.
	Profile bool
	// QLoRACases are the keys of LoRA cases that also get memfit's QLoRA rows: each variant again with
	// QLoRAPrefix, compared with memfit's LoRA row (QLoRA's step beside LoRA's).
	QLoRACases []string
	// Rounds runs every process of a case this many times, the sides taking turns (all of round 1, then all of
	// round 2, ...), and reports each row's median over the rounds' medians: on a shared machine a single
	// process's median moves by up to a fifth with the host's load, and the turns spread that over every row.
	// 0 means 1.
	Rounds int
	// MemfitInterleave, when set, is the command (program and leading arguments) that runs `finetune bench cpu
	// interleave`: after its rounds each case's memfit variants (QLoRA rows included)
	// also train in one process a step of each in turn, and the goals judge the variants' step ratio by that run.
	MemfitInterleave []string
	// Log receives progress lines (may be nil).
	Log io.Writer
}

// CPUMachine describes the machine a run was made on.
type CPUMachine struct {
	CPU      string `json:"cpu"`
	Cores    int    `json:"cores"`
	MemBytes int64  `json:"mem_bytes,omitempty"`
	OS       string `json:"os"`
}

// CPUMemfitResult is one memfit variant of a case with its ratios.
type CPUMemfitResult struct {
	// Variant is the row's variant (a QLoRA row's carries QLoRAPrefix).
	Variant string         `json:"variant"`
	Result  *CPUSideResult `json:"result"`
	// StepVsPyTorch is memfit's median step time over PyTorch's; StepVsPlain over memfit plain's.
	StepVsPyTorch float64 `json:"step_x_pytorch,omitempty"`
	StepVsPlain   float64 `json:"step_x_plain,omitempty"`
	// FirstLossRelDiff is |first loss - PyTorch's| / |PyTorch's|.
	FirstLossRelDiff float64 `json:"first_loss_rel_diff"`
	// UpdateDelta and PyTorchUpdateDelta are the loss change over the first update (second step's loss minus
	// the first's), compared for the baseline variant only (the reference starts from the same adapters).
	UpdateDelta        float64 `json:"update_delta,omitempty"`
	PyTorchUpdateDelta float64 `json:"pytorch_update_delta,omitempty"`
}

// CPUCaseResult is one case: the reference and memfit's variants.
type CPUCaseResult struct {
	Case    CPUCase           `json:"case"`
	PyTorch *CPUSideResult    `json:"pytorch"`
	Memfit  []CPUMemfitResult `json:"memfit"`
	// Interleaved is memfit's variants trained in one process in turns (CPUCompareOptions.MemfitInterleave).
	Interleaved *CPUInterleaved `json:"interleaved,omitempty"`
}

// CPURun is the whole comparison, as `finetune bench cpu` writes it to JSON.
type CPURun struct {
	Date     string            `json:"date"`
	Machine  CPUMachine        `json:"machine"`
	Memfit   map[string]string `json:"memfit_versions"`
	PyTorch  map[string]string `json:"pytorch_versions"`
	Command  string            `json:"command"`
	Env      map[string]string `json:"memfit_env"`
	Settings CPUSettings       `json:"settings"`
	LossTol  float64           `json:"loss_tolerance"`
	Variants []string          `json:"variants"`
	Rounds   int               `json:"rounds,omitempty"`
	Cases    []CPUCaseResult   `json:"cases"`
	// Problems lists failed processes and first-step losses that disagree; the command fails when it is not
	// empty.
	Problems []string `json:"problems,omitempty"`
	// Seconds is the whole run's wall time.
	Seconds float64 `json:"seconds"`
}

// ApproxGoal is the largest approx-act+ms-norm / memfit-plain step-time ratio the issue accepts.
const ApproxGoal = 1.03

// MachineInfo describes this machine: CPU model (/proc/cpuinfo), logical cores, memory (/proc/meminfo), OS.
func MachineInfo() CPUMachine {
	m := CPUMachine{CPU: "?", Cores: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	if b, err := readfile.Read("/proc/cpuinfo", readfile.Config); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	m.MemBytes, _ = memory.PhysicalBytes()
	if b, err := readfile.Read("/proc/sys/kernel/osrelease", readfile.Small); err == nil {
		m.OS += ", kernel " + strings.TrimSpace(string(b))
	}
	return m
}

// RunCPUCompare runs every case: the batch is written once, then memfit in each variant and the reference,
// each in its own process, one after the other. Each process writes its JSON result; the driver adds the
// process's maximum resident set size (wait4's rusage) and wall time. A failed process is recorded in
// Problems and the run goes on; so is a first-step loss that disagrees beyond LossTol.
func RunCPUCompare(o CPUCompareOptions) (CPURun, error) {
	start := time.Now()
	run := CPURun{Date: start.UTC().Format("2006-01-02 15:04 UTC"), Machine: MachineInfo(), Settings: o.Settings,
		LossTol: o.LossTol, Variants: o.Variants, Env: map[string]string{}}
	if o.Rounds > 1 {
		run.Rounds = o.Rounds
	}
	if err := o.Settings.Validate(); err != nil {
		return run, err
	}
	if len(o.Variants) == 0 || len(o.Memfit) == 0 || len(o.Python) == 0 {
		return run, fmt.Errorf("no variants, memfit command or reference command")
	}
	env := o.MemfitEnv
	if env == nil {
		env = os.Environ()
	}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "GODEBUG", "GOGC", "GOMEMLIMIT", "GOMAXPROCS", "GOMLX_GO_SIMD_AVX512", "GOMLX_GO_SIMD_AVX2":
			run.Env[k] = v
		}
	}
	procDir := filepath.Join(o.OutDir, "processes")
	for _, d := range []string{o.WorkDir, procDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return run, err
		}
	}
	logf := func(format string, args ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, format+"\n", args...)
		}
	}
	for _, c := range o.Cases {
		cr := CPUCaseResult{Case: c}
		spec := CPUSpec{Case: c, Settings: o.Settings, BatchFile: filepath.Join(o.WorkDir, "batch-"+c.Tag()+".safetensors")}
		if c.Method != "full" {
			spec.InitFile = filepath.Join(o.WorkDir, "init-"+c.Tag()+".safetensors")
		}
		specFile := filepath.Join(o.WorkDir, "spec-"+c.Tag()+".json")
		b, _ := json.MarshalIndent(spec, "", "  ")
		if err := writeFileAtomic(specFile, b); err != nil {
			return run, err
		}
		if err := WriteCPUBatch(c, o.Settings, spec.BatchFile); err != nil {
			return run, err
		}
		variants := o.Variants
		if c.Method == "lora-all" && slices.Contains(o.QLoRACases, c.Key) {
			for _, v := range o.Variants {
				variants = append(variants, QLoRAPrefix+v)
			}
		}
		rounds := max(1, o.Rounds)
		memfitRounds := make([][]*CPUSideResult, len(variants))
		var torchRounds []*CPUSideResult
		for round := range rounds {
			suffix := ""
			if rounds > 1 {
				suffix = fmt.Sprintf("-r%d", round+1)
			}
			for i, v := range variants {
				name := fmt.Sprintf("%s-memfit-%s%s", c.Tag(), strings.ReplaceAll(v, "/", "-"), suffix)
				args := []string{"--spec", specFile, "--variant", v}
				if i == 0 && round == 0 {
					args = append(args, "--write-init")
				}
				if o.Profile {
					args = append(args, "--cpuprofile", filepath.Join(procDir, name+".pprof"))
				}
				logf("(%s) memfit %s%s ...", c.Key, v, suffix)
				r, err := runCPUProcess(o.Memfit, args, env, procDir, name)
				if err != nil {
					run.Problems = append(run.Problems, err.Error())
					logf("  %v", err)
				} else {
					logf("  first loss %.7g, median step %.3fs, max RSS %s", r.FirstLoss(), r.MedianSeconds, memory.FormatBytes(r.MaxRSSBytes))
				}
				memfitRounds[i] = append(memfitRounds[i], r)
			}
			logf("(%s) PyTorch%s ...", c.Key, suffix)
			r, err := runCPUProcess(o.Python, []string{"--spec", specFile}, nil, procDir, c.Tag()+"-pytorch"+suffix)
			if err != nil {
				run.Problems = append(run.Problems, err.Error())
				logf("  %v", err)
			} else {
				logf("  first loss %.7g, median step %.3fs, max RSS %s", r.FirstLoss(), r.MedianSeconds, memory.FormatBytes(r.MaxRSSBytes))
			}
			torchRounds = append(torchRounds, r)
		}
		for i, v := range variants {
			cr.Memfit = append(cr.Memfit, CPUMemfitResult{Variant: v, Result: mergeRounds(memfitRounds[i])})
		}
		cr.PyTorch = mergeRounds(torchRounds)
		if cr.PyTorch != nil && run.PyTorch == nil {
			run.PyTorch = cr.PyTorch.Versions
		}
		inter := variants
		if len(o.MemfitInterleave) > 0 && len(inter) > 1 {
			logf("(%s) memfit %s interleaved in one process ...", c.Key, strings.Join(inter, ", "))
			var ir CPUInterleaved
			name := c.Tag() + "-memfit-interleaved"
			if _, err := runJSONProcess(o.MemfitInterleave, []string{"--spec", specFile, "--variants", strings.Join(inter, ",")},
				env, procDir, name, &ir); err != nil {
				run.Problems = append(run.Problems, err.Error())
				logf("  %v", err)
			} else {
				cr.Interleaved = &ir
			}
		}
		for _, m := range cr.Memfit {
			if m.Result != nil && run.Memfit == nil {
				run.Memfit = m.Result.Versions
			}
		}
		run.Problems = append(run.Problems, cr.compare(o.LossTol)...)
		run.Cases = append(run.Cases, cr)
	}
	run.Seconds = time.Since(start).Seconds()
	return run, nil
}

// interleavedRatio returns variant's step over the baseline's from the case's interleaved run (0 without one).
func (cr CPUCaseResult) interleavedRatio(variant string) float64 {
	if cr.Interleaved == nil {
		return 0
	}
	for i, v := range cr.Interleaved.Variants {
		if v == variant && i < len(cr.Interleaved.RatioToFirst) {
			return cr.Interleaved.RatioToFirst[i]
		}
	}
	return 0
}

// roundsNote describes a run in several rounds for the settings line.
func roundsNote(rounds int) string {
	if rounds <= 1 {
		return ""
	}
	return fmt.Sprintf(", in %d rounds (each row's step is the median of its rounds' medians)", rounds)
}

// mergeRounds combines one row's processes over the rounds (nil where a round failed): the first one's losses,
// versions and memory figures, every round's timed steps, the median of the rounds' medians (RoundMedians lists
// them) and the largest resident sets. It returns nil when every round failed.
func mergeRounds(rs []*CPUSideResult) *CPUSideResult {
	var out *CPUSideResult
	var medians []float64
	for _, r := range rs {
		if r == nil {
			continue
		}
		if out == nil {
			c := *r
			c.StepSeconds = nil
			out = &c
		}
		medians = append(medians, r.MedianSeconds)
		out.StepSeconds = append(out.StepSeconds, r.StepSeconds...)
		out.MaxRSSBytes = max(out.MaxRSSBytes, r.MaxRSSBytes)
		out.Wait4MaxRSSBytes = max(out.Wait4MaxRSSBytes, r.Wait4MaxRSSBytes)
		out.RSSBeforeTrainBytes = max(out.RSSBeforeTrainBytes, r.RSSBeforeTrainBytes)
	}
	if out == nil || len(rs) == 1 {
		return out
	}
	med := median(medians)
	out.PerSecond *= out.MedianSeconds / med
	out.MedianSeconds, out.RoundMedians = med, medians
	return out
}

// compare fills the ratios and returns the case's first-step loss disagreements.
func (cr *CPUCaseResult) compare(tol float64) []string {
	var problems []string
	p := cr.PyTorch
	var plain *CPUSideResult
	if len(cr.Memfit) > 0 {
		plain = cr.Memfit[0].Result
	}
	for i := range cr.Memfit {
		m := &cr.Memfit[i]
		r := m.Result
		if r == nil {
			continue
		}
		if plain != nil && plain.MedianSeconds > 0 {
			m.StepVsPlain = r.MedianSeconds / plain.MedianSeconds
		}
		if p == nil || strings.HasPrefix(m.Variant, QLoRAPrefix) {
			continue // no reference for QLoRA: its base weights are NF4, the reference's are float
		}
		if p.MedianSeconds > 0 {
			m.StepVsPyTorch = r.MedianSeconds / p.MedianSeconds
		}
		m.FirstLossRelDiff = math.Abs(r.FirstLoss()-p.FirstLoss()) / math.Abs(p.FirstLoss())
		if !(m.FirstLossRelDiff <= tol) { // NaN fails too
			problems = append(problems, fmt.Sprintf("(%s) first-step loss: memfit %s %.9g, PyTorch %.9g: relative difference %.2e > %.0e: the two sides do not run the same model",
				cr.Case.Key, r.Variant, r.FirstLoss(), p.FirstLoss(), m.FirstLossRelDiff, tol))
		}
		if i == 0 && len(r.Losses) > 1 && len(p.Losses) > 1 {
			m.UpdateDelta, m.PyTorchUpdateDelta = r.Losses[1]-r.Losses[0], p.Losses[1]-p.Losses[0]
		}
	}
	return problems
}

// jsonProcess is one finished run of runJSONProcess.
type jsonProcess struct {
	state   *os.ProcessState
	wall    float64
	command []string
	out     string // the JSON file it wrote
}

// runJSONProcess runs command + args + ["--json", dir/name.json] with its output in dir/name.log (env nil: this
// process's environment) and decodes the JSON file it writes into result. A failed run's error names the log's
// last line.
func runJSONProcess(command, args, env []string, dir, name string, result any) (jsonProcess, error) {
	p := jsonProcess{out: filepath.Join(dir, name+".json")}
	logPath := filepath.Join(dir, name+".log")
	os.Remove(p.out)
	p.command = append(append(append([]string(nil), command...), args...), "--json", p.out)
	logFile, err := os.Create(logPath)
	if err != nil {
		return p, err
	}
	defer logFile.Close()
	cmd := exec.Command(p.command[0], p.command[1:]...)
	cmd.Stdout, cmd.Stderr, cmd.Env = logFile, logFile, env
	start := time.Now()
	runErr := cmd.Run()
	p.wall, p.state = time.Since(start).Seconds(), cmd.ProcessState
	if runErr != nil {
		return p, fmt.Errorf("%s failed (%v): %s (log: %s)", name, runErr, lastLine(logPath), logPath)
	}
	b, err := readfile.Read(p.out, readfile.Config)
	if err != nil {
		return p, fmt.Errorf("%s wrote no result: %w (log: %s)", name, err, logPath)
	}
	if err := json.Unmarshal(b, result); err != nil {
		return p, fmt.Errorf("%s: %s: %w", name, p.out, err)
	}
	return p, nil
}

// runCPUProcess runs command + args + ["--json", OUT] with its output in dir/name.log, reads OUT (dir/name.json)
// and adds the process's maximum RSS, wall time and command line to it (rewriting the file).
func runCPUProcess(command, args, env []string, dir, name string) (*CPUSideResult, error) {
	var r CPUSideResult
	driverHWM := ProcHWM()
	p, err := runJSONProcess(command, args, env, dir, name, &r)
	if err != nil {
		return nil, err
	}
	if len(r.Losses) == 0 || r.MedianSeconds <= 0 {
		return nil, fmt.Errorf("%s: %s has no losses or step times", name, p.out)
	}
	r.Wait4MaxRSSBytes, r.DriverHWMBytes, r.WallSeconds, r.Command = maxRSS(p.state), driverHWM, p.wall, p.command
	if r.MaxRSSBytes == 0 && r.Wait4MaxRSSBytes > r.DriverHWMBytes {
		r.MaxRSSBytes = r.Wait4MaxRSSBytes // no /proc/self/status: wait4's figure, which is the child's own here
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err == nil {
		err = writeFileAtomic(p.out, append(b, '\n'))
	}
	return &r, err
}

// lastLine returns the last non-empty line of a file (a child's error message).
func lastLine(path string) string {
	b, _ := readfile.Read(path, readfile.Log)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// WriteCPURun prints the comparison: the machine and versions, the settings, one block per case with the
// reference and memfit's variants, the loss agreement, the goals and how each figure was measured.
func WriteCPURun(w io.Writer, run CPURun) error {
	var buf bytes.Buffer
	p := func(format string, args ...any) { fmt.Fprintf(&buf, format+"\n", args...) }
	m := run.Machine
	p("memfit vs plain PyTorch on the CPU (%s)", run.Date)
	p("machine: %s, %d cores, %s memory, %s", m.CPU, m.Cores, memory.FormatBytesPrec(m.MemBytes, 1), m.OS)
	if v := run.Memfit; v != nil {
		p("%s", wrap(fmt.Sprintf("memfit: %s, GoMLX %s (compute %s), matmul kernels %s, GOEXPERIMENT=%s; environment: %s", v["go"], v["gomlx"], v["compute"],
			v["kernels"], orDash(v["goexperiment"]), envLine(run.Env)), 118, "  "))
	}
	if v := run.PyTorch; v != nil {
		p("%s", wrap(fmt.Sprintf("PyTorch: torch %s, Python %s, numpy %s, %s threads; BLAS: %s", v["torch"], v["python"], v["numpy"], v["threads"], v["blas"]), 118, "  "))
		for _, n := range strings.Split(v["notes"], "; ") {
			if n != "" {
				p("%s", wrap("  note: "+n, 118, "    "))
			}
		}
	}
	if run.Command != "" {
		p("command: %s", run.Command)
	}
	s := run.Settings
	p("%s", wrap(fmt.Sprintf("settings: %s; AdamW lr %g, betas (%g, %g), eps %g, weight decay %g; LoRA r=%d, alpha %g; memfit attention %s; "+
		"the same batch on both sides (seed %d); per process %d warm-up step(s) (memfit compiles in the first), then the median of %d timed steps; "+
		"one process per row, one after the other%s (%.0f s in all)",
		s.DType, s.LR, s.Beta1, s.Beta2, s.Eps, s.WeightDecay, s.LoRARank, s.LoRAAlpha, s.Attention, s.Seed, s.Warmup, s.Steps,
		roundsNote(run.Rounds), run.Seconds), 118, "  "))
	for _, cr := range run.Cases {
		p("%s", wrap("("+cr.Case.Key+") "+cr.Case.Describe, 118, "    "))
	}
	p("")
	tw := tabwriter.NewWriter(&buf, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "case\tside\tvariant\tfirst loss\tstep\tmin\tthroughput\tx PyTorch\tx plain\tmax RSS\tRSS at start\tsaved act.\tstep peak\t\n")
	peakMethod := ""
	var compiles []string
	for _, cr := range run.Cases {
		key := "(" + cr.Case.Key + ")"
		if r := cr.PyTorch; r != nil {
			fmt.Fprintf(tw, "%s\tPyTorch\t-\t%.7g\t%.3fs\t%.3fs\t%s\t1.000\t-\t%s\t%s\t-\t-\t\n", key, r.FirstLoss(), r.MedianSeconds,
				minOf(r.StepSeconds), throughput(r), memory.FormatBytesPrec(r.MaxRSSBytes, 1), memory.FormatBytesPrec(r.RSSBeforeTrainBytes, 1))
		} else {
			fmt.Fprintf(tw, "%s\tPyTorch\t-\tfailed\t\t\t\t\t\t\t\t\t\t\n", key)
		}
		key = ""
		for _, mr := range cr.Memfit {
			r := mr.Result
			if r == nil {
				fmt.Fprintf(tw, "%s\tmemfit\t%s\tfailed\t\t\t\t\t\t\t\t\t\t\n", key, mr.Variant)
				continue
			}
			if peakMethod == "" || r.PeakMethod != peakMethod && strings.HasPrefix(r.PeakMethod, "unavailable") {
				peakMethod = r.PeakMethod
			}
			if r.CompileSeconds > 0 {
				compiles = append(compiles, fmt.Sprintf("(%s) %s %.2f s", cr.Case.Key, r.Variant, r.CompileSeconds))
			}
			fmt.Fprintf(tw, "%s\tmemfit\t%s\t%.7g\t%.3fs\t%.3fs\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", key, r.Variant, r.FirstLoss(), r.MedianSeconds,
				minOf(r.StepSeconds), throughput(r), fmtRatio(mr.StepVsPyTorch), fmtRatio(mr.StepVsPlain), memory.FormatBytesPrec(r.MaxRSSBytes, 1),
				memory.FormatBytesPrec(r.RSSBeforeTrainBytes, 1), memory.FormatBytesPrec(r.SavedActivationBytes, 1), memory.FormatPeakCell(r.PeakBytes, r.PeakMethod, 1))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	p("")
	var loss, upd, goals []string
	for _, cr := range run.Cases {
		var l []string
		for i, mr := range cr.Memfit {
			if mr.Result == nil || cr.PyTorch == nil || strings.HasPrefix(mr.Variant, QLoRAPrefix) {
				continue
			}
			l = append(l, fmt.Sprintf("%s %.1e", mr.Result.Variant, mr.FirstLossRelDiff))
			if i == 0 && mr.PyTorchUpdateDelta != 0 {
				upd = append(upd, fmt.Sprintf("(%s) %.4g vs %.4g", cr.Case.Key, mr.UpdateDelta, mr.PyTorchUpdateDelta))
			}
		}
		if len(l) > 0 {
			loss = append(loss, "("+cr.Case.Key+") "+strings.Join(l, ", "))
		}
		var g []string
		if len(cr.Memfit) > 0 && cr.Memfit[0].StepVsPyTorch > 0 {
			g = append(g, fmt.Sprintf("memfit %s step %.2fx PyTorch's (<= %.1f: %s)", run.Variants[0], cr.Memfit[0].StepVsPyTorch,
				cr.Case.StepGoal, goal(cr.Memfit[0].StepVsPyTorch, cr.Case.StepGoal, true)))
		}
		for _, mr := range cr.Memfit[min(1, len(cr.Memfit)):] {
			if mr.Result != nil && mr.StepVsPlain > 0 && strings.HasPrefix(mr.Variant, QLoRAPrefix) {
				if r := cr.interleavedRatio(mr.Variant); r > 0 {
					g = append(g, fmt.Sprintf("%s %.3fx memfit %s's (LoRA) interleaved (%.3fx in separate processes; informational)",
						mr.Variant, r, run.Variants[0], mr.StepVsPlain))
				} else {
					g = append(g, fmt.Sprintf("%s %.3fx memfit %s's (LoRA; informational)", mr.Variant, mr.StepVsPlain, run.Variants[0]))
				}
			} else if r := cr.interleavedRatio(mr.Variant); mr.Result != nil && r > 0 {
				g = append(g, fmt.Sprintf("%s %.3fx memfit %s's interleaved in one process (%.3fx in separate processes) (<= %.2f: %s)",
					mr.Result.Variant, r, run.Variants[0], mr.StepVsPlain, ApproxGoal, goal(r, ApproxGoal, true)))
			} else if mr.Result != nil && mr.StepVsPlain > 0 {
				g = append(g, fmt.Sprintf("%s %.3fx memfit %s's (<= %.2f: %s)", mr.Result.Variant, mr.StepVsPlain, run.Variants[0],
					ApproxGoal, goal(mr.StepVsPlain, ApproxGoal, true)))
			}
		}
		if len(g) > 0 {
			goals = append(goals, "goals ("+cr.Case.Key+"): "+strings.Join(g, "; "))
		}
	}
	verdict := "all agree"
	for _, pr := range run.Problems {
		if strings.Contains(pr, "first-step loss") {
			verdict = "DISAGREEMENT, see below"
		}
	}
	var inter []string
	for _, cr := range run.Cases {
		if in := cr.Interleaved; in != nil {
			var parts []string
			for i, v := range in.Variants {
				part := fmt.Sprintf("%s %.3fs", v, in.MedianSeconds[i])
				if i > 0 {
					part += fmt.Sprintf(" (%.3fx)", in.RatioToFirst[i])
				}
				parts = append(parts, part)
			}
			inter = append(inter, "("+cr.Case.Key+") "+strings.Join(parts, ", "))
		}
	}
	if len(inter) > 0 {
		p("%s", wrap("interleaved: memfit's variants in one process, a step of each in turn, median step (median of the per-turn ratios to "+
			run.Variants[0]+"): "+strings.Join(inter, "; "), 118, "  "))
	}
	p("%s", wrap(fmt.Sprintf("first-step loss, relative difference memfit vs PyTorch (tolerance %.0e): %s: %s", run.LossTol, strings.Join(loss, "; "), verdict), 118, "  "))
	if len(upd) > 0 {
		p("%s", wrap(fmt.Sprintf("loss change over the first AdamW update, memfit %s vs PyTorch from the same initial weights and adapters (a check of the gradients and the update, informational): %s",
			run.Variants[0], strings.Join(upd, "; ")), 118, "  "))
	}
	for _, g := range goals {
		p("%s", wrap(g, 118, "  "))
	}
	if len(compiles) > 0 {
		p("%s", wrap("compile: the time memfit's first step spent building and compiling its programs (not in its step time): "+
			strings.Join(compiles, ", "), 118, "  "))
	}
	p("step, min: median and shortest wall time of the timed optimizer steps (forward, loss, backward, AdamW update) in")
	p("  each process; throughput at the median (images or tokens per second); x PyTorch, x plain: median step-time ratios")
	p("max RSS: the row's own process's maximum resident set size, its VmHWM (/proc/self/status) read after its last step:")
	p("  the whole process, runtime, libraries, weights, optimizer state, activations and allocator headroom alike (the")
	p("  JSON also has wait4's ru_maxrss, which on Linux cannot fall below the driver's own RSS at the spawn)")
	p("RSS at start: the same process's VmHWM once model, batch and optimizer were set up, before the first step")
	p("%s", wrap("saved act.: memfit's activations kept for the backward, "+string(memory.MethodSavedWalk), 118, "  "))
	if peakMethod != "" {
		p("step peak: memfit's training-step peak (its compiled step program: forward, backward and, for the device-resident step, the update), %s", peakMethod)
	}
	if noisy := noisyRows(run); len(noisy) > 0 {
		p("%s", wrap(fmt.Sprintf("NOISE: the median step is more than %.0f%% above the shortest in %s: the machine was busy (other processes, "+
			"or a throttled CPU), so these ratios are unreliable; rerun on a quiet machine", 100*(noiseLimit-1), strings.Join(noisy, ", ")), 118, "  "))
	}
	for _, pr := range run.Problems {
		p("%s", wrap("PROBLEM: "+pr, 118, "  "))
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// noiseLimit is the median / shortest step-time ratio above which a row is called noisy.
const noiseLimit = 1.2

// noisyRows names the rows whose median step is more than noiseLimit times their shortest.
func noisyRows(run CPURun) []string {
	var out []string
	check := func(key, name string, r *CPUSideResult) {
		if r != nil && len(r.StepSeconds) > 1 && r.MedianSeconds > noiseLimit*minOf(r.StepSeconds) {
			out = append(out, fmt.Sprintf("(%s) %s (%.3fs vs %.3fs)", key, name, r.MedianSeconds, minOf(r.StepSeconds)))
		}
	}
	for _, cr := range run.Cases {
		check(cr.Case.Key, "PyTorch", cr.PyTorch)
		for _, m := range cr.Memfit {
			if m.Result != nil {
				check(cr.Case.Key, "memfit "+m.Result.Variant, m.Result)
			}
		}
	}
	return out
}

func throughput(r *CPUSideResult) string {
	if r.PerSecond >= 100 {
		return fmt.Sprintf("%.0f %s", r.PerSecond, r.Unit)
	}
	return fmt.Sprintf("%.1f %s", r.PerSecond, r.Unit)
}

func minOf(xs []float64) float64 {
	m := math.Inf(1)
	for _, x := range xs {
		m = math.Min(m, x)
	}
	if len(xs) == 0 {
		return 0
	}
	return m
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// envLine prints the recorded environment variables, or says none of them was set.
func envLine(env map[string]string) string {
	var parts []string
	for _, k := range []string{"GODEBUG", "GOGC", "GOMEMLIMIT", "GOMAXPROCS", "GOMLX_GO_SIMD_AVX512", "GOMLX_GO_SIMD_AVX2"} {
		if v, ok := env[k]; ok {
			parts = append(parts, k+"="+v)
		}
	}
	if len(parts) == 0 {
		return "no GODEBUG/GOGC/GOMAXPROCS set"
	}
	return strings.Join(parts, " ")
}

// writeFileAtomic writes data to path through a temporary file beside it and a rename.
func writeFileAtomic(path string, data []byte) error {
	return safetensors.WriteAtomic(path, func(w *bufio.Writer) error {
		_, err := w.Write(data)
		return err
	})
}
