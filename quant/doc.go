// Package quant will hold NF4 base weights for QLoRA and Mesa-style int8 activation storage (issue 7).
//
// It reserves its place in memfit's layout; nothing in it is usable yet.
package quant
