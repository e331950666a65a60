#!/usr/bin/env bash
# Run HERE (the CI/dev machine) before a GPU session. Makes two git-ignored folders to pass to
# the device tool as carried paths (the GPU machine has only the CUDA toolkit, CMake and ninja):
#   build-gpudeps/  GoogleTest and the toml++ headers (src/core uses them header-only), so the
#                   CUDA tests can be built there (about 2 MiB);
#   build-gpucarry/ (packed as build-gpucarry.tgz) the CUDA tests, bench_cuda and loom built here with this toolkit, laid out as a
#                   build folder (tests/cuda/, bench/), plus libgomp, so gpu_check.sh can skip
#                   the build there (about 25 MiB). Same nvcc major version on both machines.
#                   sources.sha1 lists what they were built from: gpu_check.sh builds on the
#                   device instead when the tree there differs.
# Both builds use the portable CPU GEMM for the CPU reference side (no OpenBLAS to carry: the
# tests' CPU shapes are small) and no -march=native (the GPU host's CPU may differ).
set -euo pipefail
cd "$(dirname "$0")/../.."
D=build-gpudeps
rm -rf "$D"
mkdir -p "$D/include" "$D/lib/x86_64-linux-gnu/cmake"
cp -r /usr/include/gtest "$D/include/"
cp -r /usr/include/toml++ "$D/include/"
cp /usr/lib/x86_64-linux-gnu/libgtest.a /usr/lib/x86_64-linux-gnu/libgtest_main.a \
   "$D/lib/x86_64-linux-gnu/"
# GTest's CMake package; gmock targets are dropped (not shipped).
cp -r /usr/lib/x86_64-linux-gnu/cmake/GTest "$D/lib/x86_64-linux-gnu/cmake/"
rm -f "$D"/lib/x86_64-linux-gnu/cmake/GTest/GMock*
sed -i '/GMock/d' "$D/lib/x86_64-linux-gnu/cmake/GTest/GTestConfig.cmake"

TARGETS="cuda_host_tests cuda_ops_tests cuda_step_tests cuda_nccl_tests moe_ring_cuda_tests cuda_train_tests cuda_parallel_tests cuda_serve_tests bench_cuda loom"
export CCACHE_BASEDIR=$PWD
# No MPI: the GPU machine has no Open MPI libraries (one-process runs there; NCCL is the device's).
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DLOOM_CUDA=ON -DLOOM_NATIVE=OFF \
  -DLOOM_USE_OPENBLAS=OFF -DLOOM_USE_DNNL=OFF -DCMAKE_CUDA_ARCHITECTURES="80;90" \
  -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON > /dev/null
cmake --build build-cuda -j "$(nproc)" --target $TARGETS
C=build-gpucarry
rm -rf "$C"
mkdir -p "$C/tests/cuda" "$C/bench" "$C/lib"
for t in $TARGETS; do
  [ -x build-cuda/tests/cuda/$t ] && cp build-cuda/tests/cuda/$t "$C/tests/cuda/"
done
cp build-cuda/bench/bench_cuda build-cuda/loom "$C/bench/"
strip "$C"/tests/cuda/* "$C"/bench/*  # host symbols only: device code and its line info stay
# The host libraries these link that a bare CUDA machine lacks.
for l in $(ldd "$C"/bench/loom "$C"/tests/cuda/* | awk '/=> \//{print $3}' | sort -u |
           grep -vE '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libnccl)\.so'); do
  cp -L "$l" "$C/lib/"
done
# What these binaries were built from (the files the device copy of the tree holds), so that
# gpu_check.sh builds there instead of testing stale binaries.
git ls-files -co --exclude-standard -- src tests bench cmake CMakeLists.txt | xargs -d '\n' sha1sum \
  > "$C/sources.sha1"
# The binaries carry ~10 MiB of device code each: the device tool carries at most 64 MiB, so
# they travel packed (gpu_check.sh unpacks them): carry build-gpucarry.tgz and build-gpudeps.
tar czf "$C.tgz" "$C"
du -sh "$D" "$C" "$C.tgz"
