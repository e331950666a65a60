#!/usr/bin/env bash
# `loom generate --input` with outputs that are not regular files: /dev/stdout into a pipe ends
# with every result on the pipe, /dev/full fails at once naming the file with bounded memory;
# and a regular output file cut mid-line by a crash is completed by a rerun.
# generate_output.sh LOOM
set -uo pipefail
loom=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "generate_output.sh: $*"; exit 1; }
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 200) > "$work/text.txt"
"$loom" train --set model.family=gpt2 --set model.n_layer=1 --set model.d_model=16 \
  --set model.n_head=2 --set model.max_seq=32 --set train.seq_len=16 --set train.steps=2 \
  --set train.micro_batch=2 --set train.quiet=true --set train.peak_gflops=1 \
  --set data.paths="$work/text.txt" --set train.out_dir="$work/run" >/dev/null ||
  fail "training the model failed"
for i in 1 2 3; do echo "{\"prompt\": \"the $i\"}"; done > "$work/p.jsonl"
gen() { "$loom" generate --ckpt "$work/run/checkpoints" --input "$work/p.jsonl" --tokens 4 "$@"; }

rc=0
timeout 60 "$loom" generate --ckpt "$work/run/checkpoints" --input "$work/p.jsonl" --tokens 4 \
  --output /dev/stdout 2>"$work/piped.err" | cat >"$work/piped" || rc=$?
[ $rc -eq 0 ] || { cat "$work/piped.err"; fail "--output /dev/stdout | cat: exit $rc (124: hung)"; }
[ "$(grep -c '"index"' "$work/piped")" -eq 3 ] || { cat "$work/piped"; fail "not 3 results on the pipe"; }
echo "ok: --output /dev/stdout | cat wrote 3 results"

rc=0
/usr/bin/time -f '%M' -o "$work/rss" timeout 60 "$loom" generate --ckpt "$work/run/checkpoints" \
  --input "$work/p.jsonl" --tokens 4 --output /dev/full 2>"$work/full.err" >/dev/null || rc=$?
[ $rc -eq 1 ] || { cat "$work/full.err"; fail "--output /dev/full: exit $rc, expected 1"; }
grep -qF "cannot write /dev/full: No space left on device" "$work/full.err" ||
  { cat "$work/full.err"; fail "--output /dev/full: the error does not name the file"; }
rss_kb=$(tail -1 "$work/rss")
[ "$rss_kb" -lt 300000 ] || fail "--output /dev/full peaked at $rss_kb KB"
echo "ok: --output /dev/full failed at once ($(grep -o 'error: .*' "$work/full.err"), peak RSS ${rss_kb} KB)"

gen --output "$work/out.jsonl" 2>/dev/null >/dev/null || fail "generating into a file failed"
first=$(head -1 "$work/out.jsonl")
{ echo "$first"; printf '{"index": 1, "te'; } > "$work/cut.jsonl"
gen --output "$work/cut.jsonl" 2>/dev/null >/dev/null || fail "the rerun after a cut line failed"
[ "$(head -1 "$work/cut.jsonl")" = "$first" ] || fail "the rerun rewrote the finished line"
/usr/bin/python3 -c 'import json,sys
rows = [json.loads(l) for l in open(sys.argv[1], errors="replace")]  # the structure
assert [r["index"] for r in rows] == [0, 1, 2], rows' "$work/cut.jsonl" ||
  { cat "$work/cut.jsonl"; fail "the rerun did not complete the cut file"; }
echo "ok: a cut last line was replaced by its whole result"
