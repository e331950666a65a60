// Rotary position embedding, rotate-half convention (Hugging Face Llama).
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/scratch.h"

namespace loom::cpu {
namespace {

// Rotates every head of every token by +angle (sign = 1) or -angle (sign = -1). The angles are
// formed and reduced in double, so forward and backward use identical cos/sin and are exact
// inverses up to float rounding, and large positions lose no precision.
void rope_rotate(float* x, const int32_t* pos, int N, int H, int D, int ld, float theta,
                 const RopeScaling& scaling, float sign) {
  LOOM_CHECK(D > 0 && D % 2 == 0, "rope: head dim D=", D, " must be even and positive");
  LOOM_CHECK(ld >= H * D, "rope: row stride ld=", ld, " < H*D=", H * D);
  LOOM_CHECK(theta > 0.0f, "rope: theta=", theta, " must be positive");
  for (int i = 0; i < N; ++i)
    LOOM_CHECK(pos[i] >= 0, "rope: negative position ", pos[i], " at row ", i);
  const int half = D / 2;
  double* inv_freq = thread_scratch<double>(half);
  if (scaling.enabled())
    LOOM_CHECK(scaling.factor >= 1.f && scaling.low_freq_factor > 0.f &&
                   scaling.high_freq_factor > scaling.low_freq_factor &&
                   scaling.original_max_seq > 0,
               "rope: bad llama3 scaling (factor ", scaling.factor, ", low_freq_factor ",
               scaling.low_freq_factor, ", high_freq_factor ", scaling.high_freq_factor,
               ", original_max_seq ", scaling.original_max_seq, ")");
  for (int j = 0; j < half; ++j)
    inv_freq[j] = scaling.apply(std::pow(static_cast<double>(theta), -2.0 * j / D));

  constexpr int kPairs = 64;  // cos/sin computed per block of pairs, reused for all H heads
#pragma omp parallel for schedule(static) if (worth_parallel(int64_t{N} * H, D))
  for (int i = 0; i < N; ++i) {
    float* row = x + static_cast<int64_t>(i) * ld;
    const double p = pos[i];
    float cs[kPairs], sn[kPairs];
    for (int j0 = 0; j0 < half; j0 += kPairs) {
      const int w = std::min(kPairs, half - j0);
      for (int j = 0; j < w; ++j) {
        const double a = p * inv_freq[j0 + j];
        cs[j] = static_cast<float>(std::cos(a));
        sn[j] = sign * static_cast<float>(std::sin(a));
      }
      for (int h = 0; h < H; ++h) {
        float* x1 = row + static_cast<int64_t>(h) * D + j0;
        float* x2 = x1 + half;
#pragma omp simd
        for (int j = 0; j < w; ++j) {
          const float a = x1[j], b = x2[j];
          x1[j] = a * cs[j] - b * sn[j];
          x2[j] = b * cs[j] + a * sn[j];
        }
      }
    }
  }
}

}  // namespace

void rope_forward(float* x, const int32_t* pos, int N, int H, int D, int ld, float theta,
                  const RopeScaling& scaling) {
  rope_rotate(x, pos, N, H, D, ld, theta, scaling, 1.0f);
}

// The rotation is orthogonal, so its gradient is the rotation by the negative angle.
void rope_backward(float* dx, const int32_t* pos, int N, int H, int D, int ld, float theta,
                   const RopeScaling& scaling) {
  rope_rotate(dx, pos, N, H, D, ld, theta, scaling, -1.0f);
}

}  // namespace loom::cpu
