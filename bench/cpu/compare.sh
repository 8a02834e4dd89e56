#!/usr/bin/env bash
# memfit beside a plain-PyTorch reference on this machine's CPU, one command (issue: side-by-side CPU benchmark).
# Run from anywhere in the repository; extra arguments go to `finetune bench cpu` (see its --help), e.g.
#
#   bash bench/cpu/compare.sh                                   # every case, default steps, into bench-cpu-out/
#   bash bench/cpu/compare.sh --steps 5 --warmup 2 --cases a,c  # shorter
#   bash bench/cpu/compare.sh --out docs/benchmarks/cpu         # the committed run
#
# What it does: checks that Debian's python3-torch and libopenblas0-pthread are installed (it installs nothing),
# builds memfit with GOEXPERIMENT=simd (GoMLX's AVX2/AVX-512 matmul kernels) into bin/finetune-simd, sets
# GODEBUG=cpu.fma=off for memfit's processes (without it Go's math.Exp is ~100x slower after GoMLX's AVX-512
# kernels), and runs `finetune bench cpu`, which runs every configuration in its own process on each side, reads
# each process's maximum RSS from wait4, checks that both sides' first-step losses agree, and writes the table and
# JSON. The reference sets OPENBLAS_CORETYPE (when OpenBLAS does not know the CPU) and OMP_WAIT_POLICY=PASSIVE
# (libgomp's spinning threads otherwise contend with OpenBLAS's) unless they are set, and the output says so
# (docs/benchmarks/README.md). Needs Go (1.27+, or any Go that can fetch 1.27.3) and /usr/bin/python3.
set -euo pipefail
# memfit needs Go 1.27 (GoMLX v0.28.16): a go command older than that fetches Go 1.27.3 from the module proxy.
case "$(GOTOOLCHAIN=local go env GOVERSION 2>/dev/null)" in go1.2[0-6] | go1.2[0-6].* | go1.1*) export GOTOOLCHAIN=go1.27.3 ;; esac
cd "$(dirname "$0")/../.."

missing=()
for pkg in python3-torch libopenblas0-pthread; do
	status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
	[ "$status" = "install ok installed" ] || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "bench/cpu/compare.sh: missing Debian package(s) ${missing[*]}: install them with: sudo apt-get install ${missing[*]}" >&2
	exit 1
fi
PY=${PYTHON:-/usr/bin/python3}
if ! "$PY" -c 'import torch, numpy' 2>/dev/null; then
	echo "bench/cpu/compare.sh: $PY cannot import torch and numpy (Debian's python3-torch provides both)" >&2
	exit 1
fi
blas=$(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || true)
case "$blas" in
*openblas-pthread*) ;;
*) echo "note: libblas.so.3 resolves to ${blas:-nothing}, not OpenBLAS (pthread); torch will use that (update-alternatives --config libblas.so.3-x86_64-linux-gnu)" >&2 ;;
esac

export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
mkdir -p bin
echo "building memfit: GOEXPERIMENT=simd go build -o bin/finetune-simd ./cmd/finetune" >&2
GOEXPERIMENT=simd go build -o bin/finetune-simd ./cmd/finetune
case ",${GODEBUG:-}," in
*,cpu.fma=off,*) ;;
*) export GODEBUG="${GODEBUG:+$GODEBUG,}cpu.fma=off" ;;
esac
echo "memfit processes run with GODEBUG=$GODEBUG" >&2
exec bin/finetune-simd bench cpu --python "$PY" --invocation "bash bench/cpu/compare.sh $*" "$@"
