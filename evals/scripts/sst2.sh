#!/usr/bin/env bash
# GLUE SST-2 with the shipped tiny LLaMA: a sequence classifier made from pretrained/llama-tiny, fine-tuned (full,
# with ReSiLU2 + MS-RMSNorm) on SST-2's training set, then scored on the dev set by `finetune eval glue`.
# CPU: about 11 minutes on 2 cores with the defaults below (600 steps of 32 sentences); dev accuracy 72.6%
# against a majority baseline of 50.9% on the build VM (see docs/evals.md). GPU: add --backend xla:cuda and raise STEPS.
# Usage: evals/scripts/sst2.sh [OUT]   (GLUE data from $GLUE, default ../shared/data/glue)
set -euo pipefail
# memfit needs Go 1.27 (GoMLX v0.28.16): a go command older than that fetches Go 1.27.3 from the module proxy.
case "$(GOTOOLCHAIN=local go env GOVERSION 2>/dev/null)" in go1.2[0-6] | go1.2[0-6].* | go1.1*) export GOTOOLCHAIN=go1.27.3 ;; esac
cd "$(dirname "$0")/../.."
OUT=${1:-runs/sst2}
GLUE=${GLUE:-../shared/data/glue}
STEPS=${STEPS:-600}
LR=${LR:-5e-4}
BATCH=${BATCH:-32}
SEQ=${SEQ:-40}
# GOEXPERIMENT=simd: GoMLX's AVX2/AVX-512 matmul kernels on amd64 (about 15x faster products; ignored elsewhere).
FT="env GOEXPERIMENT=simd go run ./cmd/finetune"
$FT init --from pretrained/llama-tiny --num-labels 2 --out "$OUT/init"
$FT train --model "$OUT/init" --data "$GLUE" --data-format glue --task sst2 --seq-len "$SEQ" --out "$OUT/run" \
  --method full --approx-act --ms-norm --steps "$STEPS" --batch-size "$BATCH" --lr "$LR" --schedule cosine --warmup-steps 30 \
  --log-every 10 --checkpoint-every 100
$FT export --run "$OUT/run" --format merged --out "$OUT/merged"
$FT eval glue --task sst2 --data "$GLUE" --model "$OUT/merged" --tokenizer "$OUT/init" --seq-len "$SEQ"
