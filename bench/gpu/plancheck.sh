#!/usr/bin/env bash
# Checks the memory autopilot's GPU cost model (`memory --plan --for-backend xla:cuda:h200`, planned on any
# machine) against a real GPU: plans llama-1b LoRA (all-linear, float32, batch 2 x 512) for a 7 GiB budget, then
# trains the chosen plan and every uniform mode on xla:cuda with `bench step` (one process each: the device's
# peak bytes in use belong to one configuration) and writes the plan, each run's JSON and a summary table:
#
#   MEMFIT_BIN=bin/finetune-xla bash bench/gpu/plancheck.sh DEST [FOR_BACKEND]
#
# FOR_BACKEND defaults to xla:cuda:h200 (xla:cuda is the H100 profile). On a machine without a GPU,
# PLANCHECK_BACKEND=go runs the same commands on the pure-Go backend with a small model (PLANCHECK_MODEL=llama:tiny
# PLANCHECK_BLOCKS=2 PLANCHECK_SEQ=64), to test the script.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
DEST=${1:?usage: plancheck.sh DEST [FOR_BACKEND]}
FOR=${2:-xla:cuda:h200}
BIN=${MEMFIT_BIN:-bin/finetune-xla}
BACKEND=${PLANCHECK_BACKEND:-xla:cuda}
MODEL=${PLANCHECK_MODEL:-llama-1b}
BLOCKS=${PLANCHECK_BLOCKS:-22}
BUDGET=${PLANCHECK_BUDGET:-7GiB}
STEPS=${PLANCHECK_STEPS:-10}
mkdir -p "$DEST"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
shape=(--batch-size 2 --seq-len "${PLANCHECK_SEQ:-512}" --compute-dtype float32)
"$BIN" memory --model "$MODEL" --method lora --lora-targets all-linear "${shape[@]}" --budget "$BUDGET" --plan \
	--for-backend "$FOR" > "$DEST/plan.txt" 2> "$DEST/plan.err"
"$BIN" memory --model "$MODEL" --method lora --lora-targets all-linear "${shape[@]}" --budget "$BUDGET" --plan \
	--for-backend "$FOR" --json > "$DEST/plan.json" 2>/dev/null
chosen=$(sed -n 's/^plan: //p' "$DEST/plan.txt" | head -1)
echo "plan for $BUDGET on $FOR: $chosen"
for p in "plain*$BLOCKS" "approx-act*$BLOCKS" "approx-act+mesa*$BLOCKS" "grad-ckpt*$BLOCKS" "$chosen"; do
	name=$(tr '*,+' 'x_p' <<< "$p")
	[ -e "$DEST/step-$name.json" ] && continue # the chosen plan is one of the uniform ones
	name=$(tr '*,+' 'x_p' <<< "$p")
	MEMFIT_BACKEND=$BACKEND timeout 300 "$BIN" bench step --model "$MODEL" --method lora-all "${shape[@]}" \
		--block-plan "$p" --steps "$STEPS" --work-dir "$WORK/model" --json "$DEST/step-$name.json" \
		> "$DEST/step-$name.log" 2>&1 || echo "bench step $p failed (see $DEST/step-$name.log)"
done
{
	echo "# plan check: $MODEL LoRA all-linear, float32, batch 2 x ${PLANCHECK_SEQ:-512}, budget $BUDGET, planned for $FOR, run on $BACKEND"
	echo
	echo "chosen plan: \`$chosen\`"
	echo
	echo "| block plan | measured step (median) | device peak bytes in use (measured) | saved activations (exact) |"
	echo "|---|---:|---:|---:|"
	for f in "$DEST"/step-*.json; do
		python3 - "$f" <<'PY' 2>/dev/null || echo "| $(basename "$f") | unreadable | | |"
import json, sys
j = json.load(open(sys.argv[1]))
def g(*ks):
    for k in ks:
        if k in j and j[k] not in (None, 0):
            return j[k]
    return None
plan = g("block_plan", "variant") or sys.argv[1]
step = g("step_seconds", "median_step_seconds")
peak = g("device_peak_bytes", "device_peak_bytes_in_use")
saved = g("saved_bytes", "saved_activation_bytes")
f = lambda b: "%.3f GiB" % (b / 2**30) if b else "-"
print("| `%s` | %s | %s | %s |" % (plan, "%.2f ms" % (step * 1000) if step else "-", f(peak), f(saved)))
PY
	done
} > "$DEST/summary.md"
cat "$DEST/summary.md"
