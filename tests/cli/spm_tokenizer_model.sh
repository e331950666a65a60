#!/usr/bin/env bash
# A SentencePiece tokenizer.model (tests/data/fixtures/spm/bpe.model) wherever a tokenizer spec
# goes: tokenizer info/encode/decode, loom tokenize, a training run's data.tokenizer, ckpt export
# (written as tokenizer.model), ckpt import of a folder holding only tokenizer.model, generate.
# Skipped (exit 77) when the build has no libsentencepiece.
set -euo pipefail
loom=$1 src=$2
model="$src/tests/data/fixtures/spm/bpe.model"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
if ! "$loom" tokenizer info --vocab "spm:$model" > "$work/info.json" 2> "$work/info.err"; then
  grep -q libsentencepiece "$work/info.err" && { echo "skipped: no libsentencepiece"; exit 77; }
  cat "$work/info.err"; exit 1
fi
grep -q '"model": "SentencePiece"' "$work/info.json" || fail "info: $(cat "$work/info.json")"
text="Loom reads tokenizer.model files: 12345 and ünïcödé"
printf '%s' "$text" | "$loom" tokenizer encode --vocab "$model" > "$work/ids.json"
back=$("$loom" tokenizer decode --vocab "spm:$model" < "$work/ids.json")
[ "$back" = "$text" ] || fail "decode gave '$back'"
echo "tokenizer encode/decode: round trip"

for i in $(seq 80); do
  printf '{"text": "Loom reads tokenizer.model file number %s, then %s more."}\n' "$i" "$i"
done > "$work/text.jsonl"
"$loom" tokenize --input "$work/text.jsonl" --tokenizer "spm:$model" --out "$work/data/text" \
  >/dev/null
mkdir -p "$work/tok"
cp "$model" "$work/tok/tokenizer.model"
"$loom" train --set model.preset=tiny-llama --set model.n_layer=1 --set model.d_model=32 \
  --set model.n_head=4 --set model.n_kv_head=2 --set model.d_ff=64 --set model.vocab=1000 \
  --set model.max_seq=64 --set data.source=tokens --set data.prefixes="$work/data/text" \
  --set data.tokenizer="$work/tok" --set train.steps=2 --set train.micro_batch=2 \
  --set train.seq_len=32 --set train.quiet=true --set train.peak_gflops=1 \
  --set train.out_dir="$work/run" >/dev/null
a=$("$loom" generate --ckpt "$work/run/checkpoints" --prompt "Loom reads" --tokens 6 --temperature 0)
echo "train and generate: data.tokenizer a folder with tokenizer.model"

"$loom" ckpt export "$work/run/checkpoints" --out "$work/hf" >/dev/null
cmp -s "$model" "$work/hf/tokenizer.model" || fail "export did not write tokenizer.model"
[ ! -f "$work/hf/tokenizer.json" ] || fail "export wrote a tokenizer.json"
grep -q '"tokenizer_class": "LlamaTokenizer"' "$work/hf/tokenizer_config.json" ||
  fail "tokenizer_config.json: $(cat "$work/hf/tokenizer_config.json")"
echo "export: tokenizer.model and a LlamaTokenizer config"
"$loom" ckpt import "$work/hf" --out "$work/imported" >/dev/null
cmp -s "$model" "$work/imported/tokenizer/tokenizer.model" || fail "import did not copy it"
grep -rq 'tokenizer = \\"spm:' "$work/imported" || grep -rq 'tokenizer = "spm:' "$work/imported" ||
  fail "import did not name it spm:"
b=$("$loom" generate --ckpt "$work/imported" --prompt "Loom reads" --tokens 6 --temperature 0)
[ "$a" = "$b" ] || fail "generation differs after export/import: '$a' vs '$b'"
echo "import: tokenizer.model kept as spm:ROOT/tokenizer, same greedy text"
