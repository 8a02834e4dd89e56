package engine

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// procRoot is where NVIDIAGPUs reads the driver's files (tests point it at a fake tree).
var procRoot = "/proc"

// NVIDIAGPUs returns the NVIDIA GPUs of this machine as the driver lists them, one "MODEL (BUS ID)" each, and
// where the list came from: the driver's /proc/driver/nvidia/gpus/*/information files ("Model:" and "Bus
// Location:" lines), or, where those are absent, `nvidia-smi -L`. No driver, no GPU: nil. It loads no library
// and starts no plugin, so `finetune version` can say what a run on xla:cuda would find.
func NVIDIAGPUs() (gpus []string, source string) {
	dir := filepath.Join(procRoot, "driver", "nvidia", "gpus")
	infos, _ := filepath.Glob(filepath.Join(dir, "*", "information"))
	sort.Strings(infos)
	for _, info := range infos {
		f, err := os.Open(info)
		if err != nil {
			continue
		}
		model, bus := "", filepath.Base(filepath.Dir(info))
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, ok := strings.Cut(sc.Text(), ":")
			if !ok {
				continue
			}
			switch strings.TrimSpace(k) {
			case "Model":
				model = strings.TrimSpace(v)
			case "Bus Location":
				bus = strings.TrimSpace(v)
			}
		}
		f.Close()
		if model != "" {
			gpus = append(gpus, model+" ("+bus+")")
		}
	}
	if len(gpus) > 0 {
		return gpus, dir
	}
	smi, err := exec.LookPath("nvidia-smi")
	if err != nil {
		return nil, ""
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, smi, "-L").Output()
	if err != nil {
		return nil, ""
	}
	for _, line := range strings.Split(string(out), "\n") {
		if line = strings.TrimSpace(line); strings.HasPrefix(line, "GPU ") {
			gpus = append(gpus, line)
		}
	}
	return gpus, "nvidia-smi -L"
}
