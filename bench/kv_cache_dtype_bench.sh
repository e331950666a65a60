#!/usr/bin/env bash
# The KV cache's stored type (--kv-cache-dtype) against the fp32 cache beside it: `loom bench
# serve --decode --no-load` on the gpt2-124m preset (random weights, prompts of 128 tokens, 64
# generated), single stream and 16 streams, for each weight type, with the cache in fp32, bf16
# and fp8. The three caches of a weight type run back to back, REPS rounds of them interleaved
# (fp32, bf16, fp8, fp32, ...), and each figure is the best of its rounds. Prints per weight type
# and cache the tokens/s, the blocks the 512 MB budget bought, each figure's ratio to the fp32
# cache's, the attention's share of a 16-stream step, and the load average before and after;
# then the same ratios of process CPU time per token (single stream: `token_cpu`; 16 streams:
# `streams_cpu_ms_per_token`), the steadier figures on a machine other jobs load (at one thread,
# time on the CPU whatever else runs; at more, waiting threads' bounded spinning counts too).
# kv_cache_dtype_bench.sh LOOM [REPS=2] [WEIGHTS="fp32 bf16"] [THREADS=2]
set -euo pipefail
loom=$1
reps=${2:-2}
weights=${3:-fp32 bf16}
threads=${4:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for w in $weights; do
  for r in $(seq "$reps"); do
    for kv in fp32 bf16 fp8; do
      timeout 900 "$loom" bench serve --decode --no-load --threads "$threads" --weights "$w" \
        --kv-cache-dtype "$kv" --json "$work/$w.$kv.$r.json" > "$work/$w.$kv.$r.log" 2>&1 ||
        { cat "$work/$w.$kv.$r.log"; exit 1; }
    done
  done
done
/usr/bin/python3 - "$work" "$reps" $weights <<'PY'
import json, sys
work, reps, weights = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
print("weights  kv    blocks  single tok/s (vs fp32 KV)  16 streams tok/s (vs fp32 KV)  "
      "attention share of a 16-stream step  load")
cpu_rows = []
for w in weights:
    best = {}
    for kv in ("fp32", "bf16", "fp8"):
        runs = [json.load(open(f"{work}/{w}.{kv}.{r}.json")) for r in range(1, reps + 1)]
        single = max(j["decode"]["single_stream_tokens_per_s"] for j in runs)
        streams = max(j["decode"]["streams_aggregate_tokens_per_s"] for j in runs)
        att = [j["decode"].get("streams_attention_share", 0) for j in runs]
        loads = [f'{j["load_average_before"]:.1f}-{j["load_average_after"]:.1f}' for j in runs]
        cpu1 = min(j["decode"]["single_stream_ms_per_token"]["token_cpu"] for j in runs)
        cpu16 = min(j["decode"]["streams_cpu_ms_per_token"] for j in runs)
        best[kv] = (single, streams, runs[0]["decode"]["kv_blocks"], max(att), loads, cpu1, cpu16)
    s0, m0 = best["fp32"][0], best["fp32"][1]
    c1, c16 = best["fp32"][5], best["fp32"][6]
    for kv, (single, streams, blocks, att, loads, cpu1, cpu16) in best.items():
        print(f"{w:7}  {kv:4}  {blocks:6}  {single:8.2f} ({single / s0:.2f}x)"
              f"{'':12}{streams:8.2f} ({streams / m0:.2f}x){'':18}{100 * att:5.1f}%"
              f"{'':32}{' '.join(loads)}")
        cpu_rows.append(f"{w:7}  {kv:4}  {cpu1:8.3f} ms ({c1 / cpu1:.2f}x){'':10}"
                        f"{cpu16:8.3f} ms ({c16 / cpu16:.2f}x)")
print("CPU time per token (ratio: fp32 KV's over this one's)")
print("weights  kv    single stream            16 streams")
print("\n".join(cpu_rows))
PY
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
