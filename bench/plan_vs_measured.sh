#!/usr/bin/env bash
# Issue 8's last validation item: `loom plan` predictions of Loom's own measured training runs
# on this machine, calibrated with its measured GEMM, memory and MPI speeds
# (bench/plan_calibrate.sh writes the cluster files).
#
# For each model (tiny; a 14M-parameter GPT-2 shape) and layout (one process at 1 and at all
# cores' threads, DP=2, TP=2, DP=2 + ZeRO-1; ranks at 1 thread each) it runs `loom train` (or
# `loom launch -n 2 -- train`) for STEPS steps, takes the median step_seconds of the steps after
# the first two from metrics.jsonl, runs `loom plan --json` with the same model, layout and
# calibrated cluster, and prints: layout, measured, predicted, error. The last line is one JSON
# object. Asserts nothing (speed is a benchmark's output, not a test's).
#
# Usage: bench/plan_vs_measured.sh [BUILD_DIR] [CLUSTER_DIR]  (defaults: build, configs/plan)
# Env: STEPS (12), MAX_LOAD (1.5: wait up to 60 s per run for the 1-minute load average to
# fall below it; the load at each run's start is printed either way), ONLY (model filter).
set -euo pipefail
build=${1:-build}
clusters=${2:-configs/plan}
loom=$build/loom
steps=${STEPS:-12}
max_load=${MAX_LOAD:-1.5}
cores=$(nproc)
[[ -x $loom ]] || { echo "plan_vs_measured: $loom not built" >&2; exit 1; }
for f in "$clusters/this-machine-1t.toml" "$clusters/this-machine-${cores}t.toml"; do
  [[ -f $f ]] || { echo "plan_vs_measured: $f missing: run bench/plan_calibrate.sh first" >&2; exit 1; }
done
command -v jq > /dev/null || { echo "plan_vs_measured: needs jq" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

wait_for_quiet() {
  for _ in $(seq 1 6); do
    awk -v l="$(cut -d' ' -f1 /proc/loadavg)" -v m="$max_load" 'BEGIN{exit !(l < m)}' && return
    sleep 10
  done
}

# name | shape overrides (the same keys for loom train and loom plan) | micro-batch
models=(
  "tiny|--set model.preset=tiny|8"
  "gpt2-14m|--set model.preset=tiny --set model.n_layer=8 --set model.d_model=384 --set model.n_head=6 --set model.d_ff=1536|4"
)
# name | ranks | threads per rank | [parallel] overrides (both commands)
layouts=(
  "1 proc x 1 thread|1|1|--set parallel.dp=1 --set parallel.zero=0"
  "1 proc x ${cores} threads|1|${cores}|--set parallel.dp=1 --set parallel.zero=0"
  "DP=2|2|1|--set parallel.dp=2 --set parallel.zero=0"
  "TP=2|2|1|--set parallel.tp=2 --set parallel.dp=1"
  "DP=2 ZeRO-1|2|1|--set parallel.dp=2 --set parallel.zero=1"
)

printf "%-9s %-22s %6s %12s %10s %12s %8s\n" model layout load measured_s min_s predicted_s error
rows="[]"
for m in "${models[@]}"; do
  IFS='|' read -r mname mshape mb <<< "$m"
  [[ -n ${ONLY:-} && $mname != "$ONLY" ]] && continue
  for l in "${layouts[@]}"; do
    IFS='|' read -r lname ranks threads lpar <<< "$l"
    out=$work/run
    rm -rf "$out"
    # shellcheck disable=SC2206
    keys=($mshape --set model.vocab=256 --set train.seq_len=128 --set train.micro_batch="$mb" $lpar)
    common=(train "${keys[@]}" --set train.steps="$steps" --set train.threads="$threads"
            --set train.out_dir="$out" --set train.resume=false --set train.log_interval=100
            --set train.eval_interval=0 --set train.checkpoint_interval=0)
    wait_for_quiet
    load=$(cut -d' ' -f1 /proc/loadavg)
    if [[ $ranks == 1 ]]; then
      "$loom" "${common[@]}" > "$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }
    else
      "$loom" launch -n "$ranks" --threads "$threads" -- "${common[@]}" > "$work/log" 2>&1 ||
        { cat "$work/log" >&2; exit 1; }
    fi
    measured=$(jq -s '[.[] | select(.step_seconds != null and .step > 2) | .step_seconds] | sort |
                      if length % 2 == 1 then .[length/2|floor] else (.[length/2-1] + .[length/2]) / 2 end' \
               "$out/metrics.jsonl")
    fastest=$(jq -s '[.[] | select(.step_seconds != null and .step > 2) | .step_seconds] | min' \
              "$out/metrics.jsonl")
    cluster=$clusters/this-machine-1t.toml
    [[ $threads != 1 ]] && cluster=$clusters/this-machine-${threads}t.toml
    # The run's own keys on the calibrated cluster, one rank per planner "GPU".
    predicted=$("$loom" plan --config "$cluster" --json --set cluster.gpus_per_node="$ranks" \
                "${keys[@]}" | jq '.step_time_s')
    err=$(awk -v p="$predicted" -v m="$measured" 'BEGIN{printf "%+.1f%%", (p/m-1)*100}')
    printf "%-9s %-22s %6s %12.4f %10.4f %12.4f %8s\n" "$mname" "$lname" "$load" "$measured" \
      "$fastest" "$predicted" "$err"
    rows=$(jq -c --arg m "$mname" --arg l "$lname" --argjson load "$load" --argjson meas "$measured" --argjson min "$fastest" \
             --argjson pred "$predicted" '. + [{model: $m, layout: $l, load_avg: $load,
             measured_step_s: $meas, fastest_step_s: $min, predicted_step_s: $pred, error: ($pred / $meas - 1)}]' <<< "$rows")
  done
done
jq -c '{plan_vs_measured: ., max_abs_error: (map(.error | fabs) | max),
        within_20pct: (map(.error | fabs) | all(. <= 0.2))}' <<< "$rows"
