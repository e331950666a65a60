#!/usr/bin/env bash
# SentencePiece tokenizer.model files (tests/data/fixtures/spm: a Unigram and a BPE model with
# byte fallback) loaded as Loom tokenizers encode and decode a varied corpus exactly as the
# SentencePiece library does (python3-sentencepiece), with and without <s>.
# Skipped (exit 77) when /usr/bin/python3 has no sentencepiece module or the build has no
# libsentencepiece.
set -euo pipefail
parity=$1 src=$2 have_spm=$3
[ "$have_spm" = 1 ] || { echo "skipped: this build has no libsentencepiece"; exit 77; }
/usr/bin/python3 -c "import sentencepiece" 2>/dev/null ||
  { echo "skipped: python3-sentencepiece not installed"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
corpus="$src/tests/data/hf_tokenizer_corpus.json"
fix="$src/tests/data/fixtures/spm"
timeout 120 /usr/bin/python3 "$src/tests/data/spm_reference.py" "$corpus" "$work/reference.jsonl" \
  "$fix/unigram.model" "$fix/bpe.model"
"$parity" /nonexistent "$corpus" "$work/reference.jsonl"
