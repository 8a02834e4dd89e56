// Package llama will hold the LLaMA-family causal-LM and sequence-classification graphs built from Hugging Face checkpoints (issue 3).
//
// It reserves its place in memfit's layout; nothing in it is usable yet.
package llama
