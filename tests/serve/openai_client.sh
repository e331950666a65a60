#!/usr/bin/env bash
# Serves a tiny chat model trained here and drives it with the official `openai` npm client
# (openai_client.mjs, or the script given as a 4th argument, e.g. openai_tools.mjs).
# Skipped (exit 77) when node or npm is missing or the npm registry cannot be reached.
set -euo pipefail
loom=$1 src=$2 npm_cache=$3 script=${4:-openai_client.mjs}
command -v node >/dev/null && command -v npm >/dev/null || { echo "skipped: node/npm not found"; exit 77; }
work=$(mktemp -d)
server=""
cleanup() { [ -n "$server" ] && kill -9 "$server" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
if [ ! -d "$npm_cache/node_modules/openai" ]; then
  mkdir -p "$npm_cache"
  (cd "$npm_cache" && timeout 180 npm install openai@4 --no-audit --no-fund --silent >/dev/null 2>&1) ||
    { echo "skipped: npm install openai failed (no registry?)"; exit 77; }
fi
# Chat data, a tokenizer with ChatML's markers, and a few training steps.
for i in $(seq 60); do
  w=$(printf 'abcdefgh' | fold -w1 | shuf --random-source=<(yes $i) | head -4 | tr -d '\n')
  printf '{"messages": [{"role": "user", "content": "reverse %s"}, {"role": "assistant", "content": "%s"}]}\n' \
    "$w" "$(rev <<<"$w")" >> "$work/chat.jsonl"
  printf '{"text": "reverse %s %s"}\n' "$w" "$(rev <<<"$w")" >> "$work/text.jsonl"
done
"$loom" tokenizer train --input "$work/text.jsonl" --vocab-size 300 --special "<|endoftext|>" \
  --special "<|im_start|>" --special "<|im_end|>" --out "$work/tok" >/dev/null
"$loom" train --set model.preset=tiny-llama --set model.n_layer=2 --set model.d_model=32 \
  --set model.n_head=4 --set model.n_kv_head=2 --set model.d_ff=64 --set model.vocab=320 \
  --set model.max_seq=2048 --set data.source=chat --set data.path="$work/chat.jsonl" \
  --set data.tokenizer="loom:$work/tok" --set train.steps=5 --set train.micro_batch=2 \
  --set train.seq_len=64 --set train.quiet=true --set train.peak_gflops=1 \
  --set train.out_dir="$work/run" >/dev/null
"$loom" serve --ckpt "$work/run/checkpoints" --port 0 --served-model-name loom alias > "$work/serve.out" 2> "$work/serve.err" &
server=$!
for _ in $(seq 100); do
  grep -q "listening on" "$work/serve.out" 2>/dev/null && break
  sleep 0.1
done
url=$(grep -o 'http://[0-9.:]*' "$work/serve.out" | head -1)
[ -n "$url" ] || { echo "server did not start:"; cat "$work/serve.err"; exit 1; }
cp "$src/tests/serve/$script" "$npm_cache/"
(cd "$npm_cache" && timeout 180 node "$script" "$url/v1")
kill -TERM "$server"
for _ in $(seq 100); do kill -0 "$server" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$server" 2>/dev/null; then echo "server did not stop on SIGTERM"; exit 1; fi
wait "$server" || { echo "server exited with an error:"; cat "$work/serve.err"; exit 1; }
server=""
echo "SIGTERM: drained and exited 0"
