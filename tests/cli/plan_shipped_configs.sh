#!/usr/bin/env bash
# plan_shipped_configs.sh LOOM SRC: `loom plan --config FILE` accepts every training and plan
# config shipped under SRC/configs unchanged, found by enumerating the directory: every config
# with one of the trainer's or the planner's sections (a training config is one with neither
# [cluster] nor [plan]).
set -euo pipefail
loom=$1
src=$2
training=0
planned=0
while IFS= read -r -d '' f; do
  grep -qE '^\[(model|train|parallel|precision|cluster|plan)\]' "$f" || continue
  out=$("$loom" plan --config "$f" --json 2>/dev/null) || {
    echo "loom plan --config $f failed:"
    "$loom" plan --config "$f" --json >/dev/null || true
    exit 1
  }
  grep -q '"step_time_s"' <<<"$out" || { echo "$f: no step_time_s in: $out"; exit 1; }
  planned=$((planned + 1))
  grep -qE '^\[(cluster|plan)\]' "$f" && continue
  training=$((training + 1))
done < <(find "$src/configs" -name '*.toml' -print0 | sort -z)
echo "planned $planned configs, $training of them training configs"
# configs/main holds the main job's three training configs (bytes, pretraining, SFT).
[ "$training" -ge 3 ] || { echo "expected at least 3 training configs, found $training"; exit 1; }
