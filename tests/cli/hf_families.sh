#!/usr/bin/env bash
# The open families as a user meets them: a small random Qwen2, Qwen3, Mistral, Mixtral,
# Qwen3-MoE and Phi-3 model in
# transformers' layout, written by the torch reference (tests/ckpt/hf_reference.py), imported
# with `loom ckpt import`, sampled from with `loom generate`, fine-tuned (a LoRA SFT step and a
# full SFT step) and exported again, the export giving the reference the same logits.
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

# The reference's shapes (hf_reference.py make).
model=(--set model.preset=tiny-llama --set model.n_layer=2 --set model.d_model=32
  --set model.n_head=4 --set model.n_kv_head=2 --set model.head_dim=8 --set model.d_ff=48
  --set model.vocab=320 --set model.max_seq=128 --set model.norm_eps=1e-6
  --set model.rope_theta=1000000)
common=(--set train.micro_batch=2 --set train.seq_len=32 --set train.quiet=true
  --set train.peak_gflops=1 --set data.source=chat --set data.path="$work/chat.jsonl"
  --set data.tokenizer="loom:$work/tok")
for fam in qwen2 qwen3 mistral mixtral qwen3_moe phi3; do
  case $fam in
    qwen2) opts=(--set model.qkv_bias=true --set model.tied=true) ;;
    qwen3) opts=(--set model.qk_norm=true) ;;
    mistral) opts=(--set model.sliding_window=64) ;;
    mixtral) opts=(--set model.n_experts=4 --set model.top_k=2) ;;
    qwen3_moe) opts=(--set model.n_experts=4 --set model.top_k=2 --set model.qk_norm=true) ;;
    phi3) opts=(--set model.sliding_window=64 --set model.hf_family=phi3) ;;
  esac
  "$py" "$ref" make "$work/$fam" "$fam" 3
  "$loom" ckpt import "$work/$fam" --out "$work/$fam-ckpt" >/dev/null
  out=$("$loom" generate --ckpt "$work/$fam-ckpt" --prompt "say w007" --tokens 8 --temperature 0 \
    --tokenizer "loom:$work/tok")
  [ -n "$out" ] || fail "$fam: generate printed nothing"
  "$loom" train "${model[@]}" "${opts[@]}" "${common[@]}" --set train.steps=1 \
    --set train.pretrained="$work/$fam-ckpt" --set lora.rank=4 --set lora.alpha=8 \
    --set train.out_dir="$work/$fam-lora" >/dev/null
  "$loom" generate --ckpt "$work/$fam-lora/checkpoints" --prompt "say w007" --tokens 8 \
    --temperature 0 --tokenizer "loom:$work/tok" >/dev/null
  "$loom" train "${model[@]}" "${opts[@]}" "${common[@]}" --set train.steps=1 \
    --set train.init_from="$work/$fam-ckpt" --set train.out_dir="$work/$fam-sft" >/dev/null
  "$loom" ckpt export "$work/$fam-ckpt" --out "$work/$fam-again" --tokenizer none >/dev/null
  grep -q "\"model_type\": \"$fam\"" "$work/$fam-again/config.json" ||
    fail "$fam: the export's config.json names another model_type"
  "$py" "$ref" logits "$work/$fam" 5,9,200,17,3 "$work/a.bin"
  "$py" "$ref" logits "$work/$fam-again" 5,9,200,17,3 "$work/b.bin"
  cmp -s "$work/a.bin" "$work/b.bin" || fail "$fam: the re-export gives the reference other logits"
  echo "$fam: imported, generated, LoRA and full SFT steps, exported (same reference logits)"
done
