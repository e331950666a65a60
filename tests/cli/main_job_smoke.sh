#!/usr/bin/env bash
# The README's main job at toy size: curate -> BPE vocabulary -> token files -> train ->
# generate -> SFT on the synthetic instruction set -> scored generation -> serve, with every
# step's real command and config (only sizes and paths overridden).
set -euo pipefail
loom=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
html=/usr/share/doc/python3.11/html
[ -d "$html" ] || { echo "python3-doc is not installed (scripts/setup.sh installs it)"; exit 1; }
mkdir -p "$work/html"
cp "$html"/glossary.html "$html"/about.html "$html"/copyright.html "$html"/bugs.html "$work/html/"
cp "$html"/tutorial/*.html "$work/html/"
"$loom" curate --config "$src/configs/main/curate.toml" --set input.paths="[\"$work/html\"]" \
  --set output.dir="$work/curated" --progress 0 >/dev/null
inputs=()
for f in "$work"/curated/kept/*.jsonl; do inputs+=(--input "$f"); done
"$loom" tokenizer train "${inputs[@]}" --vocab-size 1024 --out "$work/tok" \
  --special "<|endoftext|>" --special "<|im_start|>" --special "<|im_end|>" >/dev/null
"$loom" tokenize "${inputs[@]}" --tokenizer "loom:$work/tok" --out "$work/tokens/docs" \
  --append-eod >/dev/null
"$loom" train --config "$src/configs/main/train.toml" --set model.vocab=1024 \
  --set data.prefixes="$work/tokens/docs" --set data.tokenizer="loom:$work/tok" \
  --set data.split=\"90,10,0\" --set train.steps=30 --set train.eval_interval=15 \
  --set train.checkpoint_interval=0 --set train.out_dir="$work/run" --set train.peak_gflops=1 \
  --set train.quiet=true
first=$(grep valid_loss "$work/run/metrics.jsonl" | head -1 | sed 's/.*"valid_loss": \([0-9.]*\).*/\1/')
last=$(grep valid_loss "$work/run/metrics.jsonl" | tail -1 | sed 's/.*"valid_loss": \([0-9.]*\).*/\1/')
echo "validation loss: $first -> $last"
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a && a < 7.0) }' || { echo "validation loss did not fall"; exit 1; }
out=$("$loom" generate --ckpt "$work/run/checkpoints" --prompt "Python" --tokens 20)
[ -n "$out" ] || { echo "empty generation"; exit 1; }
echo "sample: $out"
# Fine-tuning and serving, as the main job runs them.
"$src/scripts/sft_data.sh" "$work/sft" 200 5 >/dev/null
"$loom" train --config "$src/configs/main/sft.toml" --set model.vocab=1024 \
  --set data.path="$work/sft/train.jsonl" --set data.tokenizer="loom:$work/tok" \
  --set train.pretrained="$work/run/checkpoints" --set train.steps=10 --set train.eval_interval=5 \
  --set train.out_dir="$work/sft_run" --set train.peak_gflops=1 --set train.quiet=true
score=$("$loom" generate --ckpt "$work/sft_run/checkpoints" --input "$work/sft/heldout.jsonl" \
  --output "$work/sft/answers.jsonl" --chat-template chatml --temperature 0 --tokens 8 2>/dev/null)
grep -q "exact match: [0-9]*/5" <<<"$score" || { echo "no score: $score"; exit 1; }
[ "$(wc -l < "$work/sft/answers.jsonl")" -eq 5 ] || { echo "missing answers"; exit 1; }
echo "fine-tuned: $score"
"$loom" serve --ckpt "$work/sft_run/checkpoints" --port 0 > "$work/serve.out" 2>"$work/serve.err" &
server=$!
for _ in $(seq 100); do grep -q "listening on" "$work/serve.out" && break; sleep 0.1; done
url=$(grep -o 'http://[0-9.:]*' "$work/serve.out" | head -1)
reply=$(curl -s --max-time 60 "$url/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "user", "content": "Reverse the words: sun tree"}], "max_tokens": 4}')
kill -TERM $server
wait $server
grep -q '"object": "chat.completion"' <<<"$reply" || { echo "bad reply: $reply"; exit 1; }
echo "served: $reply"

