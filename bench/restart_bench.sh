#!/usr/bin/env bash
# restart_bench.sh LOOM: kill -9 rank 0 of a supervised 2-rank gpt2-124m run one second after its
# first committed checkpoint and print the supervisor's events (kill time in ms, then the
# attempts' start, rank_up with set-up/restore seconds, died, restart and first_step): kill to
# the restarted job's first step is first_step(attempt 1) - "kill at".
set -u
loom=$1; w=$(mktemp -d)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 4000) > "$w/text.txt"
"$loom" launch -n 2 --max-restarts 1 -- train --set model.preset=gpt2-124m --set train.seq_len=128 \
  --set train.micro_batch=1 --set train.quiet=true --set train.peak_gflops=1 --set data.paths="$w/text.txt" \
  --set parallel.zero=1 --set train.keep_last=2 --set train.steps=1000 --set train.checkpoint_interval=2 \
  --set train.out_dir="$w/run" > "$w/out" 2> "$w/err" &
sup=$!
ev="$w/run/supervisor.jsonl"
until ls "$w/run/checkpoints/committed/" 2>/dev/null | grep -q step_; do sleep 0.2; kill -0 $sup || exit 1; done
sleep 1
pid0=$(grep '"rank_up"' "$ev" | grep '"rank": 0,' | sed -n 's/.*"pid": \([0-9]*\).*/\1/p' | tail -1)
echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
t_kill=$(date +%s%3N); kill -KILL $pid0
for _ in $(seq 1500); do grep -q '"first_step".*"attempt": 1,\|"attempt": 1,.*"first_step"' "$ev" && break; sleep 0.2; done
echo "kill at $t_kill"; cat "$ev" | grep -v straggler | tail -12
kill -TERM $sup; wait $sup
rm -rf "$w"
