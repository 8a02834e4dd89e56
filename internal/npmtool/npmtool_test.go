package npmtool

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestInstall: a tool folder whose package.json depends on a local package is installed into the cache once
// (a second Install runs no npm), its script runs from the cache and imports the package, and a changed script
// gets its own scripts folder over the same node_modules.
func TestInstall(t *testing.T) {
	if _, err := FindNode(); errors.Is(err, ErrNoNode) {
		t.Skip(err)
	}
	tmp := t.TempDir()
	t.Setenv("MEMFIT_NPM_CACHE", filepath.Join(tmp, "cache"))
	dep := filepath.Join(tmp, "greet")
	write(t, filepath.Join(dep, "package.json"), `{"name": "greet", "version": "1.0.0", "type": "module", "main": "index.js"}`)
	write(t, filepath.Join(dep, "index.js"), `export const hi = (who) => "hello " + who;`)
	src := filepath.Join(tmp, "tool")
	write(t, filepath.Join(src, "package.json"), `{"name": "tool", "private": true, "type": "module", "dependencies": {"greet": "file:`+dep+`"}}`)
	write(t, filepath.Join(src, "say.mjs"), `import {hi} from "greet"; console.log(hi("memfit"));`)
	lock := exec.Command("npm", "install", "--package-lock-only", "--no-audit", "--no-fund")
	lock.Dir = src
	if out, err := lock.CombinedOutput(); err != nil {
		t.Fatalf("npm install --package-lock-only: %v: %s", err, out)
	}

	var log strings.Builder
	tool, err := Install(src, &log)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log.String(), "installing tool-") {
		t.Errorf("first install said %q", log.String())
	}
	if got := node(t, tool, "say.mjs"); got != "hello memfit" {
		t.Errorf("script printed %q", got)
	}
	if _, err := os.Stat(filepath.Join(src, "node_modules")); err == nil {
		t.Errorf("Install wrote node_modules into the source folder")
	}

	log.Reset()
	again, err := Install(src, &log)
	if err != nil {
		t.Fatal(err)
	}
	if log.Len() != 0 || again.Dir != tool.Dir {
		t.Errorf("second install: log %q, dir %s (first %s)", log.String(), again.Dir, tool.Dir)
	}

	write(t, filepath.Join(src, "say.mjs"), `import {hi} from "greet"; console.log(hi("again"));`)
	changed, err := Install(src, &log)
	if err != nil {
		t.Fatal(err)
	}
	if log.Len() != 0 || changed.Packages != tool.Packages || changed.Dir == tool.Dir {
		t.Errorf("changed script: log %q, packages %s (was %s), dir %s (was %s)", log.String(), changed.Packages, tool.Packages, changed.Dir, tool.Dir)
	}
	if got := node(t, changed, "say.mjs"); got != "hello again" {
		t.Errorf("changed script printed %q", got)
	}
	if got := node(t, tool, "say.mjs"); got != "hello memfit" {
		t.Errorf("the first scripts folder now prints %q", got)
	}

	// An interrupted install (no mark) is done again.
	if err := os.Remove(filepath.Join(tool.Packages, installedMark)); err != nil {
		t.Fatal(err)
	}
	if _, err := Install(src, &log); err != nil || !strings.Contains(log.String(), "installing") {
		t.Errorf("after an interrupted install: %v, log %q", err, log.String())
	}

	// A folder without the package files is refused by name.
	if _, err := Install(dep+"-missing", nil); err == nil || !strings.Contains(err.Error(), "no package.json") {
		t.Errorf("missing folder: %v", err)
	}
	if err := os.Remove(filepath.Join(src, "package-lock.json")); err != nil {
		t.Fatal(err)
	}
	if _, err := Install(src, nil); err == nil || !strings.Contains(err.Error(), "no package-lock.json") {
		t.Errorf("no lock: %v", err)
	}
}

func node(t *testing.T, tool *Installed, script string) string {
	t.Helper()
	out, err := exec.Command(tool.Node, tool.Script(script)).CombinedOutput()
	if err != nil {
		t.Fatalf("node %s: %v: %s", script, err, out)
	}
	return strings.TrimSpace(string(out))
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
