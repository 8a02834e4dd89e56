//go:build !unix

package finetune

import "os"

// Without flock (Windows, Plan 9, wasm) the folder is not locked: a second process is not detected.
func lockFile(*os.File) error { return nil }

func unlockFile(*os.File) {}
