#!/usr/bin/env bash
# Measures this machine for `loom plan` and writes two cluster files:
#   configs/plan/this-machine-1t.toml  one rank per core (1 thread each)
#   configs/plan/this-machine-2t.toml  one rank using every core (single-process runs)
# Usage: bench/plan_calibrate.sh [BUILD_DIR] [OUT_DIR]   (defaults: build, configs/plan)
# Waits (up to ~2 min) for the 1-minute load average to drop below MAX_LOAD (default 1.0):
# the machine's cores are shared, and a busy core halves what a rank measures.
set -euo pipefail
build=${1:-build}
out=${2:-configs/plan}
bin=$build/bench/bench_plan_calibrate
[[ -x $bin ]] || { echo "plan_calibrate: $bin not built (cmake --build $build --target bench_plan_calibrate)" >&2; exit 1; }
cores=$(nproc)
max_load=${MAX_LOAD:-1.0}
for i in $(seq 1 12); do
  load=$(cut -d' ' -f1 /proc/loadavg)
  awk -v l="$load" -v m="$max_load" 'BEGIN{exit !(l < m)}' && break
  echo "plan_calibrate: load average $load >= $max_load, waiting 10 s ($i/12)" >&2
  sleep 10
done
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
root=()
[[ $(id -u) == 0 ]] && root=(--allow-run-as-root)
OMP_NUM_THREADS=1 mpirun "${root[@]}" --oversubscribe --bind-to none -n 2 "$bin" comm --out "$tmp/comm.json"
# One rank per core, all measuring at once (they share the cache and memory bus as they train).
OMP_NUM_THREADS=1 mpirun "${root[@]}" --oversubscribe --bind-to none -n "$cores" "$bin" compute \
  --threads 1 --name this-machine-1t --comm "$tmp/comm.json" --out "$out/this-machine-1t.toml"
"$bin" compute --threads "$cores" --name this-machine-${cores}t --comm "$tmp/comm.json" \
  --out "$out/this-machine-${cores}t.toml"
