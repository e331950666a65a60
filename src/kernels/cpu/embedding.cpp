// Token embedding lookup and its scatter-add backward.

#include <limits>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"

namespace loom::cpu {
namespace {

void check_ids(const int32_t* ids, int N, const char* op) {
  // The table's row count is not passed, so only the lower bound can be checked here.
  for (int i = 0; i < N; ++i)
    LOOM_CHECK(ids[i] >= 0, op, ": negative token id ", ids[i], " at row ", i);
}

}  // namespace

void embedding_forward(float* out, const int32_t* ids, const float* table, int N, int C,
                       bool accumulate) {
  check_ids(ids, N, "embedding_forward");
#pragma omp parallel for schedule(static) if (worth_parallel(N, C))
  for (int i = 0; i < N; ++i) {
    const float* row = table + static_cast<int64_t>(ids[i]) * C;
    float* o = out + static_cast<int64_t>(i) * C;
    if (accumulate) {
#pragma omp simd
      for (int c = 0; c < C; ++c) o[c] += row[c];
    } else {
#pragma omp simd
      for (int c = 0; c < C; ++c) o[c] = row[c];
    }
  }
}

// Rows of dout for the same token must be added in one fixed order. Threads split the
// channels (in cache-line multiples) and each walks all N rows in order, so every dtable
// element sees the same sequence of additions whatever the thread count: race-free and
// bit-identical run to run.
void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int N, int C) {
  check_ids(ids, N, "embedding_backward");
  // The whole table is the slice starting at row 0 (ids are checked non-negative above, and the
  // table's row count is not passed): the same order of additions.
  embedding_backward_slice(dtable, dout, ids, N, C, 0, std::numeric_limits<int>::max());
}

}  // namespace loom::cpu
