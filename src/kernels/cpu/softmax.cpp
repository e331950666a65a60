// Row softmax and its backward.
#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cpu/simd_math.h"

namespace loom::cpu {

// out may alias inp. A row that is all -inf (fully masked) becomes all zeros.
void softmax_forward(float* out, const float* inp, int rows, int cols) {
#pragma omp parallel for schedule(static) if (worth_parallel(rows, cols))
  for (int r = 0; r < rows; ++r) {
    const float* x = inp + static_cast<int64_t>(r) * cols;
    float* y = out + static_cast<int64_t>(r) * cols;
    const float m = row_max(x, cols);
    if (m == -INFINITY) {
      for (int j = 0; j < cols; ++j) y[j] = 0.0f;
      continue;
    }
#pragma omp simd
    for (int j = 0; j < cols; ++j) y[j] = fast_exp(x[j] - m);
    const float inv = 1.0f / ordered_sum<float>(cols, [y](int64_t j) { return y[j]; });
#pragma omp simd
    for (int j = 0; j < cols; ++j) y[j] *= inv;
  }
}

// dinp = out * (dout - <dout, out>); dinp may alias dout.
void softmax_backward(float* dinp, const float* out, const float* dout, int rows, int cols) {
#pragma omp parallel for schedule(static) if (worth_parallel(rows, cols))
  for (int r = 0; r < rows; ++r) {
    const float* y = out + static_cast<int64_t>(r) * cols;
    const float* dy = dout + static_cast<int64_t>(r) * cols;
    float* dx = dinp + static_cast<int64_t>(r) * cols;
    const float dot = ordered_sum<float>(cols, [y, dy](int64_t j) { return y[j] * dy[j]; });
#pragma omp simd
    for (int j = 0; j < cols; ++j) dx[j] = y[j] * (dy[j] - dot);
  }
}

}  // namespace loom::cpu
