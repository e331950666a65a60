#!/usr/bin/env bash
# Gemma 1, 2 and 3 as a user meets them: a small random model of each in transformers' layout,
# written by the torch reference (tests/ckpt/hf_reference.py; Gemma 2 with soft-caps that bind,
# Gemma 2 and 3 with windows of 8 positions), imported with `loom ckpt import`, sampled from with
# `loom generate` past the window, fine-tuned (a LoRA SFT step, then 8 full SFT steps whose
# loss falls) and exported again, the export giving the reference the same logits (within
# 1e-5: the norm weights go through Loom's offset from 1 in fp32).
# Exits 77 (skipped) when Debian's python3-torch is missing.
set -euo pipefail
loom=$1
ref=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
py=/usr/bin/python3
if ! "$py" -c 'import torch' 2>/dev/null; then
  echo "skipped: $py cannot import torch (Debian's python3-torch, installed by scripts/setup.sh)"
  exit 77
fi

for i in $(seq 40); do
  w=$(printf 'w%03d' "$i")
  echo "{\"messages\": [{\"role\": \"user\", \"content\": \"say $w\"}, {\"role\": \"assistant\", \"content\": \"$w $w\"}]}"
done > "$work/chat.jsonl"
for i in $(seq 40); do printf 'user assistant say w%03d w%03d\n' "$i" "$i"; done > "$work/corpus.txt"
"$loom" tokenizer train --input "$work/corpus.txt" --vocab-size 300 --special "<|endoftext|>" \
  --special "<|im_start|>" --special "<|im_end|>" --out "$work/tok" >/dev/null 2>&1

# The reference's shapes (hf_reference.py make_gemma).
model=(--set model.preset=tiny-llama --set model.n_layer=2 --set model.d_model=32
  --set model.n_head=4 --set model.n_kv_head=2 --set model.head_dim=16 --set model.d_ff=48
  --set model.vocab=320 --set model.max_seq=128 --set model.norm_eps=1e-6 --set model.tied=true
  --set model.geglu=true --set model.embed_scale=true --set model.rope_theta=10000)
sandwich=(--set model.n_layer=4 --set model.sandwich_norm=true --set model.sliding_window=8
  --set model.attn_scalar=24)
common=(--set train.micro_batch=2 --set train.seq_len=32 --set train.quiet=true
  --set train.peak_gflops=1 --set data.source=chat --set data.path="$work/chat.jsonl"
  --set data.tokenizer="loom:$work/tok")
for fam in gemma gemma2 gemma3_text; do
  case $fam in
    gemma) opts=() ;;
    gemma2) opts=("${sandwich[@]}" --set model.window_pattern=2 --set model.attn_softcap=1.5
      --set model.final_softcap=3) ;;
    gemma3_text) opts=("${sandwich[@]}" --set model.window_pattern=3 --set model.qk_norm=true
      --set model.rope_theta=1000000 --set model.rope_local_theta=10000) ;;
  esac
  "$py" "$ref" make "$work/$fam" "$fam" 3
  "$loom" ckpt import "$work/$fam" --out "$work/$fam-ckpt" >/dev/null
  out=$("$loom" generate --ckpt "$work/$fam-ckpt" --prompt "say w007" --tokens 16 --temperature 0 \
    --tokenizer "loom:$work/tok")
  [ -n "$out" ] || fail "$fam: generate printed nothing"
  "$loom" train "${model[@]}" "${opts[@]}" "${common[@]}" --set train.steps=1 \
    --set train.pretrained="$work/$fam-ckpt" --set lora.rank=4 --set lora.alpha=8 \
    --set train.out_dir="$work/$fam-lora" >/dev/null
  "$loom" generate --ckpt "$work/$fam-lora/checkpoints" --prompt "say w007" --tokens 8 \
    --temperature 0 --tokenizer "loom:$work/tok" >/dev/null
  "$loom" train "${model[@]}" "${opts[@]}" "${common[@]}" --set train.steps=8 \
    --set optim.lr=3e-3 --set train.init_from="$work/$fam-ckpt" \
    --set train.out_dir="$work/$fam-sft" >/dev/null
  losses=$(grep '"loss"' "$work/$fam-sft/metrics.jsonl" | sed 's/.*"loss": \([-0-9.e]*\).*/\1/')
  first=$(echo "$losses" | head -1)
  last=$(echo "$losses" | tail -1)
  awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' ||
    fail "$fam: the SFT loss did not fall ($first -> $last)"
  "$loom" generate --ckpt "$work/$fam-sft/checkpoints" --prompt "say w007" --tokens 16 \
    --temperature 0 --tokenizer "loom:$work/tok" >/dev/null
  "$loom" ckpt export "$work/$fam-ckpt" --out "$work/$fam-again" --tokenizer none >/dev/null
  grep -q "\"model_type\": \"$fam\"" "$work/$fam-again/config.json" ||
    fail "$fam: the export's config.json names another model_type"
  "$py" "$ref" logits "$work/$fam" 5,9,200,17,3,44,81,2,9,100,7,7,300 "$work/a.bin"
  "$py" "$ref" logits "$work/$fam-again" 5,9,200,17,3,44,81,2,9,100,7,7,300 "$work/b.bin"
  "$py" -c '
import struct, sys
a, b = (open(f, "rb").read() for f in sys.argv[1:3])
x, y = (struct.unpack(f"{len(a) // 4}f", v) for v in (a, b))
worst = max(abs(p - q) / (1 + abs(p)) for p, q in zip(x, y))
sys.exit(0 if len(a) == len(b) and worst < 1e-5 else f"logits differ by {worst}")
' "$work/a.bin" "$work/b.bin" || fail "$fam: the re-export gives the reference other logits"
  echo "$fam: imported, generated, LoRA and full SFT steps (loss $first -> $last), exported"
done
