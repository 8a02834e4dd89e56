// Package engine is memfit's thin layer over GoMLX: it chooses the backend, lets any graph node carry its own
// backward function, and provides the matmul, linear and slice builders whose gradients stay cheap on every
// backend.
//
// # Custom gradients
//
// Any node can carry its own VJP (SetVJP, PassThrough), and engine.Gradient applies it. Gradient is graph.Gradient's
// reverse-mode algorithm (GoMLX v0.28.16) run by engine: it visits the nodes in the same order, calls the same
// gradient functions and accumulates in the same order, and for each node takes, in order, the node's GoMLX
// custom gradient (graph.IdentityWithCustomGradient), the VJP set with SetVJP, and GoMLX's own function from
// graph.VJPRegistration, which it only reads. On a graph without SetVJP it builds, node for node, the backward
// graph.Gradient builds (TestGradientIsGoMLXsOnPlainGraphs). engine leaves GoMLX's global state alone: another
// package of the same program calling graph.Gradient gets GoMLX's gradients, and so does graph.Gradient on a graph
// memfit built (TestVJPRegistrationIsGoMLXs, TestGraphGradientIgnoresMemfitVJPs). Up to issue 29 engine instead
// wrapped every entry of graph.VJPRegistration at initialisation, which changed graph.Gradient for every user of
// GoMLX in a program that imported memfit.
//
// GoMLX's public API has no way to give an existing node a multi-input gradient through graph.Gradient itself: a
// node's custom gradient (Node.customVJP) is set only by graph.IdentityWithCustomGradient, on a new one-input
// Identity node, and a fused op's decomposed alternate (Node.vjpAlternateOutputs) only by
// graph.InternalFusedOpCaller, on the node its fused function returns, pointing at nodes built before it. Three
// constructions through them were measured on a two-input op (docs/memory-saving.md has the figures): an alternate
// attached to an existing node is never differentiated (the alternate is newer than the node, and the
// reverse pass visits nodes newest first: the gradients came out zero); an InternalFusedOpCaller whose fused function
// builds the op and whose alternate is the op rebuilt on custom-gradient identities of its inputs gives the right
// gradients with the same forward and saved tensors, but needs every custom op built through it (SetVJP on an
// existing node cannot work), builds each op twice, and under GOMLX_FUSION=0 returns the alternate, so the
// forward runs the identities (copies on the pure-Go backend) and the backward keeps them; identities tied to the
// output by a zero (the construction Checkpoint uses for its own purpose) add reductions to the forward pass. None
// can carry the kind of a node whose gradient is GoMLX's (the attribution memory.Saved reports). An exported setter
// of a node's custom VJP (a Node.SetCustomGradient(VJP), or IdentityWithCustomGradient for several inputs and
// outputs) would let GoMLX's own graph.Gradient apply memfit's VJPs.
//
// What engine's reverse pass cannot reproduce is what graph.Gradient reads from unexported node fields: a fused op's
// decomposed alternate (graph.Softmax, nn.Dense, nn.LayerNorm and GoMLX's activation layers when the backend fuses
// them) and GoMLX's own gradient checkpointing (Node.Checkpoint). Gradient differentiates a fused op that has a
// registered VJP with it rather than its alternate (the same gradient, possibly other saved tensors), refuses one
// that has none (FusedSoftmax, FusedLayerNorm: build it with GOMLX_FUSION=0, with memfit's builder, or give it a
// VJP), and keeps the forward values of Node.Checkpoint blocks rather than recomputing them. memfit's graphs use
// none of these: its fused ops carry their own VJPs, the flash attention's fused op has a registered VJP and no
// alternate, and its gradient checkpointing is Checkpoint. (Two facts GoMLX does not export are read through its
// public API: which output of a multi-output node a split node selects, from the split node's backend value, and
// the shapes of a multi-output node's outputs, from its split nodes.)
//
// The side table that maps a node to its VJP holds only weak pointers: the VJP itself is kept alive by a hidden,
// never-executed identity node in the same graph (built with graph.IdentityWithCustomGradient), so a VJP closure
// that captures forward nodes does not keep its graph alive, and the table entry is removed by a runtime cleanup
// once the node is collected. Lookups take a read lock, so graphs may be built and differentiated concurrently.
//
// Every custom VJP also carries a Kind (linear, norm, activation, attention, other), and SetKind tags a node whose
// gradient stays GoMLX's. Gradient records which backward nodes each node's VJP created, so the memory package can
// say which op kind reads each saved tensor.
//
// # Builders
//
// GoMLX's own DotGeneral gradient materialises an [M,N,K] product, and its Slice gradient needs Pad, which the
// pure-Go backend lacks. DotGeneral, Linear and Slice here carry matmul-based and concatenate-based VJPs
// instead; all memfit layers use them.
//
// # Order is data
//
// memfit's memory savings depend on when ops run: a recomputation must run in the backward pass, next to the
// backward function that reads it, and a compressed residual (2-bit activation codes, Mesa's int8 copy) must be
// made in the forward pass, so that the float tensor it replaces dies there. The pure-Go backend runs ops in
// creation order (GoOptions), so creating them in the right place is enough there. XLA ignores creation order:
// its GPU scheduler picks whichever of several orders has the lowest simulated peak, and its fusion pass decides
// by run time alone, so an op whose inputs are all forward tensors may run during the forward pass and hold its
// result until the backward, and an op whose only reader is in the backward may run there and keep its input
// alive. An optimization barrier orders nothing by itself; it orders what goes through it (JAX's
// lax.optimization_barrier: "all operands must be used through the barrier"). So engine states the order as data
// dependences, in three places (docs/memory-saving.md, "Order is data"):
//
//   - Recompute ties its barrier to the cotangent of the backward function that calls it: the gradient arriving
//     at that node is one more operand of the barrier, so nothing recomputed can start before the backward pass
//     reaches the node (GoMLX's own rematerialisation does this with its trigger; JAX's remat and torch_xla's
//     checkpoint put the incoming gradient in the same barrier). QLoRA's dequantised weights, the attention's
//     recomputed scores and probabilities, the loss's recomputed exponentials, LLaMA's rebuilt gated product,
//     Mesa's dequantised copies and the exact GELU/SiLU's recomputed gates all go through Recompute or Fresh.
//   - Checkpoint puts the block output's gradient into the barrier over the block's inputs (its own barrier).
//   - Pin puts a forward tensor and the compressed residuals made from it behind one barrier, the forward
//     continuing from the barrier's copy: the compression must happen before anything downstream runs, and the
//     float input can die in the forward pass.
//
// With ties on, every barrier engine builds in a differentiated step has at least two operands (go-xla drops
// single-operand barriers on XLA's CPU compiler).
//
// On the pure-Go backend none of this costs anything: its barrier is one identity per operand that moves an
// operand it owns (the barrier is the operand's last reader) and copies only one still in use, and an output
// nothing reads is never executed. The tie's output is never read, the pinned tensors have no other reader, so
// the saved activations (memory.Saved) and the simulated step peak stay what they were, and the losses and
// gradients bit for bit (internal/ordertest's TestTiesChangeNothingOnGo; docs/benchmarks/order-ties-cpu).
// memory.CheckOrder checks the three rules on a differentiated graph.
//
// TiesEnv=0 builds the graphs without any of it (as memfit did up to issue 35), for the GPU's before/after check.
package engine
