// Package all imports every family memfit ships, for their side effect: each registers itself with finetune.
// A program that trains, plans, evaluates or exports models (the finetune command, the benchmarks) imports it
// once: import _ "github.com/memfit/memfit/family/all".
package all

import (
	_ "github.com/memfit/memfit/family/bert"
	_ "github.com/memfit/memfit/family/gemma"
	_ "github.com/memfit/memfit/family/llama"
	_ "github.com/memfit/memfit/family/mistral"
	_ "github.com/memfit/memfit/family/phi3"
	_ "github.com/memfit/memfit/family/qwen"
	_ "github.com/memfit/memfit/family/vit"
)
