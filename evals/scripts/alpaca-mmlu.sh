#!/usr/bin/env bash
# The paper's LLaMA setup at memfit's tiny scale: LoRA on every linear layer of pretrained/llama-tiny, trained on
# alpaca-libre instructions (prompt tokens masked) with ReSiLU2 + MS-RMSNorm, then MMLU 5-shot of the base model
# and of base + adapter. GPU: --backend xla:cuda with MODEL=<a real LLaMA folder> (QLoRA: see docs/quant.md).
# Usage: evals/scripts/alpaca-mmlu.sh [OUT]
set -euo pipefail
# memfit needs Go 1.27 (GoMLX v0.28.16): a go command older than that fetches Go 1.27.3 from the module proxy.
case "$(GOTOOLCHAIN=local go env GOVERSION 2>/dev/null)" in go1.2[0-6] | go1.2[0-6].* | go1.1*) export GOTOOLCHAIN=go1.27.3 ;; esac
cd "$(dirname "$0")/../.."
OUT=${1:-runs/alpaca}
DATA=${DATA:-../shared/data}
MODEL=${MODEL:-pretrained/llama-tiny}
STEPS=${STEPS:-200}
SUBJECTS=${SUBJECTS:-}  # e.g. anatomy,virology; empty: all 57
# GOEXPERIMENT=simd: GoMLX's AVX2/AVX-512 matmul kernels on amd64 (about 15x faster products; ignored elsewhere).
FT="env GOEXPERIMENT=simd go run ./cmd/finetune"
$FT train --model "$MODEL" --data "$DATA/alpaca-libre/alpaca_libre_tasks_v1.jsonl" --seq-len 256 --out "$OUT/run" \
  --method lora --lora-targets all-linear --lora-r 8 --lora-alpha 16 --approx-act --ms-norm \
  --steps "$STEPS" --batch-size 8 --lr 1e-3 --schedule cosine --warmup-steps 20
args=(--data "$DATA/mmlu")
[ -n "$SUBJECTS" ] && args+=(--subjects "$SUBJECTS")
$FT eval mmlu --model "$MODEL" "${args[@]}" --out "$OUT/mmlu-base.json"
$FT eval mmlu --model "$MODEL" --adapter "$OUT/run/adapter" "${args[@]}"
