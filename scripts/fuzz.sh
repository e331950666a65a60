#!/usr/bin/env bash
# Runs every libFuzzer target of tests/fuzz for a bounded time and fails on any crash.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET ...]    default: 30 s, every target
#   scripts/fuzz.sh 600 json safetensors                 a developer's longer run
#
# Builds the clang ASan+UBSan+libFuzzer configuration in build-fuzz/ (LOOM_FUZZ_BUILD_DIR) when
# needed. Each target starts from its checked-in corpus (tests/fuzz/corpus/<name>) plus the
# inputs earlier runs found (build-fuzz/fuzz/corpus/<name>, not checked in). A crash, sanitizer
# report, leak, timeout or out-of-memory is copied into tests/fuzz/corpus/<name>/regress-<sha1>:
# fix the parser, then commit that file, and the replay tests (FuzzReplay.<name>, every build)
# keep it fixed.
set -uo pipefail
cd "$(dirname "$0")/.."
# Compiler cache keys relative to the checkout, so a fresh clone anywhere (CI) reuses them.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
SECONDS_PER_TARGET=${1:-30}
shift $(( $# > 0 ? 1 : 0 ))
BUILD_DIR=${LOOM_FUZZ_BUILD_DIR:-build-fuzz}
CORPUS=tests/fuzz/corpus

if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  GEN=()
  command -v ninja >/dev/null && GEN=(-G Ninja)
  CC=clang CXX=clang++ cmake -S . -B "$BUILD_DIR" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Debug \
    -DLOOM_FUZZ=ON -DLOOM_BENCH=OFF -DLOOM_CUDA=OFF >/dev/null || exit 1
fi
cmake --build "$BUILD_DIR" -j "$(nproc)" --target loom_fuzzers || exit 1

TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  for d in "$CORPUS"/*/; do TARGETS+=("$(basename "$d")"); done
fi

# Per-target input size caps. html had 4 KB while html_extract overflowed its stack on ~100k
# nested elements and grew memory quadratically on unclosed tags; both are
# bounded now (iterative walks, max_parse_mb, max_depth and its pre-scan), so it gets the
# common cap. Keep the function: a parser with a known, separately tracked defect gets its cap.
max_len() {
  case "$1" in
    *) echo 65536 ;;
  esac
}

failed=()
summary=()
for t in "${TARGETS[@]}"; do
  bin="$BUILD_DIR/tests/fuzz/fuzz_$t"
  [ -x "$bin" ] || { echo "fuzz.sh: no fuzz target '$t' ($bin)" >&2; failed+=("$t"); continue; }
  work="$BUILD_DIR/fuzz/corpus/$t"
  art="$BUILD_DIR/fuzz/artifacts/$t/"
  rm -rf "$art"
  mkdir -p "$work" "$art"
  log="$BUILD_DIR/fuzz/$t.log"
  echo "== fuzz $t: ${SECONDS_PER_TARGET}s"
  # -rss_limit_mb/-malloc_limit_mb: one input must not take gigabytes (no input
  # may exhaust memory). -timeout: one input must not take seconds.
  # The entry points' files (fuzz_util.h): in memory when /dev/shm exists, removed afterwards.
  scratch=$(mktemp -d "$([ -d /dev/shm ] && echo /dev/shm || echo "${TMPDIR:-/tmp}")/loom_fuzz_$t.XXXXXX")
  trap 'rm -rf "$scratch"' EXIT
  LOOM_FUZZ_SCRATCH="$scratch" ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} "$bin" -max_total_time="$SECONDS_PER_TARGET" \
    -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 -max_len="$(max_len "$t")" \
    -print_final_stats=1 -artifact_prefix="$art" "$work" "$CORPUS/$t" >"$log" 2>&1
  rc=$?
  rm -rf "$scratch"
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  summary+=("$(printf '%-16s %10s execs  rc=%s' "$t" "${execs:-?}" "$rc")")
  found=0
  for a in "$art"*; do
    [ -f "$a" ] || continue
    found=1
    dest="$CORPUS/$t/regress-$(sha1sum "$a" | cut -c1-16)"
    cp "$a" "$dest"
    echo "fuzz.sh: $t: $(basename "$a") saved as $dest"
  done
  if [ $rc -ne 0 ] || [ $found -ne 0 ]; then
    failed+=("$t")
    grep -E "ERROR|SUMMARY|runtime error|==[0-9]+==|terminate|what\(\)" "$log" | head -20
    echo "fuzz.sh: $t failed; full log: $log"
  fi
done

echo "== fuzz summary (${SECONDS_PER_TARGET}s per target)"
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz.sh: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz.sh: every target ran clean"
