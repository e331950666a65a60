#!/usr/bin/env bash
# A Loom process runs with libgomp's idle spinning bounded (GOMP_SPINCOUNT=1000, set before
# libgomp loads by executing itself again) unless the user chose a wait policy or spin count.
# omp_wait.sh LOOM
set -uo pipefail
loom=$1
work=$(mktemp -d)
trap 'kill $pid 2>/dev/null; rm -rf "$work"' EXIT
pid=
spin_of() {  # ENV... : the GOMP_SPINCOUNT a running `loom train` has ("" if none)
  env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY "$@" "$loom" train --set model.preset=tiny \
    --set train.steps=100000 --set train.quiet=true --set train.peak_gflops=1 \
    --set train.out_dir="$work/run_$#" >/dev/null 2>&1 &
  pid=$!
  sleep 2  # past the re-execution (at once) into the run
  tr '\0' '\n' < "/proc/$pid/environ" | sed -n 's/^GOMP_SPINCOUNT=//p'
  kill $pid; wait $pid 2>/dev/null
}
got=$(spin_of)
[ "$got" = 1000 ] || { echo "omp_wait.sh: GOMP_SPINCOUNT='$got' in a loom run, expected 1000"; exit 1; }
got=$(spin_of OMP_WAIT_POLICY=active)
[ -z "$got" ] || { echo "omp_wait.sh: OMP_WAIT_POLICY=active given, yet GOMP_SPINCOUNT='$got'"; exit 1; }
got=$(spin_of GOMP_SPINCOUNT=42)
[ "$got" = 42 ] || { echo "omp_wait.sh: GOMP_SPINCOUNT=42 given, the run has '$got'"; exit 1; }
echo "ok: idle OpenMP threads spin 1000 times unless the user chose"
