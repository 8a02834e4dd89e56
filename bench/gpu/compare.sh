#!/usr/bin/env bash
# memfit vs PyTorch + PEFT on one GPU, in one session: issue 10's side-by-side. Run on the GPU machine from the
# repository root, with a memfit binary built with XLA support and a Python that has torch, transformers, peft
# (and bitsandbytes for QLoRA: without it the PyTorch side of the llama-7b cells fails and says so):
#
#   GOTOOLCHAIN=go1.27.3 GOEXPERIMENT=simd CGO_ENABLED=1 go build -tags xla -o bin/finetune-xla ./cmd/finetune
#                                                      # any Linux amd64 machine with Go and gcc; GOTOOLCHAIN fetches
#                                                      # Go 1.27.3 where the installed Go is older (memfit needs 1.27)
#   bash bench/gpu/compare.sh [OUT_DIR]                # on the GPU machine (MEMFIT_BIN: another binary)
#
# COMPARE_CONFIGS (lines or ";"-separated entries "MODEL METHOD BATCH SEQ", SEQ 0 for a ViT) runs only those
# configurations, e.g. COMPARE_CONFIGS="vit-b16 lora-qv 64 0" (what bench/gpu/verify.sh runs when time allows).
#
# Every configuration runs in its own process on each side (both peaks are per-process peaks). memfit finds JAX's
# CUDA plugin and the NVIDIA libraries beside it by itself (engine.FindJAXCUDA); set MEMFIT_PYTHON_SITE to the
# site-packages folder if it is somewhere unusual. The table at the end comes from `finetune bench compare`.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
OUT=${1:-bench-gpu-out}
BIN=${MEMFIT_BIN:-bin/finetune-xla}
PY=${PYTHON:-python3}
STEPS=${STEPS:-10}
WORK=${WORK:-/tmp/memfit-compare-models}   # random-weight checkpoints, written once and shared by the runs
mkdir -p "$OUT" "$WORK"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$OUT/gpu.txt" 2>/dev/null || true

# model method batch seq
CONFIGS=(
	"vit-b16 lora-qv 64 0"
	"vit-b16 lora-all 64 0"
	"llama-7b qlora 4 512"
)
if [ -n "${COMPARE_CONFIGS:-}" ]; then
	mapfile -t CONFIGS < <(tr ';' '\n' <<< "$COMPARE_CONFIGS" | sed 's/^ *//; /^$/d')
fi
for cfg in "${CONFIGS[@]}"; do
	read -r model method batch seq <<< "$cfg"
	for variant in plain approx-act+ms-norm; do
		tag="$model-$method-$variant-b$batch"
		[ "$seq" != 0 ] && tag="$tag-s$seq"
		echo "== $tag" >&2
		"$BIN" --backend xla:cuda bench step --model "$model" --method "$method" --variant "$variant" \
			--batch-size "$batch" --seq-len "${seq/#0/512}" --steps "$STEPS" --compute-dtype bfloat16 --attention memory-efficient --work-dir "$WORK" \
			--json "$OUT/memfit-$tag.json" --overwrite > /dev/null 2> "$OUT/memfit-$tag.log" || echo "memfit $tag failed (see $OUT/memfit-$tag.log)" >&2
		"$PY" bench/pytorch/peft_compare.py --model "$model" --method "$method" --variant "$variant" \
			--batch "$batch" --seq "${seq/#0/512}" --steps "$STEPS" --attention sdpa \
			--json "$OUT/pytorch-$tag.json" > /dev/null 2> "$OUT/pytorch-$tag.log" || echo "pytorch $tag failed (see $OUT/pytorch-$tag.log)" >&2
	done
done
"$BIN" bench compare "$OUT" --json "$OUT/compare.json" --overwrite | tee "$OUT/compare.txt"
rm -rf "$WORK"
