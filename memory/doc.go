// Package memory says what a training step keeps and how much memory it peaks at. It is the only place in
// memfit that computes bytes.
//
// Two figures, always labelled with how they were obtained:
//
//   - Saved activations (exact): a walk over the differentiated training graph that lists every forward tensor
//     the backward pass reads, with its bytes, shape, dtype and the kind of op that reads it. This is what the
//     step must hold between forward and backward, independent of the backend.
//   - Peak: on the pure-Go backend (GoMLX v0.28's "go" backend, github.com/gomlx/compute/gobackend) either a real
//     count of the bytes held by the executor's buffer pool (only in builds that carry the counter, see
//     tools/peakmem) or, in the shipped binary, a liveness simulation over the executor's real op order and
//     buffer rules (an estimate, exact when large matrix products run on one worker, else an upper bound); on
//     XLA the compiled program's argument, output and temporary sizes.
package memory
