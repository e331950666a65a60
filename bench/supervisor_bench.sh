#!/usr/bin/env bash
# The supervisor's figures, for a 2-rank `loom launch` run of MODEL (default gpt2-124m,
# seq 128, one sequence per rank, ZeRO-1, a checkpoint every 2 steps):
#  1. overhead: the median step_seconds (steps after the first two) with heartbeats off and on;
#  2. hang detection: SIGSTOP rank 1, time until the supervisor's "hung" event, against the
#     calibrated timeout it states (target: under 2x);
#  3. restart: kill -9 rank 0, time until the next attempt's first step ends (target: < 30 s),
#     and until the death was detected.
# Prints the load average beside the figures; the last line is one JSON object. Asserts
# nothing (speed is a benchmark's output). Usage: bench/supervisor_bench.sh [BUILD_DIR] [MODEL]
# Env: STEPS (10, overhead runs), SEQ (128).
set -euo pipefail
build=${1:-build}
model=${2:-gpt2-124m}
loom=$build/loom
steps=${STEPS:-10}
seq=${SEQ:-128}
work=$(mktemp -d)
sup=
cleanup() {
  if [ -n "$sup" ] && kill -0 "$sup" 2>/dev/null; then kill -TERM "$sup"; wait "$sup" || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
export OMP_NUM_THREADS=1
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 4000) > "$work/text.txt"
cfg=(--set model.preset="$model" --set train.seq_len=$seq --set train.micro_batch=1
     --set train.quiet=true --set train.peak_gflops=1 --set data.paths="$work/text.txt"
     --set parallel.zero=1 --set train.keep_last=2)
load() { cut -d' ' -f1-3 /proc/loadavg; }
now_ms() { date +%s%3N; }
median_step() {
  jq -s '[.[] | select(.step_seconds != null and .step > 2) | .step_seconds] | sort |
         if length == 0 then null else .[length / 2 | floor] end' "$1/metrics.jsonl"
}

# 1. Overhead: off, on, off, on (alternating, so a drift in the machine's load hits both).
declare -A med
for run in off1 on1 off2 on2; do
  hb=${run%?}
  l=$(load)
  "$loom" launch -n 2 --heartbeats "$hb" -- train "${cfg[@]}" --set train.steps=$steps \
    --set train.out_dir="$work/$run" >/dev/null 2>&1
  med[$run]=$(median_step "$work/$run")
  echo "overhead run $run: median step ${med[$run]} s (load $l)"
done
overhead=$(jq -n "((${med[on1]} + ${med[on2]}) / (${med[off1]} + ${med[off2]}) - 1) * 100")
echo "heartbeats on vs off: ${overhead} % of step time"

# 2 and 3. One supervised run: SIGSTOP rank 1 once steps run; after the restart, kill -9 rank 0.
events="$work/faults/supervisor.jsonl"
"$loom" launch -n 2 --max-restarts 2 --backoff 0.5 -- train "${cfg[@]}" --set train.steps=1000 \
  --set train.checkpoint_interval=2 --set train.out_dir="$work/faults" \
  >"$work/out" 2>"$work/err" &
sup=$!
ev() { cat "$events" 2>/dev/null | grep "\"event\": \"$1\"" | grep "\"attempt\": $2," || true; }
field() { sed -n "s/.*\"$1\": \\([0-9.]*\\).*/\\1/p" | tail -1; }
wait_for() {  # wait_for EVENT ATTEMPT [COUNT]: up to 20 minutes
  for _ in $(seq 12000); do
    [ "$(ev "$1" "$2" | wc -l)" -ge "${3:-1}" ] && return 0
    kill -0 $sup 2>/dev/null || { echo "the run ended early"; cat "$work/err"; exit 1; }
    sleep 0.1
  done
  echo "timed out waiting for $1 in attempt $2"; exit 1
}
# Past the first checkpoint and a few steps, so the timeouts are calibrated.
wait_for rank_up 0 2
until ls "$work"/faults/checkpoints/rank_00001/step_00000004 >/dev/null 2>&1; do
  kill -0 $sup || exit 1; sleep 0.2
done
sleep 1
pid1=$(ev rank_up 0 | grep '"rank": 1,' | field pid)
l=$(load)
t_stop=$(now_ms)
kill -STOP "$pid1"
wait_for hung 0
t_hung=$(ev hung 0 | field time_ms)
timeout=$(ev hung 0 | sed -n 's/.*timeout \([0-9.]*\) s.*/\1/p')
detect=$(jq -n "($t_hung - $t_stop) / 1000")
echo "hang: detected in $detect s; calibrated timeout $timeout s; ratio $(jq -n "$detect / $timeout") (load $l)"

wait_for rank_up 1 2
wait_for first_step 1
sleep 2
pid0=$(ev rank_up 1 | grep '"rank": 0,' | field pid)
l=$(load)
t_kill=$(now_ms)
kill -KILL "$pid0"
wait_for first_step 2
t_died=$(ev died 1 | field time_ms)
t_first=$(ev first_step 2 | field time_ms)
died=$(jq -n "(${t_died:-$t_kill} - $t_kill) / 1000")
restart=$(jq -n "($t_first - $t_kill) / 1000")
echo "crash: detected in $died s; kill to the first step of the restarted job: $restart s (load $l)"
kill -TERM $sup; wait $sup || true; sup=
jq -cn --arg model "$model" --argjson seq "$seq" --argjson overhead_pct "$overhead" \
  --argjson hang_detect_s "$detect" --argjson hang_timeout_s "$timeout" \
  --argjson crash_detect_s "$died" --argjson kill_to_first_step_s "$restart" \
  --arg load "$(load)" '$ARGS.named'
