#!/usr/bin/env bash
# The pretraining Trainer's throughput from two loom binaries on the same config: a baseline
# (e.g. built from the commit before a refactor) and the one under test, in alternating rounds so
# that a change of the machine's load hits both. Each run is `loom train` on the tiny preset
# (one thread, the built-in byte-level data), and its figure is the median tokens_per_s of its
# metrics rows after the first. Prints every run with the load average before it, each binary's
# median over the rounds [min-max], and the ratio loom / baseline: each round's (its two runs,
# back to back, see nearly the same load), their median [min-max].
#
#   bench/trainer_ab.sh BASELINE_LOOM LOOM [--steps N] [--rounds R] [--threads T]
#   defaults: 80 steps, 3 rounds, 1 thread
set -uo pipefail
base=${1:?usage: trainer_ab.sh BASELINE_LOOM LOOM [--steps N] [--rounds R] [--threads T]}
loom=${2:?usage: trainer_ab.sh BASELINE_LOOM LOOM [--steps N] [--rounds R] [--threads T]}
shift 2
steps=80
rounds=3
threads=1
while [ $# -gt 0 ]; do
  case $1 in
    --steps) steps=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    *) echo "trainer_ab.sh: unknown option $1" >&2; exit 1 ;;
  esac
done
for b in "$base" "$loom"; do
  [ -x "$b" ] || { echo "trainer_ab.sh: no loom binary at $b" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run BINARY NAME: one training run; prints its median tokens/s and appends it to $work/NAME.
run() {
  local out="$work/run_$2" load
  rm -rf "$out"
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  "$1" train --set model.preset=tiny --set train.steps="$steps" --set train.threads="$threads" \
    --set train.quiet=true --set train.tensorboard=false --set train.log_interval=1 \
    --set train.out_dir="$out" --set train.resume=false >/dev/null 2>"$work/err" ||
    { cat "$work/err"; exit 1; }
  local tps
  tps=$(grep -o '"tokens_per_s": *[0-9.e+-]*' "$out/metrics.jsonl" | sed 's/.*: *//' | tail -n +2 |
    sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }')
  echo "$tps" >> "$work/$2"
  printf '%-9s %10.0f tokens/s   (load average before: %s)\n' "$2" "$tps" "$load"
}

summary() {  # NAME: median [min-max] of its runs
  sort -g "$work/$1" | awk '{ v[NR] = $1 } END {
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf "%.0f [%.0f-%.0f]", m, v[1], v[NR] }'
}

echo "loom train, tiny preset, $steps steps, $threads thread(s), $rounds rounds"
for r in $(seq "$rounds"); do
  # The order alternates too, so that neither binary always runs first.
  if [ $((r % 2)) -eq 1 ]; then run "$base" baseline; run "$loom" loom
  else run "$loom" loom; run "$base" baseline; fi
done
printf 'baseline  %s tokens/s (median [min-max])\n' "$(summary baseline)"
printf 'loom      %s tokens/s\n' "$(summary loom)"
paste "$work/loom" "$work/baseline" | awk '{ print $1 / $2 }' > "$work/ratio"
printf 'ratio loom / baseline, per round: %s\n' "$(tr '\n' ' ' < "$work/ratio")"
sort -g "$work/ratio" | awk '{ v[NR] = $1 } END {
  m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
  printf "ratio loom / baseline: %.3f [%.3f-%.3f] (median of the rounds)\n", m, v[1], v[NR] }'
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
