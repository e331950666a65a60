#!/usr/bin/env bash
# Run ON THE GPU MACHINE from the repository root, with build-gpucarry/ and build-gpudeps/
# carried (made here by tests/cuda/gpu_bundle.sh). Uses the prebuilt binaries when they start
# there, else builds the CUDA tests and bench there; runs every CUDA test (none may be skipped),
# compute-sanitizer memcheck on the op tests and on one training step, racecheck on the
# attention and norm kernels, bench_cuda (training step; GEMM sweep bf16 vs fp8) and the
# PyTorch baseline. Every stage has a timeout; logs go to $OUT (when set) or build-gpu/logs.
# Stages (default: all, in this order): build test bench torch sanitize.
set -uo pipefail
STAGES=${*:-build test bench torch sanitize}
want() { [[ " $STAGES " == *" $1 "* ]]; }
cd "$(dirname "$0")/../.."
T0=$(date +%s)
stamp() { echo "== [$(( $(date +%s) - T0 )) s] $*"; }
DEPS=$PWD/build-gpudeps
LOG=${OUT:-build-gpu/logs}
mkdir -p "$LOG"
rc=0
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$LOG/gpu.txt"
# CUDA and NCCL libraries of that machine (toolkit folder or the Python wheels').
CULIB=$(dirname "$(find /usr/local/cuda/ /usr/local/cuda*/ /opt -name 'libcublasLt.so.13' 2>/dev/null | head -1)")
NCCLLIB=$(dirname "$(find /usr/local/cuda/ /usr/lib /opt -name 'libnccl.so.2*' 2>/dev/null | head -1)")
echo "cuBLASLt in $CULIB; NCCL in $NCCLLIB"
export LD_LIBRARY_PATH="$PWD/build-gpucarry/lib:$CULIB:$NCCLLIB:${LD_LIBRARY_PATH:-}"

B=build-gpucarry
if ! timeout 60 $B/tests/cuda/cuda_host_tests --gtest_brief=1 > "$LOG/prebuilt_probe.txt" 2>&1; then
  stamp "prebuilt binaries do not run here (see prebuilt_probe.txt): building"
  B=build-gpu
  if want build; then
    timeout 400 cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON \
      -DLOOM_NATIVE=OFF -DLOOM_USE_OPENBLAS=OFF -DLOOM_USE_DNNL=OFF \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH="$DEPS" \
      -DGTest_DIR="$DEPS/lib/x86_64-linux-gnu/cmake/GTest" \
      > "$LOG/configure.txt" 2>&1
    timeout 400 cmake --build $B -j 16 --target cuda_host_tests cuda_step_replay_tests \
      cuda_ops_tests cuda_step_tests cuda_nccl_tests bench_cuda > "$LOG/build.txt" 2>&1
    tail -5 "$LOG/build.txt"
  fi
fi
stamp "binaries: $B"
if want test; then
  for t in cuda_host_tests cuda_ops_tests cuda_step_tests cuda_nccl_tests cuda_step_replay_tests; do
    [ -x $B/tests/cuda/$t ] || { echo "$t: missing"; rc=1; continue; }
    stamp "$t"
    timeout 180 $B/tests/cuda/$t --gtest_brief=1 > "$LOG/$t.txt" 2>&1 || { echo "$t: FAILED (rc $?)"; rc=1; }
    grep -E "FAILED|Failure|PASSED|error" "$LOG/$t.txt" | head -30
    grep -q "SKIPPED" "$LOG/$t.txt" && [ $t != cuda_host_tests ] && { echo "$t: skipped tests on a GPU"; rc=1; }
  done
  # cuBLASLt says why it refuses a GEMM with its error and hint logs (mask 1 + 4).
  grep -q "FAILED.*CudaGemm" "$LOG/cuda_ops_tests.txt" 2>/dev/null &&
    CUBLASLT_LOG_MASK=5 timeout 60 $B/tests/cuda/cuda_ops_tests --gtest_filter='CudaGemm.*' 2>&1 |
      grep -v "^\[ " | tail -12
fi
if want bench; then
  stamp "bench_cuda (GPT-2 124M, 16 x 1024, bf16 GEMMs)"
  timeout 120 $B/bench/bench_cuda 2>&1 | tee "$LOG/bench_cuda.txt"
  stamp "bench_cuda --math fp8 (block linears in fp8, current scaling, hybrid)"
  timeout 120 $B/bench/bench_cuda --math fp8 2>&1 | tee "$LOG/bench_cuda_fp8.txt"
  for m in fp8-delayed mxfp8; do
    timeout 120 $B/bench/bench_cuda --math $m --no-profile 2>&1 | grep -E "^step|^MFU" | sed "s/^/$m: /"
  done
  stamp "bench_cuda --gemm-sweep (gpt2-124m, llama-1b)"
  timeout 60 $B/bench/bench_cuda --gemm-sweep 2>&1 | tee "$LOG/bench_gemm.txt"
  timeout 60 $B/bench/bench_cuda --gemm-sweep --preset llama-1b --batch 8 --seq 2048 2>&1 | tee -a "$LOG/bench_gemm.txt"
  stamp "bench_cuda llama-1b (4 x 2048, bf16 GEMMs)"
  timeout 120 $B/bench/bench_cuda --preset llama-1b --batch 4 --seq 2048 --steps 5 2>&1 | tee "$LOG/bench_cuda_llama.txt"
  timeout 120 $B/bench/bench_cuda --preset llama-1b --batch 4 --seq 2048 --steps 5 --math fp8 2>&1 | tee "$LOG/bench_cuda_llama_fp8.txt"
fi
if want torch; then
  stamp "PyTorch baseline (eager, compile)"
  PYTHONUNBUFFERED=1 timeout 180 python3 bench/cuda_bench_torch.py 2>&1 | tee "$LOG/bench_torch.txt" | grep -v "^ " | tail -8
fi
if want sanitize && command -v compute-sanitizer >/dev/null; then
  S="compute-sanitizer --error-exitcode 9 --print-limit 20"
  stamp "memcheck: op tests"
  timeout 150 $S --tool memcheck $B/tests/cuda/cuda_ops_tests --gtest_brief=1 \
    --gtest_filter='-*LongSequence*' > "$LOG/sanitizer_memcheck_ops.txt" 2>&1 || { echo "memcheck ops: rc $?"; rc=1; }
  stamp "memcheck: one training step"
  timeout 120 $S --tool memcheck $B/tests/cuda/cuda_step_tests --gtest_brief=1 --gtest_filter='CudaStep.Tiny*:CudaStep.Fp8*:CudaFp8.*' \
    > "$LOG/sanitizer_memcheck_step.txt" 2>&1 || { echo "memcheck step: rc $?"; rc=1; }
  stamp "racecheck: attention, layernorm"
  timeout 90 $S --tool racecheck $B/tests/cuda/cuda_ops_tests --gtest_brief=1 \
    --gtest_filter='CudaAttention.MatchesCpu*:CudaAttention.TensorCoresMatch*:CudaOps.LayerNorm*' \
    > "$LOG/sanitizer_racecheck.txt" 2>&1 || { echo "racecheck: rc $?"; rc=1; }
  tail -n 4 "$LOG"/sanitizer_*.txt
fi
stamp "done, rc $rc"
exit $rc
