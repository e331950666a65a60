#!/usr/bin/env bash
# GRPO learning end to end, as scripts/main.sh runs it: a tiny chat model first taught the
# answer format by SFT ("Reverse the words: ..."; tests/rl/rl_cli_setup.sh), then 100 GRPO steps
# on the built-in `reverse` task (8 prompts x 8 replies, lr 1e-4, temperature 0.7), synchronous
# and asynchronous (max staleness 1). Held-out accuracy (256 greedy replies to tasks training
# never draws) must rise from the SFT model's to at least 0.25 and by at least 0.08, and the
# training reward of the last 20 steps must exceed the first 20's.
# Measured (2 cores, one thread, load ~3; about 10 s in all): held-out accuracy every 20 steps
#   synchronous      0.191 -> 0.223 0.273 0.309 0.336 0.301   reward 0.037 -> 0.091
#   async, stale. 1  0.191 -> 0.223 0.258 0.285 0.316 0.320   reward 0.035 -> 0.086
# (the asynchronous curve varies a little from run to run: which weights make which step's
# rollouts depends on timing).
loom=$1
src=$2
source "$src/tests/rl/rl_cli_setup.sh"
learn() {  # learn NAME OPTIONS...: one run, then its curve checked
  local out=$work/$1
  shift
  "$loom" rl --ckpt "$ckpt" --env reverse --out "$out" --steps 100 --prompts 8 --group 8 \
    --max-tokens 12 --lr 1e-4 --temperature 0.7 --eval-every 20 --eval-tasks 256 "$@" >/dev/null 2>&1
  local start curve
  start=$(column "$out/metrics.jsonl" heldout_accuracy_initial)
  curve=$(column "$out/metrics.jsonl" heldout_accuracy | tr '\n' ' ')
  echo "$(basename "$out"): held-out accuracy $start -> $curve"
  column "$out/metrics.jsonl" reward_mean | awk -v start="$start" -v curve="$curve" '
    { if (NR <= 20) a += $1 / 20; if (NR > 80) b += $1 / 20 }
    END {
      n = split(curve, c, " "); last = c[n]
      printf "  training reward, first 20 steps %.3f, last 20 %.3f\n", a, b
      if (n != 5) { print "  expected 5 held-out evaluations, got " n; exit 1 }
      if (!(last >= 0.25 && last >= start + 0.08)) {
        print "  FAIL: held-out accuracy " last " (from " start "): below 0.25 or not 0.08 above the start"; exit 1 }
      if (!(b > a)) { print "  FAIL: the training reward did not rise"; exit 1 }
    }'
}
learn sync
learn async1 --async --max-staleness 1 --threads-per-role 1
echo PASS
