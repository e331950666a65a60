// Pointwise ops: GeLU, SwiGLU, GeGLU, soft-capping, add, scale. Outputs may alias inputs element
// for element (out == inp); `omp simd` keeps the loops vectorised without runtime alias checks. A
// combined `parallel for simd` names its `if` clause's construct (`if (parallel : ...)`): a bare
// `if` applies to the simd part too, and GCC then ran every call below the parallel threshold (a
// decode token's 3072-wide GeLU, its residual adds) as a scalar loop.
#include <cmath>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd_math.h"

namespace loom::cpu {
namespace {

constexpr float kGeluCubic = 0.044715f;
constexpr float kSqrt2OverPi = 0.7978845608028654f;

}  // namespace

// gelu(x) = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3); since 0.5 (1 + tanh(u)) =
// sigmoid(2u), this is x * sigmoid(2u): one exp, no tanh.
void gelu_forward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    out[i] = x * fast_sigmoid(2.0f * u);
  }
}

// d/dx [x s(2u)] = s + x * 2 s (1 - s) * u',  u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2).
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
    const float s = fast_sigmoid(2.0f * u);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] = dout[i] * (s + 2.0f * x * s * (1.0f - s) * du);
  }
}

void swiglu_forward(float* out, const float* inp, int N, int F) {
#pragma omp parallel for schedule(static) if (worth_parallel(N, F))
  for (int i = 0; i < N; ++i) {
    const float* gate = inp + static_cast<int64_t>(i) * 2 * F;
    const float* up = gate + F;
    float* o = out + static_cast<int64_t>(i) * F;
#pragma omp simd
    for (int j = 0; j < F; ++j) {
      const float g = gate[j];
      o[j] = g * fast_sigmoid(g) * up[j];
    }
  }
}

// silu'(g) = s (1 + g (1 - s)); dgate = dout * up * silu'(g), dup = dout * silu(g).
void swiglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) {
#pragma omp parallel for schedule(static) if (worth_parallel(N, F))
  for (int i = 0; i < N; ++i) {
    const float* gate = inp + static_cast<int64_t>(i) * 2 * F;
    const float* up = gate + F;
    const float* d = dout + static_cast<int64_t>(i) * F;
    float* dgate = dinp + static_cast<int64_t>(i) * 2 * F;
    float* dup = dgate + F;
#pragma omp simd
    for (int j = 0; j < F; ++j) {
      const float g = gate[j];
      const float u = up[j];
      const float s = fast_sigmoid(g);
      dgate[j] = d[j] * u * s * (1.0f + g * (1.0f - s));
      dup[j] = d[j] * g * s;
    }
  }
}

// geglu = gelu(g) * up; dgate = dout * up * gelu'(g), dup = dout * gelu(g) (gelu as above).
void geglu_forward(float* out, const float* inp, int N, int F) {
#pragma omp parallel for schedule(static) if (worth_parallel(N, F))
  for (int i = 0; i < N; ++i) {
    const float* gate = inp + static_cast<int64_t>(i) * 2 * F;
    const float* up = gate + F;
    float* o = out + static_cast<int64_t>(i) * F;
#pragma omp simd
    for (int j = 0; j < F; ++j) {
      const float x = gate[j];
      const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
      o[j] = x * fast_sigmoid(2.0f * u) * up[j];
    }
  }
}

void geglu_backward(float* dinp, const float* inp, const float* dout, int N, int F) {
#pragma omp parallel for schedule(static) if (worth_parallel(N, F))
  for (int i = 0; i < N; ++i) {
    const float* gate = inp + static_cast<int64_t>(i) * 2 * F;
    const float* up = gate + F;
    const float* d = dout + static_cast<int64_t>(i) * F;
    float* dgate = dinp + static_cast<int64_t>(i) * 2 * F;
    float* dup = dgate + F;
#pragma omp simd
    for (int j = 0; j < F; ++j) {
      const float x = gate[j];
      const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
      const float s = fast_sigmoid(2.0f * u);
      const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
      dgate[j] = d[j] * up[j] * (s + 2.0f * x * s * (1.0f - s) * du);
      dup[j] = d[j] * x * s;
    }
  }
}

void softcap_forward(float* x, int64_t n, float cap) {
  const float inv = 1.0f / cap;
#pragma omp parallel for schedule(static) if (parallel : worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] * inv);
}

void softcap_backward(float* d, const float* y, int64_t n, float cap) {
  const float inv = 1.0f / cap;
#pragma omp parallel for simd schedule(static) if (parallel : worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) {
    const float t = y[i] * inv;
    d[i] *= 1.0f - t * t;
  }
}

void add(float* out, const float* a, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void add_inplace(float* acc, const float* x, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
}

void scale_inplace(float* x, float s, int64_t n) {
#pragma omp parallel for simd schedule(static) if (parallel : worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void broadcast_rows(float* out, const float* row, int rows, int cols) {
#pragma omp parallel for schedule(static) if (parallel : worth_parallel(rows, cols))
  for (int i = 0; i < rows; ++i) {
    float* o = out + static_cast<int64_t>(i) * cols;
#pragma omp simd
    for (int j = 0; j < cols; ++j) o[j] = row[j];
  }
}

}  // namespace loom::cpu
