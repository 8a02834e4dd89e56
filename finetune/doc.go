// Package finetune will hold the training step and loop: loss, optimizer, schedules, accumulation, checkpoints, resume and export (issue 4).
//
// It reserves its place in memfit's layout; nothing in it is usable yet.
package finetune
