// Package memory says what a training step keeps and how much memory it peaks at. It is the only place in
// memfit that computes bytes.
//
// Two figures, always labelled with how they were obtained:
//
//   - Saved activations (exact): a walk over the differentiated training graph that lists every forward tensor
//     the backward pass reads, with its bytes, shape, dtype and the kind of op that reads it. This is what the
//     step must hold between forward and backward, independent of the backend.
//   - Peak: on the pure-Go backend (GoMLX's "go" backend, github.com/gomlx/compute/gobackend) either a real
//     count of the bytes held by the executor's buffer pool (only in builds that carry the counter, see
//     tools/peakmem) or, in the shipped binary, a liveness simulation over the executor's real op order and
//     buffer rules (an estimate, exact when large matrix products run on one worker, else an upper bound); on
//     XLA the compiled program's argument, output and temporary sizes.
//
// The simulation reads the Go backend's unexported executor state and copies its buffer rules; both belong to
// one compute version, v0.1.14, and live in gobackend_v0_1_14.go. A binary built against another compute
// version gets ErrComputeVersion, and its peaks are reported as unavailable ("modelled for compute v0.1.14,
// running vX"), never as a number: see UnavailablePeak and FormatPeak.
package memory
