#!/usr/bin/env bash
# `loom rl` against a scoring service that never answers (nothing listens on its port): every
# group is dropped, and the run fails naming the cause instead of exiting 0 with reward 0.
loom=$1
src=$2
SFT_STEPS=4 source "$src/tests/rl/rl_cli_setup.sh"
expect_fail "every group of the run's 2 step\(s\) was dropped \(8 for environment errors, 0 past --rollout-timeout, 0 past --max-staleness\); environment http://127.0.0.1:9/score: 8 calls, 8 failed" \
  "$loom" rl --ckpt "$ckpt" --env http --env-url http://127.0.0.1:9/score --env-retries 0 \
  --env-timeout 1 --prompts 4 --group 2 --max-tokens 4 --steps 2 --out "$work/dropped"
[ ! -e "$work/dropped/checkpoints" ] || { echo "a checkpoint was written"; exit 1; }
