#!/usr/bin/env bash
# --kv-cache-dtype on the three engine commands: a value Loom does not know is refused naming the
# flag and the choices (before any file is read), and `loom bench serve --decode` on a random
# tiny model runs with every stored type, its pool holding 2x (bf16) and 4D/(D+1)x (fp8) the
# blocks of fp32's in the same --kv-cache-mb.
# kv_cache_dtype.sh LOOM
set -uo pipefail
loom=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "kv_cache_dtype.sh: $*"; exit 1; }
expect_error() {
  local err rc=0
  err=$(timeout 60 "$loom" "$@" 2>&1 >/dev/null < /dev/null) || rc=$?
  [ $rc -eq 1 ] || fail "$*: exit $rc, expected 1: $err"
  grep -qF -e "--kv-cache-dtype: unknown KV cache dtype '$bad' (auto, fp32, bf16 or fp8)" <<<"$err" ||
    fail "$*: stderr does not name the flag and the choices: $err"
  echo "ok: $* refused"
}
for bad in fp16 FP8 int8 ""; do
  expect_error generate --ckpt "$work/none" --prompt hi --kv-cache-dtype "$bad"
  expect_error serve --ckpt "$work/none" --port 0 --kv-cache-dtype "$bad"
  expect_error bench serve --decode --no-load --preset tiny --kv-cache-dtype "$bad"
done
for kv in auto fp32 bf16 fp8; do
  timeout 300 "$loom" bench serve --decode --no-load --preset tiny --threads 1 --input-len 16 \
    --output-len 8 --streams 2 --kv-cache-mb 8 --kv-cache-dtype "$kv" --json "$work/$kv.json" \
    > "$work/$kv.log" 2>&1 < /dev/null || { cat "$work/$kv.log"; fail "bench serve with $kv"; }
done
/usr/bin/python3 - "$work" <<'PY' || fail "capacities"
import json, sys
w = sys.argv[1]
d = {k: json.load(open(f"{w}/{k}.json"))["decode"] for k in ("auto", "fp32", "bf16", "fp8")}
for k, j in d.items():
    assert j["streams_aggregate_tokens_per_s"] > 0, (k, j)
assert d["auto"]["kv_cache_dtype"] == "fp32" and d["fp8"]["kv_cache_dtype"] == "fp8", d
b = {k: j["kv_blocks"] for k, j in d.items()}
assert b["auto"] == b["fp32"] and b["bf16"] in (2 * b["fp32"], 2 * b["fp32"] + 1), b
assert 3.7 * b["fp32"] <= b["fp8"] <= 4 * b["fp32"] + 3, b
print("ok: blocks in 8 MB:", b)
PY
