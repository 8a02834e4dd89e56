#!/usr/bin/env bash
# Issue 35's memory-mode check on a GPU: does XLA's peak follow memfit's accounting in every memory mode? Writes
# DEST/memory-modes.json (one row per model x method x mode: device_peak_bytes, compiled_peak_bytes,
# planned_bytes, step_seconds; null where a figure was not obtained), memory-modes.md (the tables and issue 35's
# targets, PASS/FAIL/SKIP), memory-modes-checks.tsv, and every run's JSON and log under DEST/modes/:
#
#   MEMFIT_BIN=bin/finetune-xla bash bench/gpu/memory_modes.sh DEST            # on the GPU machine
#   bash bench/gpu/memory_modes.sh --dry-run DEST                              # print the commands only
#   MEMMODES_BACKEND=go bash bench/gpu/memory_modes.sh /tmp/mm                 # the whole script on the CPU, tiny models
#
# bench/gpu/verify.sh runs it as its stage m (bash bench/gpu/verify.sh --only memory). Phases, each command under
# `timeout` and skipped (said in the log) when the budget (MEMMODES_BUDGET_S, default 450 s) has too little left;
# MEMMODES_PHASES chooses them and their order (default "ab compile steps qlora pytorch dumps": the before/after
# first, then the figures the targets need). Times are estimates for an H100 (XLA compiles llama-1b's 22-block
# gradient step in about 20 s, docs/benchmarks/plancheck-h200) until a run says otherwise:
#   ab       finetune memory --json --beside go (compile only, no weights) with the ordering ties off and on
#            (MEMFIT_XLA_TIES=0/1) on models cut to MEMMODES_AB_BLOCKS (4) blocks: llama-1b LoRA all-linear
#            float32 2 x 512 (plain, approx-act, approx-act+mesa, grad-ckpt, approx-act+ms-norm), ViT-B/16 LoRA
#            q,v bfloat16 batch 64 flash (plain, approx-act, ms-norm, approx-act+ms-norm), and LLaMA-7B QLoRA
#            all-linear bfloat16 4 x 512 flash (plain, approx-act+ms-norm) cut to MEMMODES_AB_QLORA_BLOCKS (2):
#            issue 35's before/after. About 2 minutes.
#   compile  the same plans, ties on, whole models: llama-1b's five modes, ViT-B/16 LoRA all-linear and q,v in
#            four: XLA's compiled peak (which predicted the H200's device peak to the byte,
#            docs/benchmarks/plancheck-h200) beside the pure-Go planner's total. About 3 minutes.
#   steps    finetune bench step, MEMMODES_STEPS (5) timed steps, one process each (the device peak is the
#            process's): ViT-B/16 all-linear plain and approx-act+ms-norm, llama-1b plain, grad-ckpt and
#            approx-act+mesa, ViT-B/16 q,v plain and approx-act+ms-norm. Random bfloat16 weights written once to
#            a work folder. About 3 minutes.
#   qlora    the LLaMA-7B QLoRA plans, ties on, whole model (32 blocks), compile only: 7B random weights would take
#            minutes to write and quantise, and XLA's compiled peak stands for the device's. About 2 minutes.
#   pytorch  bench/pytorch/peft_compare.py for the LLaMA cases: llama-1b LoRA all-linear float32 2 x 512 (plain and
#            gradient checkpointing), llama-7b LoRA all-linear bfloat16 4 x 512 (plain and approx-act+ms-norm),
#            standing in for QLoRA (the GPU machine has no bitsandbytes) and named lora-bf16-for-qlora. About 3
#            minutes.
#   dumps    for each row that misses a memory target (finetune bench memory-modes --missing; at most
#            MEMMODES_MAX_DUMPS, 3), its plan again with XLA_FLAGS=--xla_dump_to, and finetune bench xla-digest:
#            the largest buffers live at XLA's peak, by the op that made them (modes/digest__*.txt).
# All of it takes about 15 minutes, more than one 10-minute call: a session with one device call runs the default
# order under the budget (ab, compile, and what fits); docs/gpu.md gives the two-call split. Results from several
# calls into the same DEST add up: each call rewrites memory-modes.json from every file in DEST/modes.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
T0=$SECONDS

DRY=0
DEST=""
for arg in "$@"; do
	case "$arg" in
	--dry-run) DRY=1 ;;
	-h | --help)
		sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	-*)
		echo "memory_modes.sh: unknown flag $arg" >&2
		exit 2
		;;
	*) DEST=$arg ;;
	esac
done
[ -n "$DEST" ] || {
	echo "usage: memory_modes.sh [--dry-run] DEST" >&2
	exit 2
}

BIN=${MEMFIT_BIN:-bin/finetune-xla}
case "$BIN" in /*) ;; *) BIN=$ROOT/$BIN ;; esac
PY=${PYTHON:-python3}
BACKEND=${MEMMODES_BACKEND:-xla:cuda}
BUDGET=${MEMMODES_BUDGET_S:-450}
STEPS=${MEMMODES_STEPS:-5}
AB_BLOCKS=${MEMMODES_AB_BLOCKS:-4}
PHASES=${MEMMODES_PHASES:-ab compile steps qlora pytorch dumps}
AB_QLORA_BLOCKS=${MEMMODES_AB_QLORA_BLOCKS:-2}
export GOMLX_NO_AUTO_INSTALL=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

# The models: the presets on the GPU, memfit's tiny ones on the pure-Go backend (a CPU run of the script).
VIT=vit-b16 LLAMA1B=llama-1b LLAMA7B=llama-7b BF16=bfloat16 FLASH=flash
LLAMA_SHAPE=(--batch-size 2 --seq-len 512) VIT_BATCH=64 QLORA_SHAPE=(--batch-size 4 --seq-len 512)
if [ "$BACKEND" = go ]; then
	VIT=vit:tiny LLAMA1B=llama:tiny LLAMA7B=llama:tiny BF16=float32 FLASH=memory-efficient
	LLAMA_SHAPE=(--batch-size 2 --seq-len 32) VIT_BATCH=4 QLORA_SHAPE=(--batch-size 2 --seq-len 32)
fi

mkdir -p "$DEST/modes" || exit 2
DEST=$(cd "$DEST" && pwd)
OUT=$DEST/modes
WORK=${MEMMODES_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/memfit-modes.XXXXXX")}
[ -z "${MEMMODES_WORK:-}" ] && trap 'rm -rf "$WORK"' EXIT

left() { echo $((BUDGET - (SECONDS - T0))); }
log() { printf '[%4d s] %s\n' "$((SECONDS - T0))" "$*"; }

# run WANT NAME [--stdout FILE] CMD...: runs CMD (its output in $OUT/NAME.log, its standard output in FILE if given)
# under timeout, at most WANT seconds and what is left of the budget less 15 s; skipped when under 20 s would be
# left. With --dry-run it prints CMD instead.
run() {
	local want=$1 name=$2 stdout="" t rc
	shift 2
	if [ "$1" = --stdout ]; then
		stdout=$2
		shift 2
	fi
	if [ "$DRY" = 1 ]; then
		printf '%q ' "$@"
		[ -n "$stdout" ] && printf '> %q' "$stdout"
		echo
		return 0
	fi
	t=$(($(left) - 15))
	((t > want)) && t=$want
	if ((t < 20)); then
		log "SKIP $name: $(left) s left"
		return 3
	fi
	echo "+ $*" > "$OUT/$name.log"
	if [ -n "$stdout" ]; then
		timeout -k 10 "$t" "$@" > "$stdout" 2>> "$OUT/$name.log"
	else
		timeout -k 10 "$t" "$@" >> "$OUT/$name.log" 2>&1
	fi
	rc=$?
	[ $rc != 0 ] && [ -n "$stdout" ] && rm -f "$stdout" # no half-written result
	case $rc in
	0) log "done $name" ;;
	124 | 137) log "TIMEOUT $name after $t s (see modes/$name.log)" ;;
	*) log "FAIL $name: exit $rc (see modes/$name.log: $(tail -1 "$OUT/$name.log" | cut -c1-160))" ;;
	esac
	return $rc
}

# plan NAME TIES MODEL BLOCKS VARIANTS ARGS...: finetune memory --json --beside go into $OUT/NAME.json. BLOCKS > 0
# plans a copy of MODEL's config cut to that many blocks (only config.json is read).
plan() {
	local name=$1 ties=$2 model=$3 blocks=$4 variants=$5
	shift 5
	if [ "$blocks" -gt 0 ]; then
		model=$(cut_config "$model" "$blocks") || return 1
	fi
	run 300 "$name" --stdout "$OUT/$name.json" env MEMFIT_XLA_TIES="$ties" "$BIN" --backend "$BACKEND" memory --model "$model" \
		--variants "$variants" --beside go --json "$@"
}

# cut_config PRESET BLOCKS: a model folder holding PRESET's config.json (finetune init --config-only; a ViT with 10
# labels) with BLOCKS transformer blocks.
cut_config() {
	local arch=llama labels=0 dir="$WORK/cut-${1//:/-}-$2"
	case "$1" in vit*) arch=vit labels=10 ;; esac
	if [ ! -s "$dir/config.json" ] && [ "$DRY" = 0 ]; then
		"$BIN" init --arch "$arch" --preset "${1#*:}" --num-labels "$labels" --config-only --out "$dir/full" > /dev/null &&
			sed -E "s/(\"num_hidden_layers\": *)[0-9]+/\1$2/" "$dir/full/config.json" > "$dir/config.json" || return 1
	fi
	echo "$dir"
}

# step NAME MODEL METHOD VARIANT ARGS...: finetune bench step (ties on) into $OUT/NAME.json.
step() {
	local name=$1 model=$2 method=$3 variant=$4
	shift 4
	run 240 "$name" "$BIN" --backend "$BACKEND" bench step --model "$model" --method "$method" --variant "$variant" \
		--steps "$STEPS" --work-dir "$WORK/models" --json "$OUT/$name.json" --overwrite "$@"
}

log "memory modes on $BACKEND into $DEST, budget $BUDGET s, phases:$PHASES"
LLAMA1B_MODES=plain,approx-act,approx-act+mesa,grad-ckpt,approx-act+ms-norm
VIT_MODES=plain,approx-act,ms-norm,approx-act+ms-norm
L1=(--method lora --lora-targets all-linear "${LLAMA_SHAPE[@]}" --compute-dtype float32)
VA=(--num-labels 10 --method lora --lora-targets all-linear --batch-size "$VIT_BATCH" --compute-dtype "$BF16" --attention "$FLASH")
VQ=(--num-labels 10 --method lora --lora-targets q,v --batch-size "$VIT_BATCH" --compute-dtype "$BF16" --attention "$FLASH")
QL=(--method qlora --lora-targets all-linear "${QLORA_SHAPE[@]}" --compute-dtype "$BF16" --attention "$FLASH")

# The phases, each a function; MEMMODES_PHASES runs them in its order.
phase_compile() {
	plan compile__llama-1b__lora__ties1 1 "$LLAMA1B" 0 "$LLAMA1B_MODES" "${L1[@]}"
	plan compile__vit-b16__lora-all__ties1 1 "$VIT" 0 "$VIT_MODES" "${VA[@]}"
	plan compile__vit-b16__lora-qv__ties1 1 "$VIT" 0 "$VIT_MODES" "${VQ[@]}"
}
phase_steps() {
	local v
	for v in plain approx-act+ms-norm; do
		step "step__vit-b16__lora-all__$v" "$VIT" lora-all "$v" --batch-size "$VIT_BATCH" --compute-dtype "$BF16" --attention "$FLASH"
	done
	for v in plain grad-ckpt approx-act+mesa; do
		step "step__llama-1b__lora__$v" "$LLAMA1B" lora-all "$v" "${LLAMA_SHAPE[@]}" --compute-dtype float32
	done
	for v in plain approx-act+ms-norm; do
		step "step__vit-b16__lora-qv__$v" "$VIT" lora-qv "$v" --batch-size "$VIT_BATCH" --compute-dtype "$BF16" --attention "$FLASH"
	done
}
phase_qlora() {
	plan compile__llama-7b__qlora__ties1 1 "$LLAMA7B" 0 plain,approx-act+ms-norm "${QL[@]}"
}
phase_ab() {
	local ties
	for ties in 0 1; do
		plan "compile__llama-1b__lora__ties${ties}__L$AB_BLOCKS" "$ties" "$LLAMA1B" "$AB_BLOCKS" "$LLAMA1B_MODES" "${L1[@]}"
	done
	for ties in 0 1; do
		plan "compile__vit-b16__lora-qv__ties${ties}__L$AB_BLOCKS" "$ties" "$VIT" "$AB_BLOCKS" "$VIT_MODES" "${VQ[@]}"
	done
	for ties in 0 1; do
		plan "compile__llama-7b__qlora__ties${ties}__L$AB_QLORA_BLOCKS" "$ties" "$LLAMA7B" "$AB_QLORA_BLOCKS" plain,approx-act+ms-norm "${QL[@]}"
	done
}
phase_pytorch() {
	if [ "$BACKEND" = go ]; then
		log "SKIP pytorch: needs the GPU"
		return
	fi
	py pytorch__llama-1b__lora__plain --model llama-1b --method lora-all --dtype float32 --batch 2 --seq 512
	py pytorch__llama-1b__lora__grad-ckpt --model llama-1b --method lora-all --dtype float32 --variant grad-ckpt --batch 2 --seq 512
	py pytorch__llama-7b__lora-bf16-for-qlora__plain --model llama-7b --method lora-all --batch 4 --seq 512
	py pytorch__llama-7b__lora-bf16-for-qlora__approx-act+ms-norm --model llama-7b --method lora-all --variant approx-act+ms-norm --batch 4 --seq 512
}
py() { # NAME ARGS...: bench/pytorch/peft_compare.py into $OUT/NAME.json
	local name=$1
	shift
	run 240 "$name" "$PY" "$ROOT/bench/pytorch/peft_compare.py" --steps "$STEPS" --json "$OUT/$name.json" "$@"
}
phase_dumps() {
	[ "$DRY" = 0 ] && [ "$BACKEND" != go ] || return 0
	collect
	local n=0 model method mode name args
	while read -r model method mode; do
		[ -n "$mode" ] && [ $n -lt "${MEMMODES_MAX_DUMPS:-3}" ] || continue
		n=$((n + 1))
		case "$model/$method" in
		llama-1b/lora) args=("$LLAMA1B" "${L1[@]}") ;;
		vit-b16/lora-all) args=("$VIT" "${VA[@]}") ;;
		vit-b16/lora-qv) args=("$VIT" "${VQ[@]}") ;;
		llama-7b/qlora) args=("$LLAMA7B" "${QL[@]}") ;;
		*) continue ;;
		esac
		name="dump__${model}__${method}__$mode"
		rm -rf "$WORK/$name"
		run 240 "$name" env "XLA_FLAGS=${XLA_FLAGS:+$XLA_FLAGS }--xla_dump_to=$WORK/$name --xla_dump_hlo_as_text" \
			"$BIN" --backend "$BACKEND" memory --model "${args[0]}" --variants "$mode" --beside none "${args[@]:1}" &&
			run 60 "digest__${model}__${method}__$mode" --stdout "$OUT/digest__${model}__${method}__$mode.txt" \
				"$BIN" bench xla-digest "$WORK/$name" --top 25 --json "$OUT/digest__${model}__${method}__$mode.json" --overwrite
		rm -rf "$WORK/$name"
	done < <("$BIN" bench memory-modes "$OUT" --missing 2> /dev/null)
}
collect() {
	[ "$DRY" = 1 ] && return 0
	"$BIN" bench memory-modes "$OUT" --json "$DEST/memory-modes.json" --markdown "$DEST/memory-modes.md" \
		--checks "$DEST/memory-modes-checks.tsv" --overwrite > /dev/null 2> "$OUT/collect.log" ||
		log "FAIL collecting the rows: $(tail -1 "$OUT/collect.log")"
}
for p in $PHASES; do
	case "$p" in
	compile | steps | qlora | ab | pytorch | dumps) "phase_$p" ;;
	*) log "unknown phase $p (compile, steps, qlora, ab, pytorch, dumps)" ;;
	esac
done
if [ "$DRY" = 0 ]; then
	collect
	[ -s "$DEST/memory-modes-checks.tsv" ] && column -t -s $'\t' "$DEST/memory-modes-checks.tsv" 2>/dev/null
	log "done in $((SECONDS - T0)) s: $DEST/memory-modes.json, memory-modes.md"
fi
