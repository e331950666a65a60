#!/bin/bash
# `loom curate` started by mpirun on 2 ranks, killed in the middle (every rank _exits), then
# rerun: its kept and rejected outputs must be byte-identical to one uninterrupted process.
# usage: mpi_cli_resume.sh MPIEXEC CURATE_DRIVER
set -euo pipefail
mpiexec=$1
driver=$2
d=$(mktemp -d /tmp/loom_curate_mpicli_XXXXXX)
trap 'rm -rf "$d"' EXIT
mkdir "$d/in"
words=(river garden morning people village history market winter teacher window letter station
       mountain library kitchen summer doctor bridge harbor forest student country evening)
RANDOM=7
sentence() {
  local s="The"
  for _ in 1 2 3 4 5 6 7 8 9 10 11 12; do s+=" ${words[RANDOM % ${#words[@]}]}"; done
  echo "$s."
}
for k in $(seq 0 59); do
  text="$(sentence) $(sentence) $(sentence)"
  shard=$((k % 5))
  echo "{\"id\": \"u$k\", \"text\": \"$text\"}" >> "$d/in/part-$shard.jsonl"
  if ((k % 4 == 0)); then  # exact duplicate in another shard
    echo "{\"id\": \"x$k\", \"text\": \"  $text\"}" >> "$d/in/part-$(((shard + 2) % 5)).jsonl"
  fi
  if ((k % 3 == 0)); then  # near duplicate: one word added, in another shard
    echo "{\"id\": \"n$k\", \"text\": \"$text Indeed.\"}" >> "$d/in/part-$(((shard + 1) % 5)).jsonl"
  fi
done
cat > "$d/cfg.toml" <<CFG
[input]
paths = ["$d/in/*.jsonl"]
[output]
dir = "$d/ref"
[stage.1]
type = "clean"
[stage.2]
type = "exact_dedup"
[stage.3]
type = "fuzzy_dedup"
verify_threshold = 0.5
CFG
"$driver" --config "$d/cfg.toml" --progress 0 --workers 2 > "$d/ref.log" 2>&1
dist=(--config "$d/cfg.toml" --set "output.dir=\"$d/dist\"" --progress 0 --workers 2)
if LOOM_CURATE_CRASH_AFTER_DOCS=30 "$mpiexec" --oversubscribe --bind-to none -n 2 "$driver" \
     "${dist[@]}" > "$d/crash.log" 2>&1; then
  echo "FAIL: the run that should have been killed succeeded"; exit 1
fi
"$mpiexec" --oversubscribe --bind-to none -n 2 "$driver" "${dist[@]}" > "$d/dist.log" 2>&1 ||
  { cat "$d/dist.log"; echo "FAIL: resumed run failed"; exit 1; }
grep -q "resuming" "$d/dist.log" || { cat "$d/dist.log"; echo "FAIL: did not resume"; exit 1; }
grep -q near_duplicate "$d"/ref/rejected/*.s2.jsonl || { echo "FAIL: no near duplicates"; exit 1; }
grep -q exact_duplicate "$d"/ref/rejected/*.s1.jsonl || { echo "FAIL: no exact duplicates"; exit 1; }
diff -r "$d/ref/kept" "$d/dist/kept"
diff -r "$d/ref/rejected" "$d/dist/rejected"
echo "PASS: distributed resume matches one process"
