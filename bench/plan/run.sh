#!/usr/bin/env bash
# The memory autopilot's planning at real sizes on this machine, one command (issue 29: `memory --plan` within
# 60 s and under 2 GiB peak RSS for llama-1b LoRA b2x512 and llama-7b QLoRA b4x512). Run from anywhere in the
# repository:
#
#   bash bench/plan/run.sh                            # into docs/benchmarks/plan-cpu/ (the committed run)
#   bash bench/plan/run.sh /tmp/plan-out              # elsewhere
#
# What it does: builds finetune with GOEXPERIMENT=simd into bin/finetune-simd, then runs each case of CASES below
# twice, cold (its own calibration cache, removed first: the fast calibration times the modes) and warm (the
# same cache: the times are read back), under /usr/bin/time -v for the wall time and the maximum resident set
# size, with the 1-minute load average before each run (other work on the machine slows the timings). Each
# run's stdout (the plan), stderr (progress) and time -v report go to OUT/<case>-<cold|warm>.{txt,err,time}, and
# OUT/results.md holds the table. The llama presets are shapes only (no weights are read or made beyond the
# one- and two-block models the fast calibration times). Needs Go (1.27+, or any Go that can fetch 1.27.3) and
# GNU time (/usr/bin/time).
set -euo pipefail
case "$(GOTOOLCHAIN=local go env GOVERSION 2>/dev/null)" in go1.2[0-6] | go1.2[0-6].* | go1.1*) export GOTOOLCHAIN=go1.27.3 ;; esac
cd "$(dirname "$0")/../.."
out=${1:-docs/benchmarks/plan-cpu}
[ -x /usr/bin/time ] || { echo "bench/plan/run.sh: needs GNU time at /usr/bin/time (Debian: apt-get install time)" >&2; exit 1; }
mkdir -p bin "$out"
GOEXPERIMENT=simd go build -o bin/finetune-simd ./cmd/finetune
bin=$PWD/bin/finetune-simd

# name|arguments
CASES=(
	"llama-1b-lora|memory --model llama-1b --method lora --lora-targets all-linear --batch-size 2 --seq-len 512 --budget 7GiB --plan"
	"llama-7b-qlora|memory --model llama-7b --method qlora --lora-targets all-linear --compute-dtype bfloat16 --batch-size 4 --seq-len 512 --budget 16GiB --plan"
	"llama-7b-qlora-h100|memory --model llama-7b --method qlora --lora-targets all-linear --compute-dtype bfloat16 --batch-size 4 --seq-len 512 --budget 16GiB --plan --for-backend xla:cuda"
	"llama-1b-lora-costmodel|memory --model llama-1b --method lora --lora-targets all-linear --batch-size 2 --seq-len 512 --budget 7GiB --plan --calibrate=false"
)

machine="$(nproc) cores, $(awk '/MemTotal/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
{
	echo "# memory --plan at real sizes ($(date -u '+%Y-%m-%d %H:%M UTC'))"
	echo
	echo "machine: $machine; $(git log -1 --format='memfit %h' 2>/dev/null || echo memfit); command: bash bench/plan/run.sh"
	echo "cold: the calibration cache removed first; warm: the same command again. load: the 1-minute load average"
	echo "before the run (2 cores: above 2, other work was taking CPU time from the run)."
	echo
	echo "| case | run | wall | peak RSS | load | step times from | plan |"
	echo "|---|---|---:|---:|---:|---|---|"
} >"$out/results.md.tmp"
for entry in "${CASES[@]}"; do
	name=${entry%%|*}
	args=${entry#*|}
	cache=$(mktemp -d)
	for run in cold warm; do
		load=$(cut -d' ' -f1 /proc/loadavg)
		base="$out/$name-$run"
		echo "bench/plan: $name ($run, load $load): finetune $args" >&2
		# shellcheck disable=SC2086
		XDG_CACHE_HOME=$cache /usr/bin/time -v -o "$base.time" "$bin" $args >"$base.txt" 2>"$base.err" || {
			echo "bench/plan: $name ($run) failed: $(tail -1 "$base.err")" >&2
			exit 1
		}
		wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$base.time")
		rss=$(awk -F': ' '/Maximum resident set size/ {printf "%.2f GiB", $2/1048576}' "$base.time")
		source=$(sed -n 's/^step times: //p' "$base.txt" | cut -c1-90)
		plan=$(sed -n 's/^plan: //p' "$base.txt")
		echo "| $name | $run | $wall | $rss | $load | $source | \`$plan\` |" >>"$out/results.md.tmp"
	done
	rm -rf "$cache"
done
{
	echo
	echo "Commands (finetune = bin/finetune-simd, GOEXPERIMENT=simd):"
	echo
	for entry in "${CASES[@]}"; do echo "- ${entry%%|*}: \`finetune ${entry#*|}\`"; done
	echo
	echo "Each run's plan is in <case>-<run>.txt, its progress in .err, the time -v report in .time."
} >>"$out/results.md.tmp"
mv "$out/results.md.tmp" "$out/results.md"
cat "$out/results.md"
