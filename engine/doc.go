// Package engine is memfit's thin layer over GoMLX: it chooses the backend, lets any graph node carry its own
// backward function, and provides the matmul, linear and slice builders whose gradients stay cheap on every
// backend.
//
// # Custom gradients
//
// GoMLX v0.26.0 computes gradients through graph.VJPRegistration, an exported map from node type to gradient
// function. At package initialisation engine wraps every entry once (and adds one for node types that have
// none), so that any node can carry its own VJP through SetVJP. The wrapped functions first look the node up in a
// side table; nodes without an entry get GoMLX's own gradient. No fork of GoMLX is needed.
//
// The side table holds only weak pointers: the VJP itself is kept alive by a hidden, never-executed identity
// node in the same graph (built with graph.IdentityWithCustomGradient), so a VJP closure that captures forward
// nodes does not keep its graph alive, and the table entry is removed by a runtime cleanup once the node is
// collected. Lookups take a read lock, so graphs may be built and differentiated concurrently.
//
// Every custom VJP also carries a Kind (linear, norm, activation, attention, other). Gradient records which
// backward nodes each VJP created, so the memory package can say which op kind reads each saved tensor.
//
// # Builders
//
// GoMLX's own DotGeneral gradient materialises an [M,N,K] product, and its Slice gradient needs Pad, which the
// pure-Go backend lacks. DotGeneral, Linear and Slice here carry matmul-based and concatenate-based VJPs
// instead; all memfit layers use them.
package engine
