package cli_test

import (
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/memfit/memfit/cli"
	"github.com/memfit/memfit/finetune"
)

// helpFlags runs `finetune PATH... --help` and returns the flags its help lists (local and global).
func helpFlags(t *testing.T, path []string) map[string]bool {
	t.Helper()
	out, errOut, code := run(t, append(path, "--help")...)
	if code != 0 {
		t.Fatalf("%v --help: exit %d: %s", path, code, errOut)
	}
	flags := map[string]bool{}
	line := regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9][a-z0-9-]*)`)
	inFlags := false
	for _, l := range strings.Split(out, "\n") {
		switch {
		case strings.HasSuffix(l, "Flags:"):
			inFlags = true
		case l == "" || !strings.HasPrefix(l, " "):
			inFlags = false
		case inFlags:
			if m := line.FindStringSubmatch(l); m != nil {
				flags[m[1]] = true
			}
		}
	}
	if len(flags) == 0 {
		t.Fatalf("%v --help lists no flags:\n%s", path, out)
	}
	return flags
}

// commandPaths walks the command tree: every command and subcommand, as the arguments that name it.
func commandPaths() [][]string {
	var paths [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
			return
		}
		paths = append(paths, path)
		for _, sub := range c.Commands() {
			walk(sub, append(append([]string(nil), path...), sub.Name()))
		}
	}
	walk(cli.NewRoot(), nil)
	return paths
}

// wrongSpellings are spellings of shared settings that no command may list: each setting has one flag name in
// every command (the old spellings still work as hidden, deprecated aliases).
var wrongSpellings = map[string][]string{
	"seq-len":          {"seq", "seqlen", "seq-length", "sequence-length", "max-len", "max-length-tokens", "tokens"},
	"num-labels":       {"labels", "n-labels", "num-classes", "classes"},
	"batch-size":       {"batch", "bs", "batchsize", "micro-batch"},
	"accum-steps":      {"accum", "grad-accum", "gradient-accumulation"},
	"warmup-steps":     {"warmup-step"},
	"max-batch-size":   {"max-batch"},
	"max-seq-len":      {"max-seq"},
	"vit-batch-size":   {"vit-batch"},
	"llama-batch-size": {"llama-batch"},
	"llama-seq-len":    {"llama-seq"},
	"lora-r":           {"lora-rank", "rank"},
	"lora-targets":     {"lora-target", "targets"},
	"lr":               {"learning-rate"},
	"out":              {"output", "output-dir", "out-dir"},
	"model":            {"model-dir", "model-path"},
	"tokenizer":        {"tok", "tokenizer-dir"},
	"compute-dtype":    {"compute-type", "dtype-compute"},
}

// TestFlagSpellings runs every command's --help and checks that shared settings have one flag name everywhere: no
// command lists a known wrong spelling, a setting of the training config is spelled as finetune.Settings says in
// every command that lists it, and `memory` lists only the settings that shape the step it plans.
func TestFlagSpellings(t *testing.T) {
	listed := map[string][]string{} // flag -> commands listing it
	paths := commandPaths()
	if len(paths) < 20 {
		t.Fatalf("walked %d commands, want every one", len(paths))
	}
	byPath := map[string]map[string]bool{}
	for _, p := range paths {
		name := "finetune " + strings.Join(p, " ")
		flags := helpFlags(t, p)
		byPath[strings.Join(p, " ")] = flags
		for f := range flags {
			listed[f] = append(listed[f], name)
		}
	}
	for canonical, wrongs := range wrongSpellings {
		for _, w := range wrongs {
			if cmds := listed[w]; len(cmds) > 0 {
				t.Errorf("--%s is listed by %v: the shared spelling is --%s", w, cmds, canonical)
			}
		}
	}
	// A training setting under another name: a flag whose name is a setting's key or flag with the separators
	// dropped or changed (lora_r, lorar) would be a second spelling.
	squash := func(s string) string { return strings.NewReplacer("-", "", "_", "").Replace(s) }
	for _, s := range finetune.Settings {
		for f, cmds := range listed {
			if f != s.Flag() && squash(f) == squash(s.Key) {
				t.Errorf("--%s (listed by %v) spells the setting %s, whose flag is --%s", f, cmds, s.Key, s.Flag())
			}
		}
	}
	// train lists every setting of the table; memory only those that shape its step.
	for _, s := range finetune.Settings {
		if !byPath["train"][s.Flag()] {
			t.Errorf("train --help does not list --%s", s.Flag())
		}
	}
	for _, f := range []string{"lr", "steps", "log-every", "checkpoint-every", "keep-checkpoints", "warmup-steps",
		"schedule", "weight-decay", "clip-norm", "divergence-factor", "seed", "accum-steps", "approx-act", "ms-norm",
		"grad-ckpt", "mesa", "init-adapter", "lora-alpha", "rslora"} {
		if byPath["memory"][f] {
			t.Errorf("memory --help lists --%s, which does not change the step it plans", f)
		}
	}
	for _, f := range []string{"method", "lora-r", "lora-targets", "train-modules", "optimizer", "batch-size",
		"compute-dtype", "attention", "seq-len", "num-labels", "config", "variants"} {
		if !byPath["memory"][f] {
			t.Errorf("memory --help does not list --%s", f)
		}
	}
	var shared []string
	for f, cmds := range listed {
		if len(cmds) > 1 && f != "help" && f != "backend" && f != "debug" {
			shared = append(shared, f)
		}
	}
	sort.Strings(shared)
	t.Logf("%d commands; flags listed by more than one: %s", len(paths), strings.Join(shared, " "))
}

// TestDeprecatedSpellings: the old spellings are hidden but still work, set the canonical flag (the same result)
// and say which spelling to use.
func TestDeprecatedSpellings(t *testing.T) {
	canonical, _, code := run(t, "memory", "--model", "llama:tiny", "--num-labels", "0", "--seq-len", "16", "--batch-size", "1",
		"--variants", "plain", "--json")
	if code != 0 {
		t.Fatalf("memory with the canonical flags: exit %d", code)
	}
	old, errOut, code := run(t, "memory", "--model", "llama:tiny", "--labels", "0", "--seq", "16", "--batch-size", "1",
		"--variants", "plain", "--json")
	if code != 0 || old != canonical {
		t.Errorf("memory --labels/--seq: exit %d, output differs from --num-labels/--seq-len (%s)", code, errOut)
	}
	for _, want := range []string{"--seq is a deprecated spelling of --seq-len", "--labels is a deprecated spelling of --num-labels"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("no note %q in %q", want, errOut)
		}
	}
	// An alias set to a bad value is refused like the canonical flag.
	if _, errOut, code := run(t, "memory", "--model", "llama:tiny", "--seq", "0"); code != 2 || !strings.Contains(errOut, "--seq-len 0: give 1 to") {
		t.Errorf("--seq 0: exit %d, %q", code, errOut)
	}
	if _, errOut, code := run(t, "bench", "step", "--model", "llama:tiny", "--batch", "x"); code != 2 || strings.Count(errOut, "invalid argument") != 1 {
		t.Errorf("--batch x: exit %d, %q", code, errOut)
	}
	// train's --warmup and --accum set warmup_steps and accum_steps (the dry run prints the resolved config).
	out, errOut, code := run(t, "train", "--model", "m", "--data", "d.safetensors", "--out", t.TempDir(), "--warmup", "7",
		"--accum", "3", "--dry-run")
	if code != 0 || !strings.Contains(out, "warmup_steps: 7") || !strings.Contains(out, "accum_steps: 3") {
		t.Errorf("train --warmup 7 --accum 3 --dry-run: exit %d, %s\n%s", code, errOut, out)
	}
	help, _, _ := run(t, "memory", "--help")
	for _, old := range []string{"--seq ", "--labels ", "--max-batch ", "--max-seq "} {
		if strings.Contains(help, old) {
			t.Errorf("memory --help lists the deprecated %s", old)
		}
	}
}
