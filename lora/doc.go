// Package lora will hold the adapters: the interface a custom adapter implements, LoRA and LoRA-FA (issue 4).
//
// It reserves its place in memfit's layout; nothing in it is usable yet.
package lora
