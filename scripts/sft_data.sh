#!/usr/bin/env bash
# Writes a synthetic instruction set for the main job's fine-tuning step: "reverse these words"
# with 3 or 4 words from a small list, as chat JSONL (train) and held-out prompts with their
# answers (the held-out word triples never occur in training). Deterministic (awk's srand).
#   scripts/sft_data.sh OUT_DIR [N_TRAIN] [N_HELDOUT]
set -euo pipefail
out=$1 ntrain=${2:-3000} nheld=${3:-100}
mkdir -p "$out"
awk -v ntrain="$ntrain" -v nheld="$nheld" -v dir="$out" 'BEGIN {
  n = split("red blue green cat dog sun moon tree fish bird star rain snow wind fire stone " \
            "river cloud apple bread milk house door book lamp chair road hill sea boat", w, " ")
  srand(7)
  total = ntrain + nheld
  made = 0
  while (made < total) {
    k = 3 + int(rand() * 2)
    s = ""; r = ""
    for (i = 1; i <= k; i++) { p[i] = w[1 + int(rand() * n)]; s = s (i > 1 ? " " : "") p[i] }
    for (i = k; i >= 1; i--) r = r (i < k ? " " : "") p[i]
    if (s in seen) continue
    seen[s] = 1
    made++
    if (made <= nheld) {
      printf "{\"messages\": [{\"role\": \"user\", \"content\": \"Reverse the words: %s\"}], \"answer\": \"%s\"}\n", s, r > (dir "/heldout.jsonl")
    } else {
      printf "{\"messages\": [{\"role\": \"user\", \"content\": \"Reverse the words: %s\"}, {\"role\": \"assistant\", \"content\": \"%s\"}]}\n", s, r > (dir "/train.jsonl")
    }
  }
}'
echo "wrote $(wc -l < "$out/train.jsonl") training and $(wc -l < "$out/heldout.jsonl") held-out examples to $out"
