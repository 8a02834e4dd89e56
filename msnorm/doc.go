// Package msnorm implements memory-sharing normalisation (MS-LN and MS-RMSNorm) and the plain LayerNorm and
// RMSNorm baselines.
//
// A memory-sharing norm has no affine parameters: it returns z = (x - mean) * rstd (LayerNorm) or z = x * rstd
// (RMSNorm), and its backward reads only z and rstd (one float per row). The affine gamma and beta are folded
// into the following linear layer on the host (Fold), so that linear layer consumes z directly and keeps the very
// same tensor for its weight gradient: the norm and the linear share one saved activation. The gradient is exact,
// not an approximation. Unfold undoes the folding for export.
//
// LayerNorm and RMSNorm (with affine) are the baselines; their backward also keeps a single tensor (z) for the
// norm and affine together, where GoMLX's own gradients keep three.
package msnorm
