#!/usr/bin/env bash
# Run ON THE GPU MACHINE from the repository root, with build-gpucarry/ and build-gpudeps/
# carried (made here by tests/cuda/gpu_bundle.sh). Uses the prebuilt binaries when they start
# there, else builds the CUDA tests and bench there; runs every CUDA test (none may be skipped;
# the step tests run the real Decoder on the GPU against the CPU one), compute-sanitizer
# memcheck of real-Decoder steps and the paged KV-cache ops, racecheck on the attention, norm
# and paged-attention kernels, and bench_cuda
# (the real Decoder + device AdamW: gpt2-124m 16 x 1024 in bf16 / fp8 / fp8-delayed / mxfp8,
# llama-1b; the GEMM sweep). Every stage and command has a timeout; the default stages should
# take 3 to 4 minutes on an H100 (estimated, not yet measured). Logs go to $OUT (when set) or
# build-gpu/logs.
# Stages (default: build test sanitize bench, in this order); by name also: torch (the PyTorch
# eager / torch.compile baseline, bench/cuda_bench_torch.py, ~2 minutes) and memcheck-ops
# (compute-sanitizer over the op tests, ~2 minutes).
set -uo pipefail
STAGES=${*:-build test sanitize bench}
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

# The CUDA test binaries (a new tests/cuda target joins here). cuda_parallel_tests forks into two
# ranks on this one GPU (no MPI here) and trains TP, SP, PP, CP and EP through the staged device
# communicator (NCCL refuses two ranks on one GPU).
TESTS="cuda_host_tests cuda_ops_tests cuda_step_tests cuda_nccl_tests moe_ring_cuda_tests cuda_train_tests cuda_parallel_tests cuda_serve_tests"

B=build-gpucarry
[ -f $B.tgz ] && [ ! -d $B ] && tar xzf $B.tgz  # gpu_bundle.sh packs it for the trip
prebuilt=1
if ! timeout 60 $B/tests/cuda/cuda_host_tests --gtest_brief=1 > "$LOG/prebuilt_probe.txt" 2>&1; then
  stamp "prebuilt binaries do not run here (see prebuilt_probe.txt)"
  prebuilt=0
elif ! timeout 60 sha1sum -c --quiet $B/sources.sha1 > "$LOG/prebuilt_sources.txt" 2>&1; then
  # gpu_bundle.sh records the sources it built from: stale binaries would test old code.
  stamp "prebuilt binaries were built from other sources (see prebuilt_sources.txt)"
  prebuilt=0
fi
if [ $prebuilt = 0 ]; then
  stamp "building here"
  B=build-gpu
  if want build; then
    timeout 400 cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON \
      -DLOOM_NATIVE=OFF -DLOOM_USE_OPENBLAS=OFF -DLOOM_USE_DNNL=OFF \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DCMAKE_PREFIX_PATH="$DEPS" \
      -DGTest_DIR="$DEPS/lib/x86_64-linux-gnu/cmake/GTest" \
      > "$LOG/configure.txt" 2>&1
    timeout 400 cmake --build $B -j 16 --target $TESTS bench_cuda loom > "$LOG/build.txt" 2>&1
    tail -5 "$LOG/build.txt"
  fi
fi
stamp "binaries: $B"
# The loom binary (the prebuilt bundle keeps it beside bench_cuda); cuda_train_tests runs it.
LOOM=$B/loom; [ -x $B/bench/loom ] && LOOM=$B/bench/loom
export LOOM_BIN=$PWD/$LOOM
if want test; then
  for t in $TESTS; do
    [ -x $B/tests/cuda/$t ] || { echo "$t: missing"; rc=1; continue; }
    stamp "$t"
    timeout 180 $B/tests/cuda/$t --gtest_brief=1 > "$LOG/$t.txt" 2>&1 || { echo "$t: FAILED (rc $?)"; rc=1; }
    grep -E "FAILED|Failure|PASSED|error|differ" "$LOG/$t.txt" | head -30
    grep -q "SKIPPED" "$LOG/$t.txt" && [ $t != cuda_host_tests ] && { echo "$t: skipped tests on a GPU"; rc=1; }
  done
  # cuBLASLt says why it refuses a GEMM with its error and hint logs (mask 1 + 4).
  grep -q "FAILED.*CudaGemm" "$LOG/cuda_ops_tests.txt" 2>/dev/null &&
    CUBLASLT_LOG_MASK=5 timeout 60 $B/tests/cuda/cuda_ops_tests --gtest_filter='CudaGemm.*' 2>&1 |
      grep -v "^\[ " | tail -12
fi
S="compute-sanitizer --error-exitcode 9 --print-limit 20"
if want sanitize && command -v compute-sanitizer >/dev/null; then
  # A real-Decoder step (forward_backward, forward_loss, forward_logits) of tiny-llama (GQA,
  # RoPE, SwiGLU), and an fp8 step through the recipes in the Decoder's Linear slots.
  stamp "memcheck: real-Decoder steps"
  timeout 150 $S --tool memcheck $B/tests/cuda/cuda_step_tests --gtest_brief=1 \
    --gtest_filter='CudaStep.TinyLlamaMatchesCpu:CudaStep.Fp8StepMatchesCpuRecipeLoss' \
    > "$LOG/sanitizer_memcheck_step.txt" 2>&1 || { echo "memcheck step: rc $?"; rc=1; }
  stamp "racecheck: attention, layernorm"
  timeout 90 $S --tool racecheck $B/tests/cuda/cuda_ops_tests --gtest_brief=1 \
    --gtest_filter='CudaAttention.MatchesCpu*:CudaAttention.TensorCoresMatch*:CudaOps.LayerNorm*' \
    > "$LOG/sanitizer_racecheck.txt" 2>&1 || { echo "racecheck: rc $?"; rc=1; }
  # The serving engine's paged KV-cache kernels (kernels/cuda/paged_attention.cu): out-of-bounds
  # reads of the pool or the chunk table, and the attention's shared-memory merge of its warps.
  stamp "memcheck + racecheck: paged KV-cache ops"
  timeout 60 $S --tool memcheck $B/tests/cuda/cuda_serve_tests --gtest_brief=1 \
    --gtest_filter='CudaPaged.*' > "$LOG/sanitizer_memcheck_paged.txt" 2>&1 || { echo "memcheck paged: rc $?"; rc=1; }
  timeout 60 $S --tool racecheck $B/tests/cuda/cuda_serve_tests --gtest_brief=1 \
    --gtest_filter='CudaPaged.OpsMatchTheCpuBackend' > "$LOG/sanitizer_racecheck_paged.txt" 2>&1 ||
    { echo "racecheck paged: rc $?"; rc=1; }
  tail -n 4 "$LOG"/sanitizer_*.txt
fi
if want memcheck-ops && command -v compute-sanitizer >/dev/null; then
  stamp "memcheck: op tests"
  timeout 150 $S --tool memcheck $B/tests/cuda/cuda_ops_tests --gtest_brief=1 \
    --gtest_filter='-*LongSequence*' > "$LOG/sanitizer_memcheck_ops.txt" 2>&1 || { echo "memcheck ops: rc $?"; rc=1; }
  tail -n 4 "$LOG/sanitizer_memcheck_ops.txt"
fi
if want bench; then
  stamp "bench_cuda (GPT-2 124M, 16 x 1024, bf16 GEMMs, real Decoder + device AdamW)"
  timeout 90 $B/bench/bench_cuda 2>&1 | tee "$LOG/bench_cuda.txt"
  stamp "loom bench train --device cuda (the Trainer, GPT-2 124M, 16 x 1024, bf16 GEMMs)"
  timeout 150 $LOOM bench train --device cuda --preset gpt2-124m --batch 16 --seq 1024 \
    --precision bf16 --steps 5 --warmup 2 2>&1 | tee "$LOG/bench_train_cuda.txt" | tail -4
  stamp "loom bench train --device cuda --fp8 fp8_tensorwise_current (the Trainer's GPU fp8 recipe)"
  timeout 150 $LOOM bench train --device cuda --preset gpt2-124m --batch 16 --seq 1024 \
    --precision bf16 --fp8 fp8_tensorwise_current --fp8-format hybrid --steps 5 --warmup 2 2>&1 |
    tee "$LOG/bench_train_cuda_fp8.txt" | tail -5
  stamp "bench_cuda --math fp8 (block linears in fp8, current scaling, hybrid)"
  timeout 90 $B/bench/bench_cuda --math fp8 2>&1 | tee "$LOG/bench_cuda_fp8.txt"
  for m in fp8-delayed mxfp8; do
    timeout 90 $B/bench/bench_cuda --math $m --no-profile 2>&1 | tee "$LOG/bench_cuda_$m.txt" |
      grep -E "^step|^MFU|^loss per step" | sed "s/^/$m: /"
  done
  # Delayed scaling's scales step by step (its loss rose above ln V on the H200 once).
  timeout 90 $B/bench/bench_cuda --math fp8-delayed --no-profile --fp8-trace --steps 5 2>&1 |
    tee "$LOG/bench_cuda_fp8_delayed_trace.txt" | grep -E "^fp8 step|^loss per step"
  stamp "bench_cuda --act bf16 (bf16 activation storage)"
  timeout 90 $B/bench/bench_cuda --act bf16 --no-profile 2>&1 | tee "$LOG/bench_cuda_act_bf16.txt" |
    grep -E "^step|^MFU|^activation arena"
  stamp "bench_cuda --gemm-sweep (gpt2-124m, llama-1b)"
  timeout 60 $B/bench/bench_cuda --gemm-sweep 2>&1 | tee "$LOG/bench_gemm.txt"
  timeout 60 $B/bench/bench_cuda --gemm-sweep --preset llama-1b --batch 8 --seq 2048 2>&1 | tee -a "$LOG/bench_gemm.txt"
  stamp "bench_cuda llama-1b (4 x 2048, bf16 GEMMs)"
  timeout 120 $B/bench/bench_cuda --preset llama-1b --batch 4 --seq 2048 --steps 5 2>&1 | tee "$LOG/bench_cuda_llama.txt"
  timeout 120 $B/bench/bench_cuda --preset llama-1b --batch 4 --seq 2048 --steps 5 --math fp8 --no-profile 2>&1 |
    tee "$LOG/bench_cuda_llama_fp8.txt" | grep -E "^step|^MFU|^loss per step"
fi
if want torch; then
  stamp "PyTorch baseline (eager, compile)"
  PYTHONUNBUFFERED=1 timeout 180 python3 bench/cuda_bench_torch.py 2>&1 | tee "$LOG/bench_torch.txt" | grep -v "^ " | tail -8
fi
stamp "done, rc $rc"
exit $rc
