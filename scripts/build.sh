#!/usr/bin/env bash
# Configures and builds Loom into build/ (Release). Extra args go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
# Compiler cache keys relative to the checkout, so a fresh clone anywhere (CI) reuses them.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
BUILD_DIR=${LOOM_BUILD_DIR:-build}
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
fi
cmake --build "$BUILD_DIR" -j "$(nproc)"
