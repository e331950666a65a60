#!/usr/bin/env bash
# Run HERE (the CI/dev machine): copies the Debian libraries the CPU reference side of the
# GPU tests needs (OpenBLAS, GoogleTest, and the toml++ headers src/core uses header-only) into
# build-gpudeps/, which the GPU machine lacks (it has only the CUDA toolkit, CMake and ninja).
# build-gpudeps/ is git-ignored (/build*/); pass it to the device tool as a carried path.
# About 42 MiB.
set -euo pipefail
cd "$(dirname "$0")/../.."
D=build-gpudeps
rm -rf "$D"
mkdir -p "$D/include" "$D/lib/x86_64-linux-gnu/cmake"
cp /usr/include/x86_64-linux-gnu/openblas-openmp/*.h "$D/include/"
# Under its soname: the binaries ask for libopenblas.so.0 at run time.
cp -L /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so "$D/lib/libopenblas.so.0"
cp -L /lib/x86_64-linux-gnu/libgfortran.so.5 /lib/x86_64-linux-gnu/libquadmath.so.0 "$D/lib/"
cp -r /usr/include/gtest "$D/include/"
cp -r /usr/include/toml++ "$D/include/"
cp /usr/lib/x86_64-linux-gnu/libgtest.a /usr/lib/x86_64-linux-gnu/libgtest_main.a \
   "$D/lib/x86_64-linux-gnu/"
# GTest's CMake package; gmock targets are dropped (not shipped).
cp -r /usr/lib/x86_64-linux-gnu/cmake/GTest "$D/lib/x86_64-linux-gnu/cmake/"
rm -f "$D"/lib/x86_64-linux-gnu/cmake/GTest/GMock*
sed -i '/GMock/d' "$D/lib/x86_64-linux-gnu/cmake/GTest/GTestConfig.cmake"
du -sh "$D"
