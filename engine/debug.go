package engine

import "os"

func debugEnabled() bool { return os.Getenv("MEMFIT_DEBUG") != "" }
