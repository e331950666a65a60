#!/usr/bin/env bash
# `loom ckpt consolidate` end to end: a 2-rank ZeRO-1 / ZeRO-3 / tensor-parallel (TP2 with
# sequence parallelism) run's per-rank checkpoints become one checkpoint with exactly the tensors
# of a one-process run's, which export and generate read; a run with expert tensor parallelism is
# refused with a message saying why, and nothing is written.
set -euo pipefail
loom=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 200) > "$work/text.txt"
tiny=(--set model.n_layer=2 --set model.d_model=32 --set model.n_head=2 --set model.max_seq=32
      --set train.seq_len=16 --set train.steps=3 --set train.micro_batch=2 --set train.quiet=true
      --set train.peak_gflops=1 --set data.paths="$work/text.txt")
tensors() { "$loom" ckpt inspect "$1" | grep '^    '; }  # the tensor rows: name, dtype, shape

"$loom" train "${tiny[@]}" --set train.grad_accum=2 --set train.out_dir="$work/one" >/dev/null
for layout in zero1 zero3 tp2; do
  run="$work/$layout"
  case $layout in
    zero1) par=(--set parallel.zero=1) ;;
    zero3) par=(--set parallel.zero=3) ;;
    tp2) par=(--set parallel.tp=2 --set parallel.sp=true) ;;
  esac
  "$loom" launch -n 2 -- train "${tiny[@]}" "${par[@]}" --set train.out_dir="$run" >/dev/null
  "$loom" ckpt consolidate "$run" --out "$run-one"
  if ! diff <(tensors "$work/one/checkpoints") <(tensors "$run-one"); then
    echo "$layout: the consolidated checkpoint's tensors differ from a one-process run's"
    exit 1
  fi
  "$loom" ckpt export "$run-one" --out "$run-hf" >/dev/null
  test -s "$run-hf/model.safetensors"
  text=$("$loom" generate --ckpt "$run-one" --prompt "the " --tokens 12 --temperature 0)
  if [ -z "$text" ]; then echo "$layout: generate printed nothing"; exit 1; fi
  echo "$layout: consolidated, exported and generated"
done

"$loom" launch -n 2 -- train "${tiny[@]}" --set model.n_experts=4 --set parallel.tp=2 \
  --set parallel.etp=2 --set train.out_dir="$work/etp" >/dev/null
if "$loom" ckpt consolidate "$work/etp" --out "$work/etp-one" 2>"$work/err"; then
  echo "an expert-tensor-parallel run was consolidated"; exit 1
fi
grep -q "expert tensor parallelism" "$work/err" || { cat "$work/err"; exit 1; }
if [ -e "$work/etp-one" ]; then echo "a refused consolidation wrote $work/etp-one"; exit 1; fi
echo "expert tensor parallelism refused: $(head -c 200 "$work/err")"
