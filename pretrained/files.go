// Package pretrained holds the small pretrained checkpoints and the demo data that memfit ships (no real ViT or
// LLaMA checkpoint is reachable from memfit's build machines, so memfit makes its own from real data), and the
// code that made them. README.md in this folder records the commands, data and figures.
package pretrained

import (
	"bufio"

	"github.com/memfit/memfit/safetensors"
)

// writeFile writes data to path atomically (temporary file, then rename).
func writeFile(path string, data []byte) error {
	return safetensors.WriteAtomic(path, func(w *bufio.Writer) error {
		_, err := w.Write(data)
		return err
	})
}
