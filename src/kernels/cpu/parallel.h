// When a kernel is worth an OpenMP fork/join: below ~32K elements of work, running on the
// calling thread is faster than waking the team.
#pragma once

#include <cstdint>

namespace loom::cpu {

constexpr int64_t kMinParallelWork = int64_t{1} << 15;

// rows * cols elements of work (cols defaults to 1 for flat arrays).
inline bool worth_parallel(int64_t rows, int64_t cols = 1) {
  return rows * cols >= kMinParallelWork;
}

}  // namespace loom::cpu
