package models

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/gomlx/gomlx/core/graph"

	"github.com/memfit/memfit/attention"
	"github.com/memfit/memfit/quant"
)

// Options choose the memory-saving modes a model is built in, the same for every model package (models/vit,
// models/decoder): the same checkpoint runs in every combination.
type Options struct {
	// ApproxActivation uses the model's 2-bit-backward activation (ReGELU2 / ReSiLU2) in its MLPs.
	ApproxActivation bool
	// MSNorm uses MS-LN / MS-RMSNorm: every norm whose output feeds only linear layers is folded into them at
	// load time (the model's Folds).
	MSNorm bool
	// Attention is the attention kind.
	Attention attention.Kind
	// GradCheckpoint recomputes each transformer block in the backward pass instead of keeping its activations
	// (gradient checkpointing per block; only the blocks' inputs are kept).
	GradCheckpoint bool
	// Blocks, when not nil, is a per-block memory plan (one mode per block) that replaces ApproxActivation,
	// GradCheckpoint and the step's Mesa kinds inside the blocks.
	Blocks []BlockMode
}

// BlockMode is the memory plan of one transformer block: the memory-saving options applied to it alone. A
// model's options hold one per block (a per-block plan) or none (the model-wide options apply to every block).
type BlockMode struct {
	// ApproxActivation uses the 2-bit-backward activation (ReGELU2 / ReSiLU2) in the block's MLP.
	ApproxActivation bool
	// GradCheckpoint recomputes the block in the backward pass instead of keeping its activations.
	GradCheckpoint bool
	// Mesa lists the saved-activation kinds the block stores as int8 (quant.MesaKinds), sorted.
	Mesa []string
}

// String writes the mode as a plan entry: options joined by "+" (approx-act, grad-ckpt, mesa-<kind>), or "plain".
func (m BlockMode) String() string {
	var parts []string
	if m.ApproxActivation {
		parts = append(parts, "approx-act")
	}
	if m.GradCheckpoint {
		parts = append(parts, "grad-ckpt")
	}
	for _, k := range m.Mesa {
		parts = append(parts, "mesa-"+k)
	}
	if len(parts) == 0 {
		return "plain"
	}
	return strings.Join(parts, "+")
}

// ParseBlockPlan reads a per-block memory plan for a model of the given number of blocks: comma-separated
// entries in block order, each a mode ("plain", or options joined by "+": approx-act, grad-ckpt, mesa-<kind> for
// a kind of quant.MesaKinds, mesa for all of them) optionally followed by "*N" for N blocks in a row, e.g.
// "grad-ckpt*4,approx-act+mesa-softmax*8". The entries must cover the blocks exactly. An empty plan is nil.
func ParseBlockPlan(plan string, blocks int) ([]BlockMode, error) {
	out, err := BlockPlanModes(plan)
	if err != nil || out == nil {
		return nil, err
	}
	if len(out) != blocks {
		return nil, fmt.Errorf("block plan %q covers %d blocks, the model has %d", plan, len(out), blocks)
	}
	return out, nil
}

// BlockPlanModes reads a plan's modes without a model to check their count against (ParseBlockPlan does).
func BlockPlanModes(plan string) ([]BlockMode, error) {
	if strings.TrimSpace(plan) == "" {
		return nil, nil
	}
	var out []BlockMode
	for _, entry := range strings.Split(plan, ",") {
		entry = strings.TrimSpace(entry)
		spec, count := entry, 1
		if i := strings.LastIndex(entry, "*"); i >= 0 {
			n, err := strconv.Atoi(strings.TrimSpace(entry[i+1:]))
			if err != nil || n <= 0 || n > 1<<16 {
				return nil, fmt.Errorf("block plan entry %q: the count after * must be a positive number", entry)
			}
			spec, count = strings.TrimSpace(entry[:i]), n
		}
		mode, err := parseBlockMode(spec)
		if err != nil {
			return nil, fmt.Errorf("block plan entry %q: %w", entry, err)
		}
		if len(out)+count > 1<<16 {
			return nil, fmt.Errorf("block plan %q covers more than %d blocks", plan, 1<<16)
		}
		for range count {
			out = append(out, mode)
		}
	}
	return out, nil
}

func parseBlockMode(spec string) (BlockMode, error) {
	var m BlockMode
	if spec == "plain" {
		return m, nil
	}
	if spec == "" {
		return m, fmt.Errorf("empty mode (use plain, approx-act, grad-ckpt or mesa-<kind>, joined by +)")
	}
	for _, opt := range strings.Split(spec, "+") {
		switch opt = strings.TrimSpace(opt); {
		case opt == "approx-act":
			m.ApproxActivation = true
		case opt == "grad-ckpt":
			m.GradCheckpoint = true
		case opt == "mesa":
			m.Mesa = append(m.Mesa, quant.MesaKinds...)
		case strings.HasPrefix(opt, "mesa-"):
			kinds, err := quant.ParseMesa([]string{strings.TrimPrefix(opt, "mesa-")})
			if err != nil {
				return m, err
			}
			m.Mesa = append(m.Mesa, kinds...)
		default:
			return m, fmt.Errorf("unknown option %q (use plain, approx-act, grad-ckpt, mesa or mesa-<kind>, joined by +)", opt)
		}
	}
	slices.Sort(m.Mesa)
	m.Mesa = slices.Compact(m.Mesa)
	if m.GradCheckpoint && len(m.Mesa) > 0 {
		return m, fmt.Errorf("grad-ckpt keeps only the block's input, so mesa has nothing to store in it")
	}
	return m, nil
}

// FormatBlockPlan writes modes as the shortest plan ParseBlockPlan reads back (runs of equal modes as "*N").
func FormatBlockPlan(modes []BlockMode) string {
	var parts []string
	for i := 0; i < len(modes); {
		j := i + 1
		for j < len(modes) && modes[j].String() == modes[i].String() {
			j++
		}
		if j-i == 1 {
			parts = append(parts, modes[i].String())
		} else {
			parts = append(parts, fmt.Sprintf("%s*%d", modes[i], j-i))
		}
		i = j
	}
	return strings.Join(parts, ",")
}

// Mode returns block i's mode: plan[i] with perBlock true when a per-block plan is given, else the model-wide
// options (whose Mesa is the step's own).
func Mode(plan []BlockMode, i int, approx, ckpt bool) (mode BlockMode, perBlock bool) {
	if plan != nil {
		return plan[i], true
	}
	return BlockMode{ApproxActivation: approx, GradCheckpoint: ckpt}, false
}

// ApplyBlock builds one transformer block with its mode: under its own Mesa kinds (a view of b's Mesa, when a
// per-block plan gives the block's mode) and checkpointed when the mode says so. perBlock is false when mode is
// the model-wide options, whose Mesa is b's as it is.
func (b Bound) ApplyBlock(prefix string, x *graph.Node, mode BlockMode, perBlock bool, block func(b Bound, x *graph.Node) *graph.Node) *graph.Node {
	return b.ApplyBlockOver([]string{prefix}, x, mode, perBlock, block)
}

// ApplyBlockOver is ApplyBlock for a block whose parameters are those whose names start with any of prefixes (see
// CheckpointedOver).
func (b Bound) ApplyBlockOver(prefixes []string, x *graph.Node, mode BlockMode, perBlock bool, block func(b Bound, x *graph.Node) *graph.Node) *graph.Node {
	if perBlock {
		b.Mesa = b.Mesa.Only(mode.Mesa)
	}
	if mode.GradCheckpoint {
		return b.CheckpointedOver(prefixes, x, block)
	}
	return block(b, x)
}
