package cli

import "io"

// SetTerminalColumnsForTest makes every writer a terminal cols wide (0: none is) until the returned function
// restores the real check.
func SetTerminalColumnsForTest(cols int) (restore func()) {
	old := terminalColumns
	terminalColumns = func(io.Writer) int { return cols }
	return func() { terminalColumns = old }
}

// CountProgressForTest is countProgress.
var CountProgressForTest = countProgress

// ResultPathForTest is where eval mmlu writes the results of the adapter (or model) at path without --out.
func ResultPathForTest(path string) string { return resultPath("", "mmlu", "model", path, nil, nil) }

// ModuleVersionForTest is moduleVersion.
var ModuleVersionForTest = moduleVersion
