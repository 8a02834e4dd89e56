package finetune

import (
	"fmt"
	"io"
	"os"
)

// MetricsLog appends JSONL lines to a run's metrics file, each line whole or not at all: when a write fails
// part-way (a full disk, a file-size limit) the file is cut back to where the line began, so the log never holds
// a torn line for the next line to glue onto. A kill mid-write can still leave one; TrimMetrics drops it when the
// run resumes.
type MetricsLog struct {
	f    AppendFile
	path string
	size int64
}

// AppendFile is what MetricsLog needs of its file: an *os.File opened for appending (tests give it a disk that
// fills up).
type AppendFile interface {
	io.Writer
	Truncate(size int64) error
	Stat() (os.FileInfo, error)
	Close() error
}

// OpenMetrics opens (creating it if needed) the metrics log at path for appending.
func OpenMetrics(path string) (*MetricsLog, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	return NewMetricsLog(f, path)
}

// NewMetricsLog returns a MetricsLog appending to f (named path in errors), which must be opened for appending.
func NewMetricsLog(f AppendFile, path string) (*MetricsLog, error) {
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &MetricsLog{f: f, path: path, size: st.Size()}, nil
}

// Write appends p, which should be one or more whole lines. On failure nothing of p stays in the file.
func (m *MetricsLog) Write(p []byte) (int, error) {
	n, err := m.f.Write(p)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	if err != nil {
		if n > 0 {
			if terr := m.f.Truncate(m.size); terr != nil {
				return 0, fmt.Errorf("writing %s: %w (and cutting the torn line back failed: %v)", m.path, err, terr)
			}
		}
		return 0, fmt.Errorf("writing %s: %w", m.path, err)
	}
	m.size += int64(n)
	return n, nil
}

// Close closes the file.
func (m *MetricsLog) Close() error { return m.f.Close() }
