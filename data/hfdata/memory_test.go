package hfdata

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parquet-go/parquet-go"
)

// writeManyRowGroups writes a parquet file of groups row groups of rows rows, each row a text of size random
// letters, uncompressed (so the file's size is its data's), and returns its path and size.
func writeManyRowGroups(t testing.TB, groups, rows, size int) (string, int64) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "many.parquet")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	type textRow struct {
		Text string `parquet:"text"`
	}
	w := parquet.NewGenericWriter[textRow](f, parquet.Compression(&parquet.Uncompressed), parquet.PageBufferSize(256<<10))
	r := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, size)
	batch := make([]textRow, rows)
	for g := 0; g < groups; g++ {
		for i := range batch {
			for j := range buf {
				buf[j] = byte('a' + r.IntN(26))
			}
			batch[i].Text = string(buf)
		}
		if _, err := w.Write(batch); err != nil {
			t.Fatal(err)
		}
		if err := w.Flush(); err != nil { // one row group
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	st, _ := f.Stat()
	f.Close()
	return path, st.Size()
}

// peakHeap runs fn and returns the largest live heap seen above the heap before it (sampled every
// millisecond, after a collection at the start).
func peakHeap(fn func()) uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	var peak atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var m runtime.MemStats
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
				runtime.ReadMemStats(&m)
				if m.HeapAlloc > base && m.HeapAlloc-base > peak.Load() {
					peak.Store(m.HeapAlloc - base)
				}
			}
		}
	}()
	fn()
	close(stop)
	wg.Wait()
	return peak.Load()
}

// TestMemoryBoundedOverRowGroups reads files of 32 and 256 row groups (4 and 33 MiB) and checks that the live
// heap (measured after a collection every 64 rows, twice a row group) does not grow with the file: the reader
// streams row group by row group, a few rows at a time.
func TestMemoryBoundedOverRowGroups(t *testing.T) {
	if testing.Short() {
		t.Skip("writes a 33 MiB file")
	}
	measure := func(groups int) (peak uint64, size int64) {
		path, size := writeManyRowGroups(t, groups, 128, 1024)
		d, err := Open(path, "", "")
		if err != nil {
			t.Fatal(err)
		}
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		base := ms.HeapAlloc
		rows := 0
		_, err = d.each([]spec{{name: "text", kind: kString}}, func(_ string, r row) error {
			if s, ok := r[0].(string); ok && len(s) == 1024 {
				rows++
			}
			if rows%64 == 32 {
				runtime.GC()
				runtime.ReadMemStats(&ms)
				if ms.HeapAlloc > base {
					peak = max(peak, ms.HeapAlloc-base)
				}
			}
			return nil
		})
		if err != nil || rows != groups*128 {
			t.Fatalf("%d rows, %v", rows, err)
		}
		t.Logf("file %.1f MiB in %d row groups: live heap above the start at most %.2f MiB", float64(size)/(1<<20), groups, float64(peak)/(1<<20))
		return peak, size
	}
	small, _ := measure(32)
	large, size := measure(256)
	if large > small+(1<<20) || large > uint64(size)/16 {
		t.Errorf("the live heap grew from %.1f MiB (32 row groups) to %.1f MiB (256 row groups, %.1f MiB): the reader does not stream",
			float64(small)/(1<<20), float64(large)/(1<<20), float64(size)/(1<<20))
	}
}

// BenchmarkReadManyRowGroups reads a file of 512 row groups of 128 rows of 1 KiB texts (64 MiB) and reports the
// read rate and the peak heap above the start, which stays at a few row groups whatever the file's size.
func BenchmarkReadManyRowGroups(b *testing.B) {
	path, size := writeManyRowGroups(b, 512, 128, 1024)
	d, err := Open(path, "", "")
	if err != nil {
		b.Fatal(err)
	}
	defer debug.SetGCPercent(debug.SetGCPercent(10))
	b.SetBytes(size)
	b.ResetTimer()
	var peak uint64
	for range b.N {
		peak = max(peak, peakHeap(func() {
			if _, err := d.each([]spec{{name: "text", kind: kString}}, func(string, row) error { return nil }); err != nil {
				b.Fatal(err)
			}
		}))
	}
	b.ReportMetric(float64(size)/(1<<20), "file-MiB")
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MiB")
}
