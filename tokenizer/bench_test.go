package tokenizer

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/memfit/memfit/internal/golden"
)

// BenchmarkEncodeLlama3 encodes War and Peace (3.2 MB of English) with the Llama-3 tokenizer on one goroutine;
// b.SetBytes makes `go test -bench` print MB/s. The word cache starts empty every iteration.
func BenchmarkEncodeLlama3(b *testing.B) {
	dir := golden.SharedDir(b)
	text, err := os.ReadFile(filepath.Join(dir, "text", "war-and-peace.txt"))
	if err != nil {
		b.Skip(err)
	}
	tok, err := Load(filepath.Join(dir, "tokenizers", "llama3"))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(text)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		tok.model.(*bpe).cache = cache{}
		if ids := tok.Encode(string(text), false); len(ids) == 0 {
			b.Fatal("no ids")
		}
	}
}
