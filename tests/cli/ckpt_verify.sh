#!/usr/bin/env bash
# `loom ckpt verify`: a run's checkpoints all verify (exit 0); with 64 bytes flipped in one and
# another truncated, each bad one is named and the exit status is 1; generate then falls back to
# the newest intact checkpoint with a warning naming the skipped step and file.
set -euo pipefail
loom=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 200) > "$work/text.txt"
"$loom" train --set model.n_layer=2 --set model.d_model=32 --set model.n_head=2 \
  --set model.max_seq=32 --set train.seq_len=16 --set train.steps=3 --set train.micro_batch=2 \
  --set train.quiet=true --set train.peak_gflops=1 --set train.checkpoint_interval=1 \
  --set data.paths="$work/text.txt" --set train.out_dir="$work/run" >/dev/null
ck=$work/run/checkpoints
out=$("$loom" ckpt verify "$work/run")
grep -q "3 checkpoints verified" <<<"$out" || { echo "expected 3 verified:"; echo "$out"; exit 1; }

# 64 bytes of step 2's optimizer state overwritten, 100 bytes cut off step 3's model file.
optim=$ck/step_00000002/optim.safetensors
size=$(stat -c %s "$optim")
head -c 64 /dev/zero | tr '\0' '\377' | dd of="$optim" bs=1 seek=$((size - 300)) conv=notrunc status=none
truncate -s -100 "$ck/step_00000003/model.safetensors"

set +e
out=$("$loom" ckpt verify "$work/run" 2>"$work/err")
rc=$?
set -e
[ $rc -eq 1 ] || { echo "expected exit status 1, got $rc"; echo "$out"; exit 1; }
grep -q "^BAD $ck/step_00000002: .*optim.safetensors: tensor '.*': checksum" <<<"$out" ||
  { echo "step 2 not named:"; echo "$out"; exit 1; }
grep -q "^BAD $ck/step_00000003: .*model.safetensors" <<<"$out" ||
  { echo "step 3 not named:"; echo "$out"; exit 1; }
grep -q "^ok  $ck/step_00000001 (step 1)" <<<"$out" || { echo "step 1 not ok:"; echo "$out"; exit 1; }
grep -q "2 of 3 checkpoints under .* failed verification" "$work/err" ||
  { echo "no summary on stderr:"; cat "$work/err"; exit 1; }
# One step directory on its own.
set +e
"$loom" ckpt verify "$ck/step_00000002" >/dev/null 2>&1
rc=$?
set -e
[ $rc -eq 1 ] || { echo "a bad step directory verified (exit $rc)"; exit 1; }

# Loading the run's root skips both bad checkpoints, saying which and why.
"$loom" generate --ckpt "$ck" --prompt "the " --tokens 4 --temperature 0 >/dev/null 2>"$work/gen_err"
grep -q "checkpoint step 3 skipped: .*model.safetensors" "$work/gen_err" &&
  grep -q "checkpoint step 2 skipped: .*optim.safetensors" "$work/gen_err" ||
  { echo "no fall-back warnings:"; cat "$work/gen_err"; exit 1; }
echo "ok: bad checkpoints named, generate fell back to step 1"
