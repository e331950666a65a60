#!/usr/bin/env bash
# A checkpoint is served from any working directory. Training names its tokenizer by a path
# relative to where it ran (data.tokenizer = "loom:tok"); the trainer copies it into the
# checkpoints root, so generate and serve from another directory read it there. A checkpoint
# without the copy (as written before it existed) finds the run's path above its run
# directory; with the tokenizer gone everywhere the error names the recorded path.
set -euo pipefail
loom=$1
work=$(mktemp -d)
server=""
cleanup() { [ -n "$server" ] && kill -9 "$server" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$work/train" "$work/elsewhere"
for i in $(seq 40); do
  printf '{"messages": [{"role": "user", "content": "say %s"}, {"role": "assistant", "content": "%s"}]}\n' \
    "$i" "$i" >> "$work/chat.jsonl"
  printf '{"text": "say %s %s"}\n' "$i" "$i" >> "$work/text.jsonl"
done
cd "$work/train"
"$loom" tokenizer train --input "$work/text.jsonl" --vocab-size 300 --special "<|endoftext|>" \
  --special "<|im_start|>" --special "<|im_end|>" --out tok >/dev/null
"$loom" train --set model.preset=tiny-llama --set model.n_layer=1 --set model.d_model=32 \
  --set model.n_head=4 --set model.n_kv_head=2 --set model.d_ff=64 --set model.vocab=320 \
  --set model.max_seq=64 --set data.source=chat --set data.path="$work/chat.jsonl" \
  --set data.tokenizer=loom:tok --set data.chat_template=chatml --set train.steps=2 \
  --set train.micro_batch=2 --set train.seq_len=64 --set train.quiet=true \
  --set train.peak_gflops=1 --set train.out_dir=runs/main >/dev/null
ckpt="$work/train/runs/main/checkpoints"
[ -f "$ckpt/tokenizer/loom_tokenizer_source.json" ] || { echo "no tokenizer copy"; exit 1; }
gen() { "$loom" generate --ckpt "$ckpt" --prompt "say 7" --tokens 6 --temperature 0; }
here=$(gen)
cd "$work/elsewhere"
there=$(gen)
[ "$here" = "$there" ] || { echo "generate differs elsewhere: '$here' vs '$there'"; exit 1; }
echo "generate from another directory: the copied tokenizer"

# serve from here too: a chat completion (the template the copy records) answers.
"$loom" serve --ckpt "$ckpt" --port 0 > "$work/serve.out" 2> "$work/serve.err" &
server=$!
for _ in $(seq 200); do
  grep -q "listening on" "$work/serve.out" 2>/dev/null && break
  sleep 0.1
done
url=$(grep -o 'http://[0-9.:]*' "$work/serve.out" | head -1)
[ -n "$url" ] || { echo "server did not start:"; cat "$work/serve.err"; exit 1; }
code=$(curl -s -o "$work/chat.json" -w '%{http_code}' "$url/v1/chat/completions" \
  -d '{"messages": [{"role": "user", "content": "say 7"}], "max_tokens": 4}')
[ "$code" = 200 ] || { echo "chat completion: HTTP $code"; cat "$work/chat.json"; exit 1; }
kill -TERM "$server"
wait "$server" || { echo "server exited with an error:"; cat "$work/serve.err"; exit 1; }
server=""
echo "serve from another directory: chat completion answered"

# As a checkpoint written before the copy: the run's relative path, found above the run.
rm -rf "$ckpt/tokenizer"
old=$(gen)
[ "$here" = "$old" ] || { echo "generate differs without the copy: '$here' vs '$old'"; exit 1; }
echo "checkpoint without the copy: data.tokenizer resolved against the training directory"
mv "$work/train/tok" "$work/train/tok.gone"
rc=0
gen >/dev/null 2>"$work/err" || rc=$?
if [ $rc -eq 0 ] || ! grep -qF "tok/tokenizer.json" "$work/err"; then
  echo "tokenizer gone: exit $rc"; cat "$work/err"; exit 1
fi
echo "tokenizer gone everywhere: the error names the recorded path"
