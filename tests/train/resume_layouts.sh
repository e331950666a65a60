#!/usr/bin/env bash
# Resume across a change of layout in one train.out_dir, both ways, for every layout the
# checkpoints express: ranks (one process <-> 2 data-parallel ranks), TP, PP and ZeRO stage.
# A run trains 4 steps under layout A; the same directory resumed under layout B must continue
# at step 5 with the losses of B started from A's step-4 checkpoint (train.init_from, after
# `loom ckpt consolidate` for a distributed A), and close to A's own uninterrupted steps 5-6.
# A change between two distributed layouts, another seq_len and another global batch are refused
# naming the difference, and leave the directory's checkpoints as they were.
# resume_layouts.sh LOOM
set -uo pipefail
loom=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
py=/usr/bin/python3
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 200) > "$work/text.txt"
fail() { echo "resume_layouts.sh: $*"; exit 1; }

# Global batch 4 in every layout but dp3: micro_batch 2 x grad_accum x dp; a constant learning
# rate, so that a run of 4 steps continued to 6 follows the run of 6 steps.
layout_args() {
  case $1 in
    one) echo "1 --set train.grad_accum=2" ;;
    dp2) echo "2 --set train.grad_accum=1" ;;
    tp2) echo "2 --set parallel.tp=2 --set train.grad_accum=2" ;;
    pp2) echo "2 --set parallel.pp=2 --set train.grad_accum=2" ;;
    zero1) echo "2 --set parallel.zero=1 --set train.grad_accum=1" ;;
    dp3) echo "3 --set train.grad_accum=1" ;;
  esac
}
# train LAYOUT OUT_DIR STEPS [more --set ...] > log
train() {
  local spec n
  spec=$(layout_args "$1")
  n=${spec%% *}
  # shellcheck disable=SC2086
  local args=(train --set model.family=gpt2 --set model.n_layer=2 --set model.d_model=16
    --set model.n_head=2 --set model.max_seq=16 --set train.seq_len=8 --set train.micro_batch=2
    --set optim.lr=1e-2 --set optim.schedule=constant --set train.peak_gflops=1 --set train.tensorboard=false
    --set data.paths="$work/text.txt" --set train.out_dir="$2" --set train.steps="$3"
    ${spec#* } "${@:4}")
  if [ "$n" = 1 ]; then
    OMP_NUM_THREADS=1 "$loom" "${args[@]}"
  else
    "$loom" launch -n "$n" --threads 1 -- "${args[@]}"
  fi
}
# The losses of steps FROM.. in a metrics log, one per line.
losses() {
  $py -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if "loss" in r and r["step"] >= int(sys.argv[2]): print(r["step"], repr(r["loss"]))' "$1" "$2"
}
# Are two "step loss" lists equal to a relative tolerance?
close() {
  $py -c 'import sys
a = [l.split() for l in sys.argv[1].splitlines()]; b = [l.split() for l in sys.argv[2].splitlines()]
ok = len(a) == len(b) and len(a) > 0 and all(x[0] == y[0] and
     abs(float(x[1]) - float(y[1])) <= float(sys.argv[3]) * abs(float(y[1])) for x, y in zip(a, b))
sys.exit(0 if ok else 1)' "$1" "$2" "$3"
}
# A's uninterrupted steps 5-6, once per layout.
declare -A straight
straight_of() {
  if [ -z "${straight[$1]:-}" ]; then
    train "$1" "$work/straight_$1" 6 >"$work/straight_$1.log" 2>&1 ||
      { cat "$work/straight_$1.log"; fail "uninterrupted $1 run failed"; }
    straight[$1]=$(losses "$work/straight_$1/metrics.jsonl" 5)
  fi
}

continues() {  # A B
  local a=$1 b=$2 d="$work/$1_to_$2"
  train "$a" "$d" 4 >"$d.a.log" 2>&1 || { cat "$d.a.log"; fail "$a: the first run failed"; }
  # The reference: B from A's step 4 through train.init_from in a directory of its own.
  local init="$d/checkpoints"
  if [ "$a" != one ]; then
    "$loom" ckpt consolidate "$d" --out "$work/$a.one" >/dev/null 2>"$d.c.log" ||
      { cat "$d.c.log"; fail "consolidating $a"; }
    init="$work/$a.one"
  fi
  train "$b" "$d.ref" 6 --set train.init_from="$init" >"$d.ref.log" 2>&1 ||
    { cat "$d.ref.log"; fail "$b from $a's checkpoint (train.init_from) failed"; }
  [ "$a" != one ] && rm -rf "$work/$a.one"
  train "$b" "$d" 6 >"$d.b.log" 2>&1 || { cat "$d.b.log"; fail "$a -> $b: the resumed run failed"; }
  local got want
  got=$(losses "$d/metrics.jsonl" 5)
  want=$(losses "$d.ref/metrics.jsonl" 5)
  # It continued (a fresh start of this deterministic run reaches nearly the same losses).
  grep -qE "(started every rank from|resumed from) .* at step 4( |$)" "$d.b.log" ||
    { cat "$d.b.log"; fail "$a -> $b did not continue from step 4"; }
  close "$got" "$want" 0 || fail "$a -> $b: steps 5-6 '$got', from $a's step 4 under $b: '$want'"
  straight_of "$a"
  close "$got" "${straight[$a]}" 1e-4 || fail "$a -> $b: steps 5-6 '$got', $a uninterrupted: '${straight[$a]}'"
  echo "ok: $a -> $b continues at step 5: $(tr '\n' ' ' <<<"$got")"
}

refused() {  # A B PATTERN [more --set for B...]
  local a=$1 b=$2 pattern=$3 d="$work/$1_refuses_$2"
  train "$a" "$d" 4 >"$d.a.log" 2>&1 || { cat "$d.a.log"; fail "$a: the first run failed"; }
  local before rc=0
  before=$(cd "$d/checkpoints" && find . -type f | sort | xargs sha1sum)
  train "$b" "$d" 6 "${@:4}" >"$d.b.log" 2>&1 || rc=$?
  [ $rc -ne 0 ] || { cat "$d.b.log"; fail "$a -> $b ${*:4}: accepted"; }
  grep -qE "$pattern" "$d.b.log" || { cat "$d.b.log"; fail "$a -> $b ${*:4}: no /$pattern/"; }
  [ "$before" = "$(cd "$d/checkpoints" && find . -type f | sort | xargs sha1sum)" ] ||
    fail "$a -> $b ${*:4}: the checkpoints changed"
  echo "ok: $a -> $b ${*:4} refused: $(grep -oE "$pattern" "$d.b.log" | head -1)"
}

for b in dp2 tp2 pp2 zero1; do
  continues one "$b"
  continues "$b" one
done
refused dp2 dp3 "step 4 was committed by 2 ranks, but this run has 3"
refused dp2 tp2 "checkpoint layout 'tp=1 sp=0 cp=1 dp=2 pp=1 zero=0' differs from this run's 'tp=2"
refused dp2 zero1 "checkpoint layout '[^']*zero=0' differs from this run's '[^']*zero=1'"
refused tp2 pp2 "checkpoint layout 'tp=2[^']*' differs from this run's 'tp=1[^']*pp=2"
refused one one "of 8 tokens; this run's is 4 \(2 x 2 x 1\) of 16" --set train.seq_len=16
refused one one "global batch of 4 samples \(micro_batch 2 x grad_accum 2 x dp 1\) of 8 tokens; this run's is 2" --set train.grad_accum=1
refused dp2 dp2 "global batch of 4 samples \(micro_batch 2 x grad_accum 1 x dp 2\) of 8 tokens; this run's is 8" --set train.grad_accum=2
echo "every layout change continued or was refused by name"
