# Sourced by the `loom rl` CLI tests: a tiny chat model taught the "Reverse the words" answer
# format by SFT, as scripts/main.sh does before its GRPO step, at toy size (a BPE vocabulary of
# 320 over the task's words, 2 layers of width 64, 260 SFT steps: ~20% held-out accuracy).
# Needs $loom and $src; leaves the checkpoint in $work/sft_run/checkpoints and removes $work on
# exit. Every run is single-threaded so that two runs of the same job give the same bits.
set -euo pipefail
export OMP_NUM_THREADS=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$src/scripts/sft_data.sh" "$work/sft" 2000 64 >/dev/null
sed 's/.*"content": "\([^"]*\)"}, {"role": "assistant", "content": "\([^"]*\)".*/\1 \2/' \
  "$work/sft/train.jsonl" > "$work/words.txt"
"$loom" tokenizer train --input "$work/words.txt" --vocab-size 320 --out "$work/tok" \
  --special "<|endoftext|>" --special "<|im_start|>" --special "<|im_end|>" >/dev/null 2>&1
"$loom" train --config "$src/configs/main/sft.toml" --set train.pretrained='""' \
  --set model.vocab=320 --set model.n_layer=2 --set model.d_model=64 --set model.n_head=4 \
  --set model.max_seq=64 --set data.path="$work/sft/train.jsonl" --set data.tokenizer="loom:$work/tok" \
  --set train.seq_len=48 --set train.micro_batch=16 --set train.steps=${SFT_STEPS:-260} \
  --set train.eval_interval=1000 --set train.out_dir="$work/sft_run" --set train.peak_gflops=1 \
  --set optim.lr=3e-3 --set train.quiet=true >/dev/null 2>&1
ckpt=$work/sft_run/checkpoints

# expect_fail REGEX CMD...: CMD must exit non-zero and print REGEX.
expect_fail() {
  local regex=$1 out rc
  shift
  set +e
  out=$("$@" 2>&1)
  rc=$?
  set -e
  if [ $rc -eq 0 ]; then echo "expected a failure from: $*"; echo "$out"; exit 1; fi
  if ! grep -qE -- "$regex" <<<"$out"; then
    echo "the output of '$*' (exit $rc) does not match /$regex/:"; echo "$out"; exit 1
  fi
  echo "ok (exit $rc): $(grep -E -- "$regex" <<<"$out" | head -1)"
}

# column FILE KEY: the KEY values of a metrics.jsonl, one a line.
column() { grep -o "\"$2\": [^,}]*" "$1" | sed 's/.*: //'; }

final() { echo "$1/checkpoints/step_$(printf %08d "$2")/model.safetensors"; }
# same_run A B STEPS: two runs' losses, rewards, gradient norms and final weights are equal.
same_run() {
  for k in loss reward_mean grad_norm; do
    if ! diff <(column "$1/metrics.jsonl" $k) <(column "$2/metrics.jsonl" $k) >/dev/null; then
      echo "$1 and $2 differ in $k:"
      paste <(column "$1/metrics.jsonl" $k) <(column "$2/metrics.jsonl" $k)
      exit 1
    fi
  done
  cmp "$(final "$1" "$3")" "$(final "$2" "$3")" || { echo "$1 and $2 end with different weights"; exit 1; }
}
# The GRPO settings every run of the tests shares (4 prompts x 4 replies of at most 12 tokens).
rl=(rl --ckpt "$ckpt" --env reverse --prompts 4 --group 4 --max-tokens 12 --lr 1e-4
    --temperature 0.7 --seed 3)
