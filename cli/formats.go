package cli

// The finetune command reads PEFT adapters of every format memfit has: LoRA (package lora), DoRA (a LoRA config
// with use_dora true) and (IA)³ (peft_type IA3), whose formats their packages register when imported.
import (
	_ "github.com/memfit/memfit/examples/dora"
	_ "github.com/memfit/memfit/examples/ia3"
)
