// Branch-free float math that inlines into loops the compiler auto-vectorises (-O3
// -march=native). std::exp / std::tanh do not vectorise without -ffast-math, and the
// softmax, cross-entropy, GeLU and SwiGLU kernels spend most of their time in them.
#pragma once

#include <bit>
#include <cstdint>

namespace loom::cpu {

// e^x, within about 1 ulp over the whole float range: overflows to +inf above ~88.72,
// underflows (through denormals) to 0 below ~-103.9, maps -inf to 0 and propagates NaN.
inline float fast_exp(float x) {
  // n = round(x / ln2) by the 1.5 * 2^23 trick, read back from the float's bits without a
  // float->int conversion (undefined for out-of-range x). Unsigned integer arithmetic: out of
  // range the bits are garbage, never UB, and the selects at the end replace the result.
  constexpr float kShift = 12582912.0f;
  const float t = x * 1.44269504088896341f + kShift;
  const float n = t - kShift;
  const uint32_t ni = std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(kShift);
  // r = x - n ln2 in two steps (Cody-Waite); n * kLn2Hi is exact since kLn2Hi has few bits.
  constexpr float kLn2Hi = 0.693145751953125f;
  constexpr float kLn2Lo = 1.428606765330187045e-06f;
  float r = x - n * kLn2Hi;
  r = r - n * kLn2Lo;
  // e^r for |r| <= ln2/2: Taylor series to degree 7 (truncation error < 1e-8 relative).
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // 2^n as two factors so that every n in [-150, 128] is a product of two normal powers of
  // two; the products round to denormals, 0 or inf exactly where e^x does.
  const uint32_t n1 = static_cast<uint32_t>(static_cast<int32_t>(ni) >> 1);
  const uint32_t n2 = ni - n1;
  const float s1 = std::bit_cast<float>((n1 + 127u) << 23);
  const float s2 = std::bit_cast<float>((n2 + 127u) << 23);
  const float e = p * s1 * s2;
  // Out of range: exact limits. Selecting at the end (not clamping x first) keeps GCC from
  // splitting the loop into per-range copies; NaN fails both tests and stays NaN.
  const float lo = x < -104.0f ? 0.0f : e;
  return x > 89.0f ? __builtin_inff() : lo;
}

// 1 / (1 + e^-x); exact limits 0 and 1 at the extremes.
inline float fast_sigmoid(float x) {
  return 1.0f / (1.0f + fast_exp(-x));
}

}  // namespace loom::cpu
