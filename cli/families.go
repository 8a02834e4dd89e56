package cli

// The families the finetune command trains beyond those finetune registers itself: each registers from its
// package's init.
import _ "github.com/memfit/memfit/family/bert"
