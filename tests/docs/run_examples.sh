#!/usr/bin/env bash
# Runs every command block of the manual that is marked runnable (a fence opened with
# "```sh runnable"), each in a fresh directory holding the repository's configs/, with `loom`
# the built binary. The marked blocks use tiny presets and a few steps, so this stays within the
# normal suite's time; a block that fails fails the test, naming its page and line.
# Usage: run_examples.sh SOURCE_DIR LOOM
set -uo pipefail
root=${1:?usage: run_examples.sh SOURCE_DIR LOOM} loom_bin=${2:?usage: run_examples.sh SOURCE_DIR LOOM}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

blocks=0 failed=0
mkdir -p "$work/blocks"
for page in "$root"/README.md "$root"/docs/*.md; do
  # Each block as a file: blocks/<page>.<line of its fence>.sh
  awk -v out="$work/blocks" -v name="$(basename "$page")" '
    /^```sh runnable[[:space:]]*$/ { f = out "/" name "." NR ".sh"; inside = 1; next }
    inside && /^```/ { inside = 0; close(f); next }
    inside { print > f }
  ' "$page"
done
for block in "$work"/blocks/*.sh; do
  [ -f "$block" ] || continue
  blocks=$((blocks + 1))
  dir=$work/run_$blocks
  mkdir -p "$dir/bin"
  ln -s "$root/configs" "$dir/configs"
  ln -s "$loom_bin" "$dir/bin/loom"
  where=$(basename "$block" .sh)
  if (cd "$dir" && PATH="$dir/bin:$PATH" timeout 300 bash -euo pipefail "$block" > "$dir/log" 2>&1 < /dev/null); then
    echo "ok   ${where%.*} (line ${where##*.})"
  else
    failed=$((failed + 1))
    echo "FAIL ${where%.*} (line ${where##*.}):"
    sed 's/^/    /' "$block"
    tail -20 "$dir/log" | sed 's/^/  | /'
  fi
done
# No marked block would make this test pass without running anything.
[ "$blocks" -gt 0 ] || { echo "run_examples.sh: no block marked runnable under $root"; exit 1; }
echo "$blocks blocks, $failed failed"
[ "$failed" -eq 0 ]
