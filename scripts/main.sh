#!/usr/bin/env bash
# The main job, from raw text on this machine to a trained model and a generated sample:
#   1. curate   the Python documentation's HTML (Debian's python3-doc) -> clean JSONL
#   2. train a byte-level BPE vocabulary on it
#   3. tokenize -> Megatron .bin/.idx token files
#   4. train the tiny preset (validation loss printed as it falls)
#   5. generate a sample from the final checkpoint
#   6. fine-tune it (SFT, ChatML, loss on the replies only) on a synthetic instruction set and
#      score held-out prompts before and after (exact match)
#   7. a few steps of GRPO on the same task with exact-match rewards (loom rl), scored again
#   8. serve the result (bf16 weights) over the OpenAI-compatible HTTP API and ask it once
# No arguments and no downloads beyond Debian packages (installed by scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
LOOM=build/loom

$LOOM curate --config configs/main/curate.toml --restart --progress 0
shards=(runs/main/curated/kept/*.jsonl)
inputs=()
for f in "${shards[@]}"; do inputs+=(--input "$f"); done
$LOOM tokenizer train "${inputs[@]}" --vocab-size 4096 --out runs/main/tokenizer \
  --special "<|endoftext|>" --special "<|im_start|>" --special "<|im_end|>"
$LOOM tokenize "${inputs[@]}" --tokenizer loom:runs/main/tokenizer \
  --out runs/main/tokens/python_docs --append-eod
$LOOM train --config configs/main/train.toml
$LOOM ckpt verify runs/main  # every checkpoint against its checksums
echo
echo "=== sample from runs/main/checkpoints ==="
$LOOM generate --ckpt runs/main/checkpoints --prompt "The Python interpreter" --tokens 120

echo
echo "=== fine-tuning on a synthetic instruction set (\"Reverse the words: ...\") ==="
scripts/sft_data.sh runs/main/sft
rm -f runs/main/sft/base_answers.jsonl runs/main/sft/sft_answers.jsonl  # generate resumes them
echo "held-out prompts, pretrained model:"
$LOOM generate --ckpt runs/main/checkpoints --input runs/main/sft/heldout.jsonl \
  --output runs/main/sft/base_answers.jsonl --chat-template chatml --temperature 0 --tokens 16
$LOOM train --config configs/main/sft.toml
echo "held-out prompts, fine-tuned model:"
$LOOM generate --ckpt runs/main/sft_run/checkpoints --input runs/main/sft/heldout.jsonl \
  --output runs/main/sft/sft_answers.jsonl --chat-template chatml --temperature 0 --tokens 16

echo
echo "=== GRPO: reinforcement learning on the same task, exact-match rewards ==="
rm -rf runs/main/rl runs/main/sft/rl_answers.jsonl
$LOOM rl --ckpt runs/main/sft_run/checkpoints --env reverse --out runs/main/rl --steps 10 \
  --prompts 8 --group 8 --max-tokens 16 --lr 1e-5
echo "held-out prompts, after GRPO:"
$LOOM generate --ckpt runs/main/rl/checkpoints --input runs/main/sft/heldout.jsonl \
  --output runs/main/sft/rl_answers.jsonl --chat-template chatml --temperature 0 --tokens 16

echo
echo "=== serving the fine-tuned model (loom serve, OpenAI-compatible, bf16 weights) ==="
$LOOM serve --ckpt runs/main/rl/checkpoints --port 0 --weights bf16 \
  > runs/main/serve.out 2> runs/main/serve.log &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q "listening on" runs/main/serve.out && break; sleep 0.1; done
url=$(grep -o 'http://[0-9.:]*' runs/main/serve.out | head -1)
request='{"model": "loom", "messages": [{"role": "user", "content": "Reverse the words: sun tree boat"}], "max_tokens": 16, "temperature": 0}'
echo "POST $url/v1/chat/completions $request"
curl -s --max-time 60 "$url/v1/chat/completions" -H 'Content-Type: application/json' -d "$request"
echo
kill -TERM $server
wait $server
trap - EXIT

