#!/usr/bin/env bash
# 1 against 2 threads of a tiny training run, quiet and beside competing busy processes
# (`yes > /dev/null`, one per --competitors): more threads must never be several times slower
# than one. Prints each run's wall time and the load average before it.
#
#   bench/threads_contention.sh [LOOM] [--steps N] [--competitors K] [--repeat R]
#   defaults: build/loom, 60 steps, 1 competitor, 1 repeat
#
# Extra settings of the runs go in LOOM_BENCH_ENV (e.g. LOOM_BENCH_ENV="GOMP_SPINCOUNT=300000"
# for libgomp's own default spinning, which Loom replaces; docs/training.md, "Threads").
set -uo pipefail
loom=build/loom
steps=60
competitors=1
repeat=1
while [ $# -gt 0 ]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --competitors) competitors=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    *) loom=$1; shift ;;
  esac
done
[ -x "$loom" ] || { echo "threads_contention.sh: no loom binary at $loom" >&2; exit 1; }
work=$(mktemp -d)
pids=()
stop_competitors() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; pids=(); }
trap 'stop_competitors; rm -rf "$work"' EXIT

run() {  # threads label
  local t0 t1
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  env ${LOOM_BENCH_ENV:-} "$loom" train --set model.preset=tiny --set train.steps="$steps" \
    --set train.threads="$1" --set train.quiet=true --set train.peak_gflops=1 \
    --set train.tensorboard=false --set train.out_dir="$work/run_$1" --set train.resume=false \
    >/dev/null 2>"$work/err" || { cat "$work/err"; exit 1; }
  t1=$(date +%s.%N)
  printf '%-22s threads %d  %6.2f s   (load average before: %s)\n' "$2" "$1" \
    "$(echo "$t1 - $t0" | bc)" "$3"
}

for r in $(seq "$repeat"); do
  for t in 1 2; do run "$t" quiet "$(cut -d' ' -f1-3 /proc/loadavg)"; done
  for _ in $(seq "$competitors"); do yes >/dev/null & pids+=($!); done
  sleep 1
  for t in 1 2; do run "$t" "beside $competitors x yes" "$(cut -d' ' -f1-3 /proc/loadavg)"; done
  stop_competitors
done
