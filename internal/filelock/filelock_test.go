package filelock

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestLockExcludesAnotherProcess: while this process holds the lock, a second process's TryLock fails and its
// Lock waits until the first releases it.
func TestLockExcludesAnotherProcess(t *testing.T) {
	if runtime.GOOS == "windows" || runtime.GOOS == "plan9" || runtime.GOOS == "js" {
		t.Skip("no flock here")
	}
	if os.Getenv("FILELOCK_CHILD") != "" {
		path := os.Getenv("FILELOCK_CHILD")
		if _, ok, err := TryLock(path); err != nil || ok {
			os.Stdout.WriteString("trylock took a held lock\n")
			os.Exit(1)
		}
		start := time.Now()
		release, err := Lock(path)
		if err != nil {
			os.Stdout.WriteString(err.Error())
			os.Exit(1)
		}
		release()
		os.Stdout.WriteString("waited " + time.Since(start).Round(100*time.Millisecond).String() + "\n")
		os.Exit(0)
	}
	path := filepath.Join(t.TempDir(), "sub", "x.lock")
	release, err := Lock(path)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestLockExcludesAnotherProcess$")
	cmd.Env = append(os.Environ(), "FILELOCK_CHILD="+path)
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(700 * time.Millisecond)
	release()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v: %s", err, out.String())
	}
	if !strings.HasPrefix(out.String(), "waited ") || strings.HasPrefix(out.String(), "waited 0s") {
		t.Errorf("child did not wait for the lock: %q", out.String())
	}
	if _, ok, err := TryLock(path); err != nil || !ok {
		t.Errorf("TryLock after release: ok %v, %v", ok, err)
	}
}
