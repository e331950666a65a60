#!/usr/bin/env bash
# `loom generate --speculative ngram` and `--speculative draft` (a smaller model trained beside
# it) on a briefly trained model of repetitive text: greedy and seeded sampled outputs equal
# those without speculation, for a batch of prompts; bad speculative options (a draft of another
# vocabulary included, named by its path) are refused naming the option.
# speculative_generate.sh LOOM
set -uo pipefail
loom=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "speculative_generate.sh: $*"; exit 1; }
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 200) > "$work/text.txt"
timeout 300 "$loom" train --set model.family=gpt2 --set model.n_layer=1 --set model.d_model=32 \
  --set model.n_head=2 --set model.max_seq=96 --set train.seq_len=32 --set train.steps=30 \
  --set train.micro_batch=4 --set train.quiet=true --set train.peak_gflops=1 \
  --set data.paths="$work/text.txt" --set train.out_dir="$work/run" >/dev/null ||
  fail "training the model failed"
# Draft models: one of the target's vocabulary (one layer of 16), one of a wider vocabulary.
train_draft() {
  timeout 300 "$loom" train --set model.family=gpt2 --set model.n_layer=1 --set model.d_model=16 \
    --set model.n_head=2 --set model.max_seq=96 --set train.seq_len=32 --set train.steps=10 \
    --set train.micro_batch=4 --set train.quiet=true --set train.peak_gflops=1 \
    --set data.paths="$work/text.txt" --set train.out_dir="$work/$1" "${@:2}" >/dev/null ||
    fail "training the draft model $1 failed"
}
train_draft draft
train_draft wide --set model.vocab=320
for p in "the quick brown fox" "over the lazy dog. the" "jumps over the" "the lazy"; do
  echo "{\"prompt\": \"$p the quick brown fox jumps\"}"
done > "$work/p.jsonl"
gen() {
  timeout 120 "$loom" generate --ckpt "$work/run/checkpoints" --input "$work/p.jsonl" \
    --tokens 40 --ignore-eos "$@" 2>/dev/null < /dev/null | grep '"index"'
}
for mode in "--temperature 0" "--temperature 1 --top-k 0 --top-p 1 --seed 7"; do
  # shellcheck disable=SC2086
  plain=$(gen $mode --output /dev/stdout) || fail "plain generate ($mode) failed"
  # shellcheck disable=SC2086
  spec=$(gen $mode --speculative ngram --num-speculative-tokens 5 --output /dev/stdout) ||
    fail "speculative generate ($mode) failed"
  [ "$(grep -c '"index"' <<<"$plain")" -eq 4 ] || fail "not 4 results ($mode): $plain"
  [ "$plain" = "$spec" ] || { echo "$plain"; echo "$spec"; fail "outputs differ ($mode)"; }
  echo "ok: $mode: speculative output equals plain output"
  # shellcheck disable=SC2086
  drafted=$(gen $mode --speculative draft --speculative-model "$work/draft/checkpoints" \
    --num-speculative-tokens 3 --output /dev/stdout) || fail "draft generate ($mode) failed"
  [ "$plain" = "$drafted" ] || { echo "$plain"; echo "$drafted"; fail "draft outputs differ ($mode)"; }
  echo "ok: $mode: draft-model speculative output equals plain output"
done
expect_error() {
  local regex=$1
  shift
  local err rc=0
  err=$(timeout 60 "$loom" generate --ckpt "$work/run/checkpoints" --prompt hi --tokens 2 "$@" \
    2>&1 >/dev/null < /dev/null) || rc=$?
  [ $rc -eq 1 ] || fail "$*: exit $rc, expected 1: $err"
  grep -qE -e "$regex" <<<"$err" || fail "$*: stderr does not match /$regex/: $err"
  echo "ok: $* -> $(grep -oE -e "$regex" <<<"$err" | head -1)"
}
expect_error "--speculative: speculative method 'medusa' is not one of: none, ngram, draft" \
  --speculative medusa
expect_error "--speculative-model $work/wide/checkpoints: its vocabulary has 320 tokens" \
  --speculative draft --speculative-model "$work/wide/checkpoints"
expect_error "--speculative draft needs --speculative-model" --speculative draft
expect_error "--speculative-model is the model of --speculative draft" \
  --speculative-model "$work/draft/checkpoints"
expect_error "num-speculative-tokens" --speculative ngram --num-speculative-tokens 0
expect_error "--ngram-prompt-lookup-min \(3\) must not exceed --ngram-prompt-lookup-max \(2\)" \
  --speculative ngram --ngram-prompt-lookup-min 3 --ngram-prompt-lookup-max 2
