package data

import (
	"archive/tar"
	"bytes"
	"path/filepath"
	"testing"

	"github.com/memfit/memfit/internal/fuzzfile"
)

// Fuzz targets for every data format a user feeds memfit. Each must return an error or a result for any bytes,
// never panic, and never allocate by a size the input declares (CI runs them briefly under a memory cap:
// .ci/run, "fuzz").

func FuzzDecodeIDX(f *testing.F) {
	f.Add((&IDX{Dims: []int{2, 2, 2}, Data: make([]byte, 8)}).Encode())
	f.Add([]byte{0, 0, 8, 1, 0, 0, 0, 2, 7, 9})
	f.Fuzz(func(t *testing.T, raw []byte) {
		if x, err := DecodeIDX(raw); err == nil && len(x.Dims) == 3 {
			_, _ = IDXImages(x, &IDX{Dims: []int{x.Dims[0]}, Data: make([]byte, x.Dims[0])}, nil)
		}
	})
}

func FuzzInstructions(f *testing.F) {
	f.Add([]byte("{\"instruction\": \"a\", \"input\": \"\", \"output\": \"b\"}\n{\"instruction\": \"c\", \"output\": \"d\", \"status\": \"ok\"}\n"))
	f.Add([]byte("{oops\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		_, _ = ReadInstructions(fuzzfile.Write("x.jsonl", raw))
	})
}

func FuzzDocuments(f *testing.F) {
	f.Add("Once upon a time.\n\nThe end.\n")
	f.Fuzz(func(t *testing.T, text string) {
		docs := Documents(text)
		var seqs [][]int
		for _, d := range docs {
			seqs = append(seqs, []int{len(d) % 97, 3})
		}
		_ = Pack(seqs, 1, 4)
	})
}

func FuzzPreprocessor(f *testing.F) {
	f.Add([]byte(`{"image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "size": {"height": 32, "width": 32}, "do_resize": true, "do_rescale": true, "do_normalize": true}`))
	f.Add([]byte(`{"size": 99999999999}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		_, _ = ReadPreprocessor(filepath.Dir(fuzzfile.Write("pre/preprocessor_config.json", raw)), 3, 32)
	})
}

func FuzzGLUE(f *testing.F) {
	f.Add("sentence\tlabel\nit is good\t1\nit is bad\t0\n", "sst2")
	f.Add("gj04\t1\t\tThe boy ran.\n", "cola")
	f.Add("index\tsentence1\tsentence2\tlabel\n0\tA.\tB.\tentailment\n", "rte")
	f.Fuzz(func(t *testing.T, text, task string) {
		info, err := GLUETask(task)
		if err != nil {
			return
		}
		var file string
		for _, n := range []string{"train.tsv", "val.tsv", "msr_paraphrase_train.txt"} {
			file = fuzzfile.Write(filepath.Join("glue", info.Dir, n), []byte(text))
		}
		_, _ = ReadGLUE(filepath.Dir(filepath.Dir(file)), task, "train") // the glue root

	})
}

func FuzzImageTar(f *testing.F) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, n := range []string{"train/a/1.png", "train/b/2.png"} {
		tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: 4})
		tw.Write([]byte("\x89PNG"))
	}
	tw.Close()
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, raw []byte) {
		src, err := ImageTar(fuzzfile.Write("x.tar", raw), "train")
		if err != nil || src.Len() == 0 {
			return
		}
		_, _ = src.Image(0)
	})
}
