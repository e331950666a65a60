#!/usr/bin/env bash
# The Hugging Face round trip a fine-tuning user makes: a chat run (Llama with llama3 RoPE
# scaling, a trained BPE tokenizer with ChatML markers) exported as a complete transformers
# directory (config.json with bos/eos and rope_scaling, generation_config.json, tokenizer.json,
# tokenizer_config.json with the chat template), imported back (same greedy text), and the
# imported checkpoint starting pretraining, SFT (tokenized by the exported tokenizer.json) and
# DPO through train.init_from.
set -euo pipefail
loom=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
has() { grep -q -- "$2" "$1" || fail "$1 lacks $2"; }

for i in $(seq 60); do
  w=$(printf 'w%03d' "$i")
  echo "{\"messages\": [{\"role\": \"user\", \"content\": \"say $w\"}, {\"role\": \"assistant\", \"content\": \"$w $w\"}]}"
done > "$work/chat.jsonl"
for i in $(seq 40); do
  w=$(printf 'w%03d' "$i")
  echo "{\"prompt\": \"say $w\", \"chosen\": \"$w $w\", \"rejected\": \"no\"}"
done > "$work/pairs.jsonl"
for i in $(seq 60); do printf 'user assistant say w%03d w%03d\n' "$i" "$i"; done > "$work/corpus.txt"
"$loom" tokenizer train --input "$work/corpus.txt" --vocab-size 300 --special "<|endoftext|>" \
  --special "<|im_start|>" --special "<|im_end|>" --out "$work/tok" >/dev/null 2>&1

model=(--set model.preset=tiny-llama --set model.n_layer=2 --set model.d_model=32
  --set model.n_head=4 --set model.n_kv_head=2 --set model.d_ff=64 --set model.vocab=320
  --set model.max_seq=64 --set model.rope_scaling=llama3 --set model.rope_original_max_seq=16)
common=(--set train.micro_batch=2 --set train.seq_len=32 --set train.quiet=true
  --set train.peak_gflops=1)
"$loom" train "${model[@]}" "${common[@]}" --set train.steps=3 --set data.source=chat \
  --set data.path="$work/chat.jsonl" --set data.tokenizer="loom:$work/tok" \
  --set train.out_dir="$work/run" >/dev/null

"$loom" ckpt export "$work/run/checkpoints" --out "$work/hf" >/dev/null
for f in config.json generation_config.json model.safetensors tokenizer.json \
  tokenizer_config.json; do
  [ -f "$work/hf/$f" ] || fail "export wrote no $f"
done
has "$work/hf/config.json" '"rope_type": "llama3"'
has "$work/hf/config.json" '"eos_token_id"'
has "$work/hf/tokenizer_config.json" '"chat_template"'
has "$work/hf/tokenizer_config.json" '"eos_token": "<|im_end|>"'
echo "export: complete transformers directory"
"$loom" tokenizer export --vocab "loom:$work/tok" --out "$work/tokx" --chat-template chatml \
  --max-length 64 >/dev/null
for f in tokenizer.json tokenizer_config.json; do
  cmp -s "$work/hf/$f" "$work/tokx/$f" || fail "loom tokenizer export wrote another $f"
done

"$loom" ckpt import "$work/hf" --out "$work/imported" >/dev/null
a=$("$loom" generate --ckpt "$work/run/checkpoints" --prompt "say w007" --tokens 12 --temperature 0)
b=$("$loom" generate --ckpt "$work/imported" --prompt "say w007" --tokens 12 --temperature 0)
[ "$a" == "$b" ] || fail "generation differs after export/import: '$a' vs '$b'"
echo "import: same greedy text, with the imported tokenizer.json"
"$loom" ckpt export "$work/imported" --out "$work/hf2" >/dev/null
for k in bos_token_id eos_token_id rope_scaling; do
  [ "$(grep "\"$k\"" "$work/hf/config.json")" == "$(grep "\"$k\"" "$work/hf2/config.json")" ] ||
    fail "re-export changed $k"
done
for f in tokenizer.json tokenizer_config.json generation_config.json; do
  cmp -s "$work/hf/$f" "$work/hf2/$f" || fail "re-export changed $f"
done
echo "re-export: ids, rope_scaling, tokenizer and chat template kept"

"$loom" train "${model[@]}" "${common[@]}" --set train.steps=2 --set data.source=chat \
  --set data.path="$work/chat.jsonl" --set train.init_from="$work/imported" \
  --set data.tokenizer="$work/hf/tokenizer.json" --set train.out_dir="$work/sft" >/dev/null
echo "sft: started from the imported checkpoint (tokenized by tokenizer.json)"
"$loom" train "${model[@]}" "${common[@]}" --set train.steps=2 --set train.mode=dpo \
  --set data.source=preference --set data.path="$work/pairs.jsonl" \
  --set data.tokenizer="hf:$work/hf" --set train.init_from="$work/imported" \
  --set optim.lr=1e-6 --set train.out_dir="$work/dpo" >/dev/null
echo "dpo: started from the imported checkpoint"
printf 'say w001 w001. %.0s' $(seq 100) > "$work/text.txt"
"$loom" train "${model[@]}" "${common[@]}" --set train.steps=2 --set data.paths="$work/text.txt" \
  --set train.init_from="$work/imported" --set train.out_dir="$work/pre" >/dev/null
echo "pretrain: started from the imported checkpoint"

# LoRA (with dropout, which generation never applies) on the imported model, its adapters as
# PEFT files, read back onto the same base.
"$loom" train "${model[@]}" "${common[@]}" --set train.steps=3 --set data.source=chat \
  --set data.path="$work/chat.jsonl" --set data.tokenizer="hf:$work/hf" \
  --set train.pretrained="$work/imported" --set lora.rank=4 --set lora.alpha=8 \
  --set lora.dropout=0.25 --set optim.lr=1e-2 --set train.out_dir="$work/lora" >/dev/null
"$loom" ckpt export "$work/lora/checkpoints" --out "$work/peft" --peft >/dev/null
[ -f "$work/peft/adapter_model.safetensors" ] || fail "no adapter_model.safetensors"
has "$work/peft/adapter_config.json" '"q_proj"'
has "$work/peft/adapter_config.json" '"lora_alpha": 8'
has "$work/peft/adapter_config.json" '"lora_dropout": 0.25'
# The base PEFT names is the Hugging Face directory the LoRA run's base was imported from.
has "$work/peft/adapter_config.json" "\"base_model_name_or_path\": \"$work/hf\""
"$loom" ckpt import "$work/peft" --base "$work/imported" --out "$work/peft-imported" >/dev/null
a=$("$loom" generate --ckpt "$work/lora/checkpoints" --prompt "say w007" --tokens 12 \
  --temperature 0 --tokenizer "hf:$work/hf")
b=$("$loom" generate --ckpt "$work/peft-imported" --prompt "say w007" --tokens 12 \
  --temperature 0 --tokenizer "hf:$work/hf")
[ "$a" == "$b" ] || fail "generation differs after the PEFT round trip: '$a' vs '$b'"
c=$("$loom" generate --ckpt "$work/imported" --prompt "say w007" --tokens 12 --temperature 0)
[ "$a" != "$c" ] || fail "the adapters did not change greedy text: the comparison above proves nothing"
"$loom" ckpt import "$work/peft" --base "$work/imported" --merge --out "$work/peft-merged" >/dev/null
m=$("$loom" generate --ckpt "$work/peft-merged" --prompt "say w007" --tokens 12 \
  --temperature 0 --tokenizer "hf:$work/hf")
[ "$a" == "$m" ] || fail "generation differs after merging the PEFT files: '$a' vs '$m'"
echo "peft: LoRA adapters exported and read back onto their base (as adapters and merged), same greedy text"
