// Package evals will hold MMLU 5-shot and GLUE evaluation (issue 8).
//
// It reserves its place in memfit's layout; nothing in it is usable yet.
package evals
