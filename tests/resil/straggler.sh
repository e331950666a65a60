#!/usr/bin/env bash
# A 2-rank tiny training run under `loom launch` with rank 1's data section slowed by 150 ms a
# step (LOOM_SLOW_RANK): the supervisor must name rank 1 as a straggler, in the log and in
# supervisor.jsonl, and never rank 0, which spends that time waiting for it in a collective.
set -euo pipefail
loom=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 200) > "$work/text.txt"
tiny=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=2 --set model.max_seq=32
      --set train.seq_len=16 --set train.steps=12 --set train.micro_batch=2 --set train.quiet=true
      --set train.peak_gflops=1 --set data.paths="$work/text.txt" --set train.out_dir="$work/run")
if ! LOOM_SLOW_RANK=1:150 "$loom" launch -n 2 --straggler-patience 4 -- train "${tiny[@]}" \
    >"$work/out" 2>"$work/err"; then
  cat "$work/out" "$work/err"; exit 1
fi
cat "$work/err"
grep -q "straggler: rank 1 at step [0-9]*: score 0\.[0-9]*" "$work/err" || {
  echo "rank 1 was not named a straggler"; exit 1; }
if grep -q "straggler: rank 0" "$work/err"; then echo "rank 0 was named"; exit 1; fi
events="$work/run/supervisor.jsonl"
grep '"event": "straggler"' "$events" | grep '"rank": 1' | grep -q '"section": "data"' || {
  echo "no straggler event for rank 1 in $events:"; cat "$events"; exit 1; }
if grep '"event": "straggler' "$events" | grep -q '"rank": 0'; then
  echo "rank 0 appears as a straggler in $events"; exit 1
fi
echo "rank 1 named a straggler; rank 0 not"
