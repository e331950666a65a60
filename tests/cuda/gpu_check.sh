#!/usr/bin/env bash
# Run ON THE GPU MACHINE from the repository root, with build-gpudeps/ carried (made by
# tests/cuda/gpu_bundle.sh): configures against the carried OpenBLAS/GoogleTest, builds the
# CUDA backend and its tests and benchmark, runs every CUDA test (none may be skipped there),
# compute-sanitizer on the op tests, then the benchmark and the PyTorch baseline side by side.
# Logs go to $OUT (when set) or build-gpu/logs. Stages (default: all; each call within the
# device tool's 10-minute limit when split): build, test, sanitize, bench.
#   bash tests/cuda/gpu_check.sh build test     then     bash tests/cuda/gpu_check.sh sanitize bench
set -uo pipefail
STAGES=${*:-build test sanitize bench}
want() { [[ " $STAGES " == *" $1 "* ]]; }
cd "$(dirname "$0")/../.."
DEPS=$PWD/build-gpudeps
B=build-gpu
LOG=${OUT:-$B/logs}
mkdir -p "$LOG"
export LD_LIBRARY_PATH="$DEPS/lib:${LD_LIBRARY_PATH:-}"
rc=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$LOG/gpu.txt"
if want build; then
cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON -DLOOM_NATIVE=OFF \
  -DCMAKE_PREFIX_PATH="$DEPS" -DCBLAS_INCLUDE_DIR="$DEPS/include" \
  -DOPENBLAS_LIBRARY="$DEPS/lib/libopenblas.so.0" \
  -DGTest_DIR="$DEPS/lib/x86_64-linux-gnu/cmake/GTest" 2>&1 | tail -20 | tee "$LOG/configure.txt"
cmake --build $B -j 16 --target cuda_host_tests cuda_step_replay_tests cuda_ops_tests \
  cuda_step_tests bench_cuda $( [ -d src/comm/nccl ] && echo cuda_nccl_tests ) 2>&1 \
  | tail -40 | tee "$LOG/build.txt"
fi
if want test; then
for t in cuda_host_tests cuda_ops_tests cuda_step_tests cuda_nccl_tests cuda_step_replay_tests; do
  [ -x $B/tests/cuda/$t ] || continue
  echo "== $t"
  $B/tests/cuda/$t --gtest_brief=1 2>&1 | tee "$LOG/$t.txt" | tail -30 || rc=1
  grep -q "SKIPPED" "$LOG/$t.txt" && [ $t != cuda_host_tests ] && { echo "$t: skipped tests on a GPU"; rc=1; }
done
fi
if want sanitize && command -v compute-sanitizer >/dev/null; then
  echo "== compute-sanitizer (memcheck, racecheck) on the op tests"
  compute-sanitizer --tool memcheck --error-exitcode 9 $B/tests/cuda/cuda_ops_tests \
    --gtest_brief=1 --gtest_filter='-*LongSequence*' > "$LOG/sanitizer_memcheck.txt" 2>&1 || rc=1
  compute-sanitizer --tool racecheck --error-exitcode 9 $B/tests/cuda/cuda_ops_tests \
    --gtest_brief=1 --gtest_filter='CudaAttention.MatchesCpu*:CudaOps.LayerNorm*' \
    > "$LOG/sanitizer_racecheck.txt" 2>&1 || rc=1
  tail -3 "$LOG"/sanitizer_*.txt
fi
if want bench; then
echo "== bench_cuda (GPT-2 124M, 16 x 1024, bf16 GEMMs)"
$B/bench/bench_cuda 2>&1 | tee "$LOG/bench_cuda.txt"
echo "== PyTorch baseline"
PYTHONUNBUFFERED=1 python3 bench/cuda_bench_torch.py 2>&1 | tee "$LOG/bench_torch.txt" | tail -5
fi
exit $rc
