// Compiled with -ffp-contract=off (src/kernels/CMakeLists.txt): `alpha * s + c` must round the
// product before the addition, which GCC's default contraction in C++ would fuse into an FMA.

#include "kernels/cpu/gemm_scale_pass.h"

#include <omp.h>

#include <cstdint>

#include "kernels/cpu/parallel.h"

namespace loom::cpu {

void gemm_scale_pass(int rows, int cols, float alpha, const float* S, int lds, const float* bias,
                     bool add_c, float* C, int ldc) {
  // (Inside a parallel region, e.g. per weight-gradient block, this runs on the calling thread.)
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && worth_parallel(rows, cols))
  for (int i = 0; i < rows; ++i) {
    const float* s = S + int64_t(i) * lds;
    float* c = C + int64_t(i) * ldc;
    if (bias != nullptr) {
      for (int j = 0; j < cols; ++j) c[j] = alpha * s[j] + bias[j];
    } else if (add_c) {
      for (int j = 0; j < cols; ++j) c[j] = alpha * s[j] + c[j];
    } else {
      for (int j = 0; j < cols; ++j) c[j] = alpha * s[j];
    }
  }
}

}  // namespace loom::cpu
