#!/usr/bin/env bash
# The main job, from raw text on this machine to a trained model and a generated sample:
#   1. curate   the Python documentation's HTML (Debian's python3-doc) -> clean JSONL
#   2. train a byte-level BPE vocabulary on it
#   3. tokenize -> Megatron .bin/.idx token files
#   4. train the tiny preset (validation loss printed as it falls)
#   5. generate a sample from the final checkpoint
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
echo
echo "=== sample from runs/main/checkpoints ==="
$LOOM generate --ckpt runs/main/checkpoints --prompt "The Python interpreter" --tokens 120
