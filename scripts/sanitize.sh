#!/usr/bin/env bash
# Builds the unit and bad-input tests with ASan + UBSan (float-cast-overflow included, every
# report fatal) into build-asan/ (LOOM_ASAN_BUILD_DIR) and runs them: CTest labels `unit` (fast
# single-process unit test binaries, tests/CMakeLists.txt) and `badinput` (the fuzz corpus
# replays). MPI multi-rank and long trainer tests are left to the normal run.
# Extra args go to ctest (e.g. -R Json).
set -euo pipefail
cd "$(dirname "$0")/.."
# Compiler cache keys relative to the checkout, so a fresh clone anywhere (CI) reuses them.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
BUILD_DIR=${LOOM_ASAN_BUILD_DIR:-build-asan}
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  GEN=()
  command -v ninja >/dev/null && GEN=(-G Ninja)
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Debug -DLOOM_SANITIZE=ON \
    -DLOOM_BENCH=OFF -DLOOM_CUDA=OFF
fi
cmake --build "$BUILD_DIR" -j "$(nproc)" --target loom_unit_tests loom_fuzz_replays
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$BUILD_DIR" --output-on-failure -j "$(nproc)" -L 'unit|badinput' -LE mpi "$@"
