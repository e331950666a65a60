#!/usr/bin/env bash
# A Hugging Face model with its own Jinja chat template (chat_template.jinja, not one of Loom's
# built-ins): `loom ckpt import` keeps it as hf:ROOT/tokenizer, a re-export writes it back, SFT
# trains on chat data with tool calls rendered by it, and generate and serve prompt with it.
set -euo pipefail
loom=$1
work=$(mktemp -d)
trap 'rm -rf "$work"; [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null || true' EXIT
fail() { echo "FAIL: $*"; exit 1; }

for i in $(seq 40); do
  w=$(printf 'w%03d' "$i")
  echo "{\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"echo\"}}], \"messages\": [{\"role\": \"user\", \"content\": \"say $w\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"function\": {\"name\": \"echo\", \"arguments\": {\"w\": \"$w\"}}}]}, {\"role\": \"tool\", \"content\": \"$w\"}, {\"role\": \"assistant\", \"content\": \"$w $w\"}]}"
done > "$work/chat.jsonl"
for i in $(seq 60); do printf 'user assistant tool say w%03d w%03d\n' "$i" "$i"; done > "$work/corpus.txt"
"$loom" tokenizer train --input "$work/corpus.txt" --vocab-size 300 --special "<|endoftext|>" \
  --special "<|im_start|>" --special "<|im_end|>" --out "$work/tok" >/dev/null 2>&1
model=(--set model.preset=tiny-llama --set model.n_layer=2 --set model.d_model=32
  --set model.n_head=4 --set model.n_kv_head=2 --set model.d_ff=64 --set model.vocab=320
  --set model.max_seq=128)
common=(--set train.micro_batch=2 --set train.seq_len=96 --set train.quiet=true
  --set train.peak_gflops=1)
head -5 "$work/chat.jsonl" | sed 's/"tools": \[[^]]*\], //; s/, {"role": "assistant", "content": null.*}, {"role": "tool"[^}]*}//' \
  > "$work/plain.jsonl"
"$loom" train "${model[@]}" "${common[@]}" --set train.steps=2 --set data.source=chat \
  --set data.path="$work/plain.jsonl" --set data.tokenizer="loom:$work/tok" \
  --set train.out_dir="$work/run" >/dev/null
"$loom" ckpt export "$work/run/checkpoints" --out "$work/hf" >/dev/null

# The model's own format: ChatML whose assistant turns are {% generation %} blocks, with tool
# calls written as <call>NAME ARGS</call>.
cat > "$work/hf/chat_template.jinja" <<'TPL'
{%- for m in messages -%}
<|im_start|>{{ m.role }}
{% if m.role == 'assistant' -%}
{% generation %}
{%- if m.content is not none %}{{ m.content }}{% endif -%}
{%- for c in m.tool_calls | default([]) %}<call>{{ c.function.name }} {{ c.function.arguments | tojson }}</call>{% endfor -%}
<|im_end|>{% endgeneration %}
{% else -%}
{{ m.content }}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}
TPL
"$loom" ckpt import "$work/hf" --out "$work/imported" >/dev/null
tpl="hf:$(cd "$work/imported/tokenizer" && pwd)"
grep -rq "\"hf_chat_template\": \"$tpl\"" "$work/imported" || fail "import did not keep the template as $tpl"
cmp -s "$work/hf/chat_template.jinja" "$work/imported/tokenizer/chat_template.jinja" ||
  fail "import changed chat_template.jinja"
echo "import: the model's chat template kept as $tpl"
"$loom" ckpt export "$work/imported" --out "$work/hf2" >/dev/null
grep -q 'generation' "$work/hf2/tokenizer_config.json" || fail "re-export lost the template"
echo "re-export: tokenizer_config.json carries the model's template"

"$loom" train "${model[@]}" "${common[@]}" --set train.steps=2 --set data.source=chat \
  --set data.path="$work/chat.jsonl" --set data.chat_template="$tpl" --set data.tokenizer="$tpl" \
  --set train.init_from="$work/imported" --set train.out_dir="$work/sft" >/dev/null
echo "sft: chat data with tool calls rendered by the model's template"
"$loom" generate --ckpt "$work/imported" --chat-template "$tpl" --prompt "say w007" --tokens 4 \
  --temperature 0 >/dev/null
echo "generate: prompts rendered by the model's template"

"$loom" serve --ckpt "$work/imported" --chat-template "$tpl" --port 0 >"$work/serve.out" \
  2>"$work/serve.err" &
pid=$!
for _ in $(seq 300); do
  grep -q "listening on" "$work/serve.out" 2>/dev/null && break
  sleep 0.1
done
url=$(grep -o 'http://[0-9.:]*' "$work/serve.out" | head -1)
[ -n "$url" ] || fail "serve did not start: $(cat "$work/serve.err")"
out=$(curl -sf -m 60 "$url/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages": [{"role": "user", "content": "say w007"}], "max_tokens": 4, "temperature": 0}')
echo "$out" | grep -q '"chat.completion"' || fail "no chat completion: $out"
echo "serve: chat completions rendered by the model's template"
