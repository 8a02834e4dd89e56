#!/usr/bin/env bash
# The first thing to run on a machine with an NVIDIA GPU: checks memfit's XLA/CUDA path in under 10 minutes and
# writes what it found to docs/benchmarks/gpu-DATE/ (DATE = date -u +%Y-%m-%d): summary.md, results.tsv,
# verify.log and every run's raw JSON, metrics and log. Run from anywhere in the checkout:
#
#   bash bench/gpu/verify.sh [DEST_DIR]                  # on the GPU machine
#
# memfit's XLA binary: $MEMFIT_BIN if set; else it builds bin/finetune-xla when Go is there (offline: GOPROXY=off,
# so it needs the Go 1.27.3 toolchain and the modules in the module cache); else it uses an existing
# bin/finetune-xla. A GPU machine without Go or internet takes a binary built elsewhere, on any Linux amd64 machine
# with Go and gcc (it links only libc; the CUDA plugin is loaded at run time):
#
#   GOTOOLCHAIN=go1.27.3 GOEXPERIMENT=simd CGO_ENABLED=1 go build -tags xla -o bin/finetune-xla ./cmd/finetune
#
# The stages (each prints PASS/FAIL/SKIP with its figure; the script exits 1 if any check failed, and always writes
# what it has):
#   a  the binary (built or given), nvidia-smi, memfit's / GoMLX's / go-xla's versions, the CUDA plugin and GPU
#      finetune version says it would use, the Python packages
#   b  smoke test: LLaMA-tiny LoRA, float32, 3 steps on xla:cuda (TF32 off) and on the pure-Go backend (CPU):
#      losses finite, the first loss and gradient norm equal within a tolerance
#   c  attention: --attention flash (cuDNN fused SDPA) against memory-efficient, bfloat16, LLaMA-tiny and the
#      shipped ViT: first loss and gradient norm equal within bfloat16 tolerance; the XLA dump of the flash step
#      holds cuDNN fMHA custom calls (else GoMLX fell back to memory-efficient attention without a word)
#   e  no device-memory leak: bench step (LLaMA-tiny, full fine-tuning, approx-act+ms-norm, flash) with 2 and with
#      50 timed steps: the device's peak bytes in use equal within 2% + 1 MiB
#   d  compile time of the LLaMA-7B QLoRA step (all-linear, bfloat16, batch 4 x 512, flash): finetune memory
#      --compile-time (no weights are read or written), the device-resident step against the 60 s target
#   f  bench/gpu/compare.sh against PyTorch + PEFT (ViT-B/16 LoRA q,v only) into DEST/compare, when at least
#      VERIFY_COMPARE_MIN_S seconds are left
#   m  memory modes (issue 35): bench/gpu/memory_modes.sh into DEST: every memory mode's compiled peak (compile
#      only), a few real steps (device peak, step time), the ordering ties off and on, PyTorch + PEFT for the LLaMA
#      cases, and XLA dump digests of the modes that miss their target: memory-modes.json, memory-modes.md; each of
#      issue 35's targets is a check. It takes the time left (at most VERIFY_MEMORY_S, 450 s): run it alone with
#      --only memory (stage a, then m), and the other stages without it with --skip-memory.
# (d runs after e: it is the long one.) Every stage runs under `timeout`, and the whole script within
# VERIFY_BUDGET_S seconds (default 540); a stage with too little time left is skipped and says so.
#
# Nothing is downloaded: go-xla's auto-install is off (GOMLX_NO_AUTO_INSTALL=1, and memfit links no installer),
# Hugging Face and pip are offline, Go builds with GOPROXY=off. memfit finds JAX's CUDA plugin and the NVIDIA
# libraries beside it by itself; set MEMFIT_PYTHON_SITE to the site-packages folder if it is somewhere unusual.
#
# On a machine without a GPU the same stages run on the pure-Go backend, the CUDA-only checks printing SKIP, so
# that a GPU session does not spend its minutes on a script bug (writes to /tmp/memfit-verify-go-DATE):
#
#   MEMFIT_VERIFY_BACKEND=go bash bench/gpu/verify.sh --quick
#
# Settings (environment): MEMFIT_BIN, MEMFIT_VERIFY_BACKEND (cuda, the default, or go), VERIFY_BUDGET_S (540),
# VERIFY_COMPARE_MIN_S (240), VERIFY_COMPILE_TARGET_S (60), VERIFY_F32_RTOL (1e-3), VERIFY_BF16_RTOL (1e-2),
# VERIFY_GRAD_RTOL (5e-2 bfloat16; float32 uses VERIFY_F32_RTOL x 5), PYTHON (python3). --quick: fewer leak steps
# (2 and 6), no compare.sh. --only memory: stages a and m only; --skip-memory: every stage but m.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
ROOT=$PWD
T0=$SECONDS

QUICK=0
DEST=""
ONLY=""
SKIP_MEMORY=0
next_only=0
for arg in "$@"; do
	if [ "$next_only" = 1 ]; then
		ONLY=$arg
		next_only=0
		continue
	fi
	case "$arg" in
	--quick) QUICK=1 ;;
	--only) next_only=1 ;;
	--only=*) ONLY=${arg#--only=} ;;
	--skip-memory) SKIP_MEMORY=1 ;;
	-h | --help)
		sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
		exit 0
		;;
	-*)
		echo "verify.sh: unknown flag $arg" >&2
		exit 2
		;;
	*) DEST=$arg ;;
	esac
done

case "$ONLY" in "" | memory) ;; *)
	echo "verify.sh: --only takes memory (stages a and m), not $ONLY" >&2
	exit 2
	;;
esac
MODE=${MEMFIT_VERIFY_BACKEND:-cuda}
DATE=$(date -u +%Y-%m-%d)
case "$MODE" in
cuda)
	DEV=xla:cuda
	DEV_F32=xla:cuda,tf32=false # XLA runs float32 products as TF32 on the GPU by default; the CPU comparison wants float32
	DEST=${DEST:-docs/benchmarks/gpu-$DATE}
	;;
go)
	DEV=go
	DEV_F32=go
	DEST=${DEST:-${TMPDIR:-/tmp}/memfit-verify-go-$DATE}
	;;
*)
	echo "verify.sh: MEMFIT_VERIFY_BACKEND must be cuda or go, not $MODE" >&2
	exit 2
	;;
esac
BUDGET=${VERIFY_BUDGET_S:-540}
COMPARE_MIN=${VERIFY_COMPARE_MIN_S:-240}
COMPILE_TARGET=${VERIFY_COMPILE_TARGET_S:-60}
F32_RTOL=${VERIFY_F32_RTOL:-1e-3}
BF16_RTOL=${VERIFY_BF16_RTOL:-1e-2}
GRAD_RTOL=${VERIFY_GRAD_RTOL:-5e-2}
PY=${PYTHON:-python3}
LEAK_STEPS_FIRST=2
LEAK_STEPS_LAST=50
[ "$QUICK" = 1 ] && LEAK_STEPS_LAST=6

# Never download anything.
export GOMLX_NO_AUTO_INSTALL=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PIP_NO_INDEX=1

mkdir -p "$DEST" || exit 2
DEST=$(cd "$DEST" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/memfit-verify.XXXXXX") || exit 2
trap 'rm -rf "$WORK"' EXIT
exec > >(tee "$DEST/verify.log") 2>&1
: > "$DEST/results.tsv"
FAILED=0
CHECK="$PY $ROOT/bench/gpu/verify_check.py"

left() { echo $((BUDGET - (SECONDS - T0))); }

# limit WANT [MIN]: the seconds a stage may take (WANT, or what is left of the budget less 10 s); fails when that
# is under MIN (default 20).
limit() {
	local want=$1 min=${2:-20} l
	l=$(($(left) - 10))
	((l < want)) && want=$l
	((want < min)) && return 1
	echo "$want"
}

# record STAGE STATUS TEXT: one result line (PASS, FAIL, SKIP or INFO), also in results.tsv and summary.md.
record() {
	printf '%-4s  %-22s %s\n' "$2" "$1" "$3"
	printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$DEST/results.tsv"
	[ "$2" = FAIL ] && FAILED=1
	summary
}

summary() {
	{
		echo "# memfit GPU verification, $DATE"
		echo
		echo "\`bench/gpu/verify.sh\` ($([ "$QUICK" = 1 ] && echo "--quick, ")backend $DEV), $((SECONDS - T0)) s so far of a $BUDGET s budget."
		echo
		[ -s "$DEST/gpu.txt" ] && echo "GPU: $(head -1 "$DEST/gpu.txt")  "
		[ -s "$DEST/versions.txt" ] && sed -n '1,3p' "$DEST/versions.txt" | sed 's/$/  /'
		echo
		echo "| stage | result | figure |"
		echo "|---|---|---|"
		awk -F'\t' '{ gsub(/\|/, "\\|", $3); printf "| %s | %s | %s |\n", $1, $2, $3 }' "$DEST/results.tsv"
		echo
		echo "Files: results.tsv (these lines), verify.log (everything printed), versions.txt, nvidia-smi.txt,"
		echo "python-packages.txt, and per run its log (*.log), metrics (*-metrics.jsonl) or JSON (*.json)."
	} > "$DEST/summary.md"
}

# run SECONDS LOG CMD...: runs CMD under timeout, its output in LOG; returns CMD's status (124: timed out).
run() {
	local t=$1 log=$2
	shift 2
	echo "+ $*" > "$log"
	timeout -k 10 "$t" "$@" >> "$log" 2>&1
}

# stage NAME: prints a header.
stage() { printf '\n=== %s (%s, %d s left)\n' "$1" "$(date -u +%H:%M:%S)" "$(left)"; }

# losses NAME: "first_loss first_grad_norm last_loss steps all_finite" of run NAME's metrics (copied to DEST).
losses() {
	cp "$WORK/$1/metrics.jsonl" "$DEST/$1-metrics.jsonl" 2>/dev/null || {
		echo "nan nan nan 0 false"
		return 1
	}
	$CHECK steps "$DEST/$1-metrics.jsonl"
}

# compare_runs STAGE A B LOSS_RTOL GRAD_RTOL: the first loss and gradient norm of runs A and B.
compare_runs() {
	local st=$1 a=$2 b=$3 rl=$4 rg=$5 la ga lb gb n fa fb rel
	read -r la ga _ n fa < <(losses "$a")
	read -r lb gb _ _ fb < <(losses "$b")
	if [ "$fa" != true ] || [ "$fb" != true ]; then
		record "$st" FAIL "non-finite or missing losses ($a: $fa, $b: $fb; see $a.log, $b.log)"
		return
	fi
	if rel=$($CHECK close "$la" "$lb" "$rl"); then
		record "$st.loss" PASS "first loss $a $la vs $b $lb (rel. diff. $rel <= $rl; $n steps, all finite)"
	else
		record "$st.loss" FAIL "first loss $a $la vs $b $lb (rel. diff. $rel > $rl)"
	fi
	if rel=$($CHECK close "$ga" "$gb" "$rg"); then
		record "$st.grad" PASS "first gradient norm $a $ga vs $b $gb (rel. diff. $rel <= $rg)"
	else
		record "$st.grad" FAIL "first gradient norm $a $ga vs $b $gb (rel. diff. $rel > $rg)"
	fi
}

# train NAME SECONDS BACKEND ARGS...: a finetune train run into $WORK/NAME; records a FAIL if it fails.
train() {
	local name=$1 t=$2 backend=$3 rc
	shift 3
	run "$t" "$DEST/$name.log" "$BIN" --backend "$backend" train --out "$WORK/$name" --overwrite --log-every 1 --seed 1 "$@"
	rc=$?
	if [ $rc != 0 ]; then
		local why="exit $rc"
		[ $rc = 124 ] && why="timed out after $t s"
		record "$name" FAIL "finetune train $why (last line: $(tail -1 "$DEST/$name.log" | cut -c1-160))"
		return 1
	fi
}

echo "memfit GPU verification: backend $DEV, output $DEST, budget $BUDGET s"

# ---------------------------------------------------------------------------------------------------------------
stage "a: binary, GPU, versions"
BIN=""
if [ -n "${MEMFIT_BIN:-}" ]; then
	BIN=$MEMFIT_BIN
	record a.binary INFO "MEMFIT_BIN=$BIN (given, not rebuilt)"
elif command -v go > /dev/null 2>&1; then
	mkdir -p bin
	if t=$(limit 300 60) && run "$t" "$DEST/build.log" env GOTOOLCHAIN=go1.27.3 GOEXPERIMENT=simd CGO_ENABLED=1 \
		GOPROXY=off GOFLAGS=-mod=readonly go build -tags xla -o bin/finetune-xla ./cmd/finetune; then
		BIN=bin/finetune-xla
		record a.build PASS "go build -tags xla -> bin/finetune-xla ($(du -h bin/finetune-xla | cut -f1))"
	elif [ -x bin/finetune-xla ]; then
		BIN=bin/finetune-xla
		record a.build INFO "the offline build failed (build.log: $(tail -1 "$DEST/build.log" | cut -c1-120)); using the existing bin/finetune-xla"
	else
		record a.build FAIL "the offline build failed and there is no bin/finetune-xla (build.log: $(tail -1 "$DEST/build.log" | cut -c1-120))"
	fi
elif [ -x bin/finetune-xla ]; then
	BIN=bin/finetune-xla
	record a.binary INFO "no Go here: using the existing bin/finetune-xla"
else
	record a.binary FAIL "no Go and no bin/finetune-xla: build one elsewhere (see this script's header) and set MEMFIT_BIN"
fi
case "$BIN" in /*) ;; ?*) BIN=$ROOT/$BIN ;; esac
# memfit looks for JAX's CUDA plugin in the usual site-packages folders; add those of $PY (a pyenv or conda
# Python elsewhere) unless MEMFIT_PYTHON_SITE is set.
if [ -z "${MEMFIT_PYTHON_SITE:-}" ] && command -v "$PY" > /dev/null 2>&1; then
	MEMFIT_PYTHON_SITE=$(timeout 30 "$PY" -c 'import site; print(":".join(site.getsitepackages() + [site.getusersitepackages()]))' 2> /dev/null)
	export MEMFIT_PYTHON_SITE
fi
if [ -z "$BIN" ] || ! "$BIN" version > "$DEST/versions.txt" 2>&1; then
	record a.version FAIL "the memfit binary does not run: $(tail -1 "$DEST/versions.txt" 2> /dev/null)"
	exit 1
fi
cat "$DEST/versions.txt"
if ! grep -q '^backends: .*xla (go-xla' "$DEST/versions.txt"; then
	if [ "$MODE" = cuda ]; then
		record a.version FAIL "$BIN was built without -tags xla"
	else
		record a.version INFO "$BIN has no XLA support (the go dry run does not need it)"
	fi
else
	record a.version PASS "$(sed -n '1p' "$DEST/versions.txt"), $(sed -n '2p' "$DEST/versions.txt"), $(grep -o 'go-xla v[^;]*' "$DEST/versions.txt")"
fi
if [ "$MODE" = cuda ]; then
	if grep -q '^XLA plugin for --backend xla:cuda: /' "$DEST/versions.txt"; then
		record a.plugin PASS "$(grep '^XLA plugin for --backend xla:cuda: ' "$DEST/versions.txt")"
	else
		record a.plugin FAIL "$(grep '^XLA plugin for --backend xla:cuda: ' "$DEST/versions.txt") (set MEMFIT_PYTHON_SITE or PJRT_PLUGIN_LIBRARY_PATH)"
	fi
	record a.gpu.memfit INFO "$(grep '^GPU: ' "$DEST/versions.txt")"
fi
GPU=0
if command -v nvidia-smi > /dev/null 2>&1 && timeout 60 nvidia-smi > "$DEST/nvidia-smi.txt" 2>&1; then
	cat "$DEST/nvidia-smi.txt"
	timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$DEST/gpu.txt" 2>&1
	GPU=1
	record a.gpu PASS "$(head -1 "$DEST/gpu.txt")"
elif [ "$MODE" = cuda ]; then
	record a.gpu FAIL "nvidia-smi is missing or fails: no NVIDIA GPU here (MEMFIT_VERIFY_BACKEND=go runs the CPU dry run)"
else
	record a.gpu SKIP "no GPU (pure-Go dry run)"
fi
if command -v "$PY" > /dev/null 2>&1; then
	timeout 60 "$PY" - > "$DEST/python-packages.txt" 2>&1 << 'EOF'
import importlib.metadata as md, sys
print("python", sys.version.split()[0])
for p in ["torch", "transformers", "peft", "accelerate", "bitsandbytes", "safetensors", "jax", "jaxlib",
          "jax-cuda13-pjrt", "jax-cuda13-plugin", "jax-cuda12-pjrt", "jax-cuda12-plugin", "nvidia-cudnn-cu13",
          "nvidia-cudnn-cu12", "nvidia-cublas", "nvidia-cublas-cu12", "nvidia-cuda-nvcc", "nvidia-cuda-nvcc-cu12"]:
    try:
        print(p, md.version(p))
    except md.PackageNotFoundError:
        print(p, "-")
EOF
	record a.python INFO "$(tr '\n' ' ' < "$DEST/python-packages.txt" | sed 's/[a-z0-9-]* - //g' | cut -c1-300)"
else
	record a.python FAIL "no $PY: the checks below read JSON with it (set PYTHON)"
	exit 1
fi
if [ "$MODE" = cuda ] && [ "$GPU" = 0 ]; then
	record b-f SKIP "no GPU: nothing else can run"
	exit 1
fi

# ---------------------------------------------------------------------------------------------------------------
# m: memory modes (issue 35), bench/gpu/memory_modes.sh; run here first with --only memory, else after stage f.
memory_stage() {
	stage "m: memory modes (issue 35) on $DEV"
	local t
	if ! t=$(limit "${VERIFY_MEMORY_S:-450}" 60); then
		record m SKIP "no time left ($(left) s): run bash bench/gpu/verify.sh --only memory"
		return
	fi
	local backend=xla:cuda
	[ "$MODE" = go ] && backend=go
	MEMFIT_BIN=$BIN PYTHON=$PY MEMMODES_BACKEND=$backend MEMMODES_BUDGET_S=$t timeout -k 10 $((t + 30)) \
		bash "$ROOT/bench/gpu/memory_modes.sh" "$DEST" > "$DEST/m-memory-modes.log" 2>&1
	local rc=$?
	if [ ! -s "$DEST/memory-modes-checks.tsv" ]; then
		record m FAIL "memory_modes.sh wrote no checks (exit $rc; see m-memory-modes.log: $(tail -1 "$DEST/m-memory-modes.log" | cut -c1-160))"
		return
	fi
	local status name detail
	while IFS=$'\t' read -r status name detail; do
		[ "$MODE" = go ] && [ "$status" = FAIL ] && status=INFO # tiny models on the CPU: the GPU's targets do not apply
		record "m $name" "$status" "$detail"
	done < "$DEST/memory-modes-checks.tsv"
	record m.rows INFO "memory-modes.json: $(grep -c '"mode"' "$DEST/memory-modes.json" 2> /dev/null) rows; tables in memory-modes.md; runs in modes/ (m-memory-modes.log)"
}
if [ "$ONLY" = memory ]; then
	memory_stage
	total=$((SECONDS - T0))
	echo
	echo "=== done in $total s (--only memory): $(grep -c $'\tPASS\t' "$DEST/results.tsv") pass, $(grep -c $'\tFAIL\t' "$DEST/results.tsv") fail; $DEST/summary.md"
	summary
	exit $FAILED
fi

# ---------------------------------------------------------------------------------------------------------------
stage "b: smoke test, LLaMA-tiny LoRA float32 on $DEV_F32 against the pure-Go backend (CPU)"
LLAMA=(--model "$ROOT/pretrained/llama-tiny" --data "$ROOT/README.md" --data-format text --steps 3
	--method lora --lora-targets all-linear)
if t=$(limit 120); then
	train b-cpu "$t" go "${LLAMA[@]}" --batch-size 4 --seq-len 128 --compute-dtype float32 --attention memory-efficient &&
		t=$(limit 150) &&
		train b-dev "$t" "$DEV_F32" "${LLAMA[@]}" --batch-size 4 --seq-len 128 --compute-dtype float32 --attention memory-efficient &&
		compare_runs b b-dev b-cpu "$F32_RTOL" "$(awk "BEGIN { print 5 * $F32_RTOL }")"
else
	record b SKIP "no time left"
fi

# ---------------------------------------------------------------------------------------------------------------
stage "c: flash (cuDNN fused attention) against memory-efficient attention, bfloat16, on $DEV"
fmha() { # DUMP_DIR: the number of dumped XLA files naming a cuDNN fMHA custom call
	# shellcheck disable=SC2016 # a literal $ in the custom call's name
	grep -rlF '__cudnn$fmha' "$1" 2> /dev/null | wc -l
}
DUMP=()
[ "$MODE" = cuda ] && DUMP=(env "XLA_FLAGS=${XLA_FLAGS:+$XLA_FLAGS }--xla_dump_to=$WORK/dump-llama --xla_dump_hlo_as_text")
if t=$(limit 120); then
	run "$t" "$DEST/c-llama-flash.log" "${DUMP[@]}" "$BIN" --backend "$DEV" train --out "$WORK/c-llama-flash" --overwrite \
		--log-every 1 --seed 1 "${LLAMA[@]}" --batch-size 4 --seq-len 256 --compute-dtype bfloat16 --attention flash
	rc=$?
	if [ $rc != 0 ]; then
		record c-llama-flash FAIL "finetune train exit $rc (last line: $(tail -1 "$DEST/c-llama-flash.log" | cut -c1-160))"
	elif t=$(limit 120) && train c-llama-memeff "$t" "$DEV" "${LLAMA[@]}" --batch-size 4 --seq-len 256 \
		--compute-dtype bfloat16 --attention memory-efficient; then
		compare_runs c.llama c-llama-flash c-llama-memeff "$BF16_RTOL" "$GRAD_RTOL"
	fi
	if [ $rc != 0 ]; then
		record c.llama.fmha SKIP "the flash run failed"
	elif [ "$MODE" = cuda ]; then
		n=$(fmha "$WORK/dump-llama")
		if [ "$n" -gt 0 ]; then
			record c.llama.fmha PASS "$n XLA dump files name a __cudnn\$fmha custom call: flash ran cuDNN's fused attention"
		else
			record c.llama.fmha FAIL "no __cudnn\$fmha custom call in the XLA dump: flash fell back to memory-efficient attention"
		fi
		rm -rf "$WORK/dump-llama"
	else
		record c.llama.fmha SKIP "CUDA only (the Go backend has no fused attention: flash computes memory-efficient)"
	fi
else
	record c.llama SKIP "no time left"
fi
# The shipped ViT (vit-fashion, classes 0-4) on the demo's images (classes 5-9, relabelled 0-4 as the demo does).
if $CHECK relabel "$ROOT/pretrained/data/fashion-5to9-train-labels.idx.gz" "$WORK/labels.idx.gz" 5; then
	VIT=(--model "$ROOT/pretrained/vit-fashion" --data "$ROOT/pretrained/data/fashion-5to9-train-images.idx.gz,$WORK/labels.idx.gz"
		--data-format idx --steps 3 --method lora --lora-targets all-linear --train-modules classifier --batch-size 32
		--compute-dtype bfloat16)
	[ "$MODE" = cuda ] && DUMP=(env "XLA_FLAGS=${XLA_FLAGS:+$XLA_FLAGS }--xla_dump_to=$WORK/dump-vit --xla_dump_hlo_as_text")
	if t=$(limit 120); then
		run "$t" "$DEST/c-vit-flash.log" "${DUMP[@]}" "$BIN" --backend "$DEV" train --out "$WORK/c-vit-flash" --overwrite \
			--log-every 1 --seed 1 "${VIT[@]}" --attention flash
		rc=$?
		if [ $rc != 0 ]; then
			record c-vit-flash FAIL "finetune train exit $rc (last line: $(tail -1 "$DEST/c-vit-flash.log" | cut -c1-160))"
		elif t=$(limit 120) && train c-vit-memeff "$t" "$DEV" "${VIT[@]}" --attention memory-efficient; then
			compare_runs c.vit c-vit-flash c-vit-memeff "$BF16_RTOL" "$GRAD_RTOL"
		fi
		if [ $rc != 0 ]; then
			record c.vit.fmha SKIP "the flash run failed"
		elif [ "$MODE" = cuda ]; then
			n=$(fmha "$WORK/dump-vit")
			if [ "$n" -gt 0 ]; then
				record c.vit.fmha PASS "$n XLA dump files name a __cudnn\$fmha custom call"
			else
				record c.vit.fmha FAIL "no __cudnn\$fmha custom call in the XLA dump: flash fell back to memory-efficient attention"
			fi
			rm -rf "$WORK/dump-vit"
		else
			record c.vit.fmha SKIP "CUDA only"
		fi
	else
		record c.vit SKIP "no time left"
	fi
else
	record c.vit FAIL "could not relabel the demo's labels"
fi

# ---------------------------------------------------------------------------------------------------------------
stage "e: device peak flat over $LEAK_STEPS_LAST steps (no leak), bench step on $DEV"
leak_run() { # STEPS SECONDS
	run "$2" "$DEST/e-steps$1.log" "$BIN" --backend "$DEV" bench step --model "$ROOT/pretrained/llama-tiny" \
		--method full --variant approx-act+ms-norm --batch-size 8 --seq-len 256 --compute-dtype bfloat16 \
		--attention flash --steps "$1" --json "$DEST/e-steps$1.json" --overwrite
}
if ! t=$(limit 120); then
	record e SKIP "no time left"
elif ! leak_run "$LEAK_STEPS_FIRST" "$t" || ! t=$(limit 150) || ! leak_run "$LEAK_STEPS_LAST" "$t"; then
	record e FAIL "bench step failed, timed out or ran out of time (see e-steps*.log)"
else
	p1=$($CHECK field "$DEST/e-steps$LEAK_STEPS_FIRST.json" device_peak_bytes)
	p2=$($CHECK field "$DEST/e-steps$LEAK_STEPS_LAST.json" device_peak_bytes)
	s2=$($CHECK field "$DEST/e-steps$LEAK_STEPS_LAST.json" step_seconds)
	if [ -z "$p1" ] || [ -z "$p2" ]; then
		if [ "$MODE" = cuda ]; then
			record e FAIL "bench step wrote no device_peak_bytes (PJRT device memory stats unavailable?)"
		else
			record e SKIP "no device memory statistics on the Go backend (both bench step runs worked; median step $s2 s)"
		fi
	elif $CHECK flat "$p1" "$p2" 0.02 1048576; then
		record e PASS "device peak after $LEAK_STEPS_FIRST steps $p1 B, after $LEAK_STEPS_LAST steps $p2 B (within 2% + 1 MiB); median step $s2 s"
	else
		record e FAIL "device peak grew: $p1 B after $LEAK_STEPS_FIRST steps, $p2 B after $LEAK_STEPS_LAST steps"
	fi
fi

# ---------------------------------------------------------------------------------------------------------------
stage "d: LLaMA-7B QLoRA step compile time on $DEV"
if t=$(limit 300 60); then
	echo "+ $BIN --backend $DEV memory --model llama-7b ... --compile-time --json" > "$DEST/d-compile.log"
	timeout -k 10 "$t" "$BIN" --backend "$DEV" memory --model llama-7b --method qlora --lora-targets all-linear \
		--compute-dtype bfloat16 --batch-size 4 --seq-len 512 --attention flash --variants plain --compile-time --json \
		> "$DEST/d-compile.json" 2>> "$DEST/d-compile.log"
	rc=$?
	if [ $rc = 0 ]; then
		dev=$($CHECK field "$DEST/d-compile.json" compile device_seconds)
		grad=$($CHECK field "$DEST/d-compile.json" compile gradient_seconds)
		if [ -z "$dev" ]; then
			record d FAIL "no compile times in d-compile.json"
		elif awk "BEGIN { exit !($dev <= $COMPILE_TARGET) }"; then
			record d PASS "device-resident step compiled in $dev s (target $COMPILE_TARGET s); gradient program $grad s"
		else
			record d FAIL "device-resident step compiled in $dev s, over the $COMPILE_TARGET s target; gradient program $grad s"
		fi
	elif [ $rc = 124 ] || [ $rc = 137 ]; then
		record d FAIL "not compiled within $t s (gradient and device-resident programs; see d-compile.log)"
	else
		record d FAIL "finetune memory --compile-time exit $rc (last line: $(tail -1 "$DEST/d-compile.log" | cut -c1-160))"
	fi
else
	record d SKIP "no time left ($(left) s)"
fi

# ---------------------------------------------------------------------------------------------------------------
stage "f: bench/gpu/compare.sh against PyTorch + PEFT (ViT-B/16 LoRA q,v)"
if [ "$MODE" != cuda ]; then
	record f SKIP "needs the GPU (xla:cuda and PyTorch on CUDA)"
elif [ "$QUICK" = 1 ]; then
	record f SKIP "--quick"
elif ! t=$(limit 600 "$COMPARE_MIN"); then
	record f SKIP "$(left) s left, under VERIFY_COMPARE_MIN_S=$COMPARE_MIN: run bash bench/gpu/compare.sh on its own"
else
	COMPARE_CONFIGS="vit-b16 lora-qv 64 0" MEMFIT_BIN=$BIN PYTHON=$PY timeout -k 10 "$t" \
		bash bench/gpu/compare.sh "$DEST/compare" > "$DEST/f-compare.log" 2>&1
	rc=$?
	if [ $rc = 0 ] && [ -s "$DEST/compare/compare.txt" ] && ! grep -q ' failed ' "$DEST/f-compare.log"; then
		record f PASS "compare/compare.txt written ($(grep -c . "$DEST/compare/compare.txt") lines)"
	elif [ $rc = 124 ] || [ $rc = 137 ]; then
		record f SKIP "stopped at the time limit ($t s); what finished is in compare/"
	else
		record f FAIL "$(grep -c ' failed ' "$DEST/f-compare.log") run(s) failed, compare.sh exit $rc (see f-compare.log and compare/*.log)"
	fi
fi

# ---------------------------------------------------------------------------------------------------------------
if [ "$SKIP_MEMORY" = 1 ]; then
	record m SKIP "--skip-memory (bash bench/gpu/verify.sh --only memory runs it)"
else
	memory_stage
fi

# ---------------------------------------------------------------------------------------------------------------
total=$((SECONDS - T0))
echo
echo "=== done in $total s: $(grep -c $'\tPASS\t' "$DEST/results.tsv") pass, $(grep -c $'\tFAIL\t' "$DEST/results.tsv") fail, $(grep -c $'\tSKIP\t' "$DEST/results.tsv") skipped; $DEST/summary.md"
summary
exit $FAILED
