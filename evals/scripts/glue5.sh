#!/usr/bin/env bash
# The paper's GLUE setup on memfit's own checkpoints: for each of CoLA, SST-2, MRPC, STS-B and RTE, make a
# classifier (a regression head for STS-B) from pretrained/llama-tiny, fine-tune it with LoRA on every linear
# layer plus the head, with ReSiLU2 + MS-RMSNorm, and score the dev set. GPU: --backend xla:cuda, real shapes via
# MODEL=<a LLaMA folder with tokenizer files>.
# Usage: evals/scripts/glue5.sh [OUT]
set -euo pipefail
# memfit needs Go 1.27 (GoMLX v0.28.16): a go command older than that fetches Go 1.27.3 from the module proxy.
case "$(GOTOOLCHAIN=local go env GOVERSION 2>/dev/null)" in go1.2[0-6] | go1.2[0-6].* | go1.1*) export GOTOOLCHAIN=go1.27.3 ;; esac
cd "$(dirname "$0")/../.."
OUT=${1:-runs/glue}
GLUE=${GLUE:-../shared/data/glue}
MODEL=${MODEL:-pretrained/llama-tiny}
STEPS=${STEPS:-200}
# GOEXPERIMENT=simd: GoMLX's AVX2/AVX-512 matmul kernels on amd64 (about 15x faster products; ignored elsewhere).
FT="env GOEXPERIMENT=simd go run ./cmd/finetune"
for task in cola sst2 mrpc stsb rte; do
  labels=2; [ "$task" = stsb ] && labels=1
  $FT init --from "$MODEL" --num-labels "$labels" --out "$OUT/$task/init"
  $FT train --model "$OUT/$task/init" --data "$GLUE" --data-format glue --task "$task" --seq-len 128 \
    --out "$OUT/$task/run" --method lora --lora-targets all-linear --train-modules score --lora-r 8 --lora-alpha 16 \
    --approx-act --ms-norm --steps "$STEPS" --batch-size 16 --lr 1e-3 --schedule cosine --warmup-steps 20
  $FT eval glue --task "$task" --data "$GLUE" --model "$OUT/$task/init" --adapter "$OUT/$task/run/adapter" --seq-len 128
done
