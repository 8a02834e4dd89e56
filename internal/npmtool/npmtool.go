// Package npmtool installs a folder of Node.js tooling (package.json, package-lock.json and the scripts beside
// them, such as tools/llamacpp) once per user into a cache folder, and runs its scripts from there. memfit's
// independent checks use it (llama.cpp through node-llama-cpp, chat templates through @huggingface/jinja), so
// that `go test ./...` installs what they need by itself, once per machine and not once per checkout.
//
// The cache is $MEMFIT_NPM_CACHE, else memfit/npm in the user's cache folder (~/.cache/memfit/npm on Linux).
// Its layout:
//
//	NAME-P/                  one install of a package.json + package-lock.json (P: their hash)
//	  package.json, package-lock.json, node_modules/, .installed
//	  scripts-S/             the tool's scripts (S: their hash), beside a link node_modules -> ../node_modules
//	NAME-P.lock              held while installing
//
// so a change to the packages installs afresh, a change to a script only copies the scripts, and checkouts with
// different scripts share one node_modules. Node resolves a script's imports from the folder the script lies
// in, which is why the scripts are copied rather than run from the checkout.
package npmtool

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/memfit/memfit/internal/filelock"
	"github.com/memfit/memfit/internal/readfile"
)

// ErrNoNode says node or npm is not on the PATH: the tool cannot run on this machine at all (a test skips on
// it; every other error means something is there but broken).
var ErrNoNode = errors.New("node and npm are not on the PATH")

// Installed is a tool folder installed in the cache.
type Installed struct {
	// Node is the node executable.
	Node string
	// Dir holds the tool's scripts and node_modules (a link to the install's): run scripts from here.
	Dir string
	// Packages is the install's folder (package.json, node_modules).
	Packages string
}

// Script is the path of one of the tool's scripts in the cache.
func (t *Installed) Script(name string) string { return filepath.Join(t.Dir, name) }

// CacheRoot is where tools are installed: $MEMFIT_NPM_CACHE, else memfit/npm under os.UserCacheDir.
func CacheRoot() (string, error) {
	if d := os.Getenv("MEMFIT_NPM_CACHE"); d != "" {
		return filepath.Abs(d)
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache folder for the npm tools (%v): set MEMFIT_NPM_CACHE", err)
	}
	return filepath.Join(d, "memfit", "npm"), nil
}

// FindNode returns the node executable, with an error wrapping ErrNoNode when node or npm is missing.
func FindNode() (string, error) {
	node, err := exec.LookPath("node")
	if err != nil {
		return "", fmt.Errorf("%w (node is missing)", ErrNoNode)
	}
	if _, err := exec.LookPath("npm"); err != nil {
		return "", fmt.Errorf("%w (npm is missing)", ErrNoNode)
	}
	return node, nil
}

// Install installs the tool folder src (its package.json and package-lock.json with `npm install`, and copies
// of its other top-level files) into the cache, unless an earlier call did; concurrent processes take turns on
// a lock, and the second finds the first's install. log, when not nil, is told when npm runs (it takes a while
// on first use). npm runs with --ignore-scripts (no package's install script builds anything) and without
// writing to package.json or the lock.
func Install(src string, log io.Writer) (*Installed, error) {
	node, err := FindNode()
	if err != nil {
		return nil, err
	}
	src, err = filepath.Abs(src)
	if err != nil {
		return nil, err
	}
	pkg, err := readfile.Read(filepath.Join(src, "package.json"), readfile.Config)
	if err != nil {
		return nil, fmt.Errorf("%s: no package.json to install the tool from", src)
	}
	lock, err := readfile.Read(filepath.Join(src, "package-lock.json"), readfile.Config)
	if err != nil {
		return nil, fmt.Errorf("%s: no package-lock.json (the install is pinned by it): run `npm install --package-lock-only` there", src)
	}
	scripts, err := scriptFiles(src)
	if err != nil {
		return nil, err
	}
	root, err := CacheRoot()
	if err != nil {
		return nil, err
	}
	name := filepath.Base(src)
	pkgDir := filepath.Join(root, name+"-"+digest(pkg, lock))
	release, err := filelock.Lock(pkgDir + ".lock")
	if err != nil {
		return nil, err
	}
	defer release()
	if err := installPackages(pkgDir, pkg, lock, log); err != nil {
		return nil, err
	}
	dir, err := placeScripts(pkgDir, scripts)
	if err != nil {
		return nil, err
	}
	return &Installed{Node: node, Dir: dir, Packages: pkgDir}, nil
}

// installedMark is written last into an install folder: without it the folder is a broken install, redone.
const installedMark = ".installed"

func installPackages(pkgDir string, pkg, lock []byte, log io.Writer) error {
	if _, err := os.Stat(filepath.Join(pkgDir, installedMark)); err == nil {
		if st, err := os.Stat(filepath.Join(pkgDir, "node_modules")); err == nil && st.IsDir() {
			return nil
		}
	}
	// A leftover of an interrupted install (no mark) is started over; its scripts folders go with it.
	if err := os.RemoveAll(pkgDir); err != nil {
		return err
	}
	if err := os.MkdirAll(pkgDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(pkgDir, "package.json"), pkg, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(pkgDir, "package-lock.json"), lock, 0o644); err != nil {
		return err
	}
	if log != nil {
		fmt.Fprintf(log, "installing %s with npm into %s (once)\n", filepath.Base(pkgDir), pkgDir)
	}
	cmd := exec.Command("npm", "install", "--no-audit", "--no-fund", "--ignore-scripts", "--no-save")
	cmd.Dir = pkgDir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("npm install in %s: %v: %s", pkgDir, err, lastLine(out.String()))
	}
	return os.WriteFile(filepath.Join(pkgDir, installedMark), nil, 0o644)
}

// placeScripts puts the scripts into pkgDir/scripts-HASH (made in a temporary folder and renamed into place, so
// a reader never sees half of it) and returns that folder.
func placeScripts(pkgDir string, scripts map[string][]byte) (string, error) {
	names := make([]string, 0, len(scripts))
	for n := range scripts {
		names = append(names, n)
	}
	slices.Sort(names)
	var parts [][]byte
	for _, n := range names {
		parts = append(parts, []byte(n), scripts[n])
	}
	dir := filepath.Join(pkgDir, "scripts-"+digest(parts...))
	if _, err := os.Stat(dir); err == nil {
		return dir, nil
	}
	tmp, err := os.MkdirTemp(pkgDir, ".scripts-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	for _, n := range names {
		if err := os.WriteFile(filepath.Join(tmp, n), scripts[n], 0o644); err != nil {
			return "", err
		}
	}
	if err := os.Symlink(filepath.Join("..", "node_modules"), filepath.Join(tmp, "node_modules")); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, statErr := os.Stat(dir); statErr == nil {
			return dir, nil
		}
		return "", err
	}
	return dir, nil
}

// scriptFiles reads the regular top-level files of src other than the package files (the tool's scripts).
func scriptFiles(src string) (map[string][]byte, error) {
	entries, err := os.ReadDir(src)
	if err != nil {
		return nil, err
	}
	out := map[string][]byte{}
	for _, e := range entries {
		n := e.Name()
		if !e.Type().IsRegular() || n == "package.json" || n == "package-lock.json" || strings.HasPrefix(n, ".") {
			continue
		}
		data, err := readfile.Read(filepath.Join(src, n), readfile.Config)
		if err != nil {
			return nil, err
		}
		out[n] = data
	}
	return out, nil
}

func digest(parts ...[]byte) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:", len(p))
		h.Write(p)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" && !strings.HasPrefix(l, "npm error A complete log") {
			return l
		}
	}
	return "(no output)"
}
