#!/usr/bin/env bash
# Two `loom train` on one train.out_dir: the second is refused at once naming the first's pid and
# host, and writes nothing there; after the first is killed (SIGKILL) a new run takes the
# directory and says the previous holder did not end cleanly. A metrics log on a full disk
# (/dev/full) fails the run naming the file.
# run_dir.sh LOOM
set -uo pipefail
loom=$1
work=$(mktemp -d)
trap 'kill -9 $first 2>/dev/null; rm -rf "$work"' EXIT
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 200) > "$work/text.txt"
tiny=(--set model.family=gpt2 --set model.n_layer=1 --set model.d_model=16 --set model.n_head=2
      --set model.max_seq=16 --set train.seq_len=8 --set train.micro_batch=1
      --set train.peak_gflops=1 --set train.threads=1 --set data.paths="$work/text.txt")
train() { "$loom" train "${tiny[@]}" "$@"; }
train_bg() { exec "$loom" train "${tiny[@]}" "$@"; }  # backgrounded: $! is loom's own pid
fail() { echo "run_dir.sh: $*"; exit 1; }

train_bg --set train.steps=1000000 --set train.checkpoint_interval=0 \
  --set train.out_dir="$work/run" >"$work/first.log" 2>&1 &
first=$!
for _ in $(seq 300); do [ -s "$work/run/run.lock" ] && break; sleep 0.1; done
[ -s "$work/run/run.lock" ] || fail "the first run never took $work/run/run.lock"
rc=0
train --set train.steps=2 --set train.out_dir="$work/run" >"$work/second.log" 2>&1 || rc=$?
[ $rc -eq 1 ] || fail "the second run exited $rc, expected 1"
grep -qF "$work/run is in use by another run (pid $first on host $(hostname)" "$work/second.log" ||
  { cat "$work/second.log"; fail "the refusal does not name the holder"; }
kill -0 $first 2>/dev/null || { cat "$work/first.log"; fail "the first run died"; }
echo "ok: $(grep -o 'error: .*' "$work/second.log")"

kill -9 $first
wait $first 2>/dev/null
train --set train.steps=2 --set train.resume=false --set train.out_dir="$work/run" \
  >"$work/third.log" 2>&1 || { cat "$work/third.log"; fail "the run after the kill failed"; }
grep -qF "(pid $first on host $(hostname)" "$work/third.log" &&
  grep -qF "ended without releasing $work/run/run.lock (killed or crashed)" "$work/third.log" ||
  { cat "$work/third.log"; fail "the stale holder is not reported"; }
[ ! -s "$work/run/run.lock" ] || fail "run.lock not emptied at a clean end"
echo "ok: the stale lock of the killed run was reported and taken over"

mkdir -p "$work/full"
ln -s /dev/full "$work/full/metrics.jsonl"
rc=0
train --set train.steps=3 --set train.out_dir="$work/full" >"$work/full.log" 2>&1 || rc=$?
[ $rc -eq 1 ] || { cat "$work/full.log"; fail "a run whose metrics hit /dev/full exited $rc"; }
grep -qF "$work/full/metrics.jsonl: cannot write the metrics log (No space left on device)" \
  "$work/full.log" || { cat "$work/full.log"; fail "the metrics write error is not named"; }
echo "ok: $(grep -o 'error: .*' "$work/full.log")"
