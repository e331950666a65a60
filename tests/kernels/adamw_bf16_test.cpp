// The bf16 policy's fused optimizer pass (cpu::adamw_to_bf16, Backend::adamw_to_bf16): the
// master, m and v exactly as cpu::adamw leaves them, and the model's working copies exactly
// core/dtype.h's rounding of the new master (fp32 container and bf16 bits), for rounding edge
// cases, NaN and infinities, lengths that leave a vector tail, and arrays long enough to be
// split over threads.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_ops.h"

using namespace loom;

namespace {

struct State {
  std::vector<float> p, g, m, v;
};

// Edge cases of the rounding (ties, denormals, the top of the range, NaN payloads) as the
// master's values, then pseudo-random weights, gradients and moments.
State make_state(size_t n) {
  const uint32_t edges[] = {0x00000000u, 0x80000000u, 0x00008000u, 0x00018000u, 0x007fffffu,
                            0x3f808000u, 0x3f818000u, 0xbf807fffu, 0x3fffffffu, 0x7f7f8000u,
                            0xff7fffffu, 0x7f800000u, 0x7f800001u, 0xffc00000u, 0x7fffffffu};
  State s;
  s.p.resize(n), s.g.resize(n), s.m.resize(n), s.v.resize(n);
  uint32_t r = 12345;
  auto next = [&r] {
    r = r * 1664525u + 1013904223u;
    return static_cast<float>(r >> 8) / 16777216.0f - 0.5f;
  };
  for (size_t i = 0; i < n; ++i) {
    s.p[i] = i < std::size(edges) ? bits_f32(edges[i]) : next();
    s.g[i] = i % 97 == 5 ? 1e30f : next();  // some huge: g*g overflows v to inf
    s.m[i] = 0.1f * next();
    s.v[i] = 0.01f * (next() + 0.5f);
  }
  return s;
}

void expect_bits(const float* a, const float* b, size_t n, const char* what) {
  for (size_t i = 0; i < n; ++i)
    ASSERT_EQ(f32_bits(a[i]), f32_bits(b[i])) << what << " element " << i;
}

// Runs the fused pass (through `run`) and the plain adamw on copies of one state, and checks
// every output against the plain pass and core's rounding.
template <typename Run>
void check(size_t n, bool store_bits, Run run) {
  State plain = make_state(n), fused = make_state(n);
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
  const int64_t step = 3;
  cpu::adamw(plain.p.data(), plain.g.data(), plain.m.data(), plain.v.data(), int64_t(n), lr, b1, b2,
             eps, wd, gs, step);
  std::vector<float> model(n, -7.f);
  std::vector<uint16_t> bits(n, 0x1234);
  run(fused, n, lr, b1, b2, eps, wd, gs, step, model.data(), store_bits ? bits.data() : nullptr);
  expect_bits(plain.p.data(), fused.p.data(), n, "master");
  expect_bits(plain.m.data(), fused.m.data(), n, "m");
  expect_bits(plain.v.data(), fused.v.data(), n, "v");
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = f32_to_bf16(plain.p[i]);
    ASSERT_EQ(f32_bits(model[i]), f32_bits(bf16_to_f32(h))) << "model element " << i;
    ASSERT_EQ(bits[i], store_bits ? h : uint16_t{0x1234}) << "bf16 copy element " << i;
  }
}

}  // namespace

TEST(AdamwBf16, FusedPassEqualsAdamwThenRounding) {
  for (size_t n : {size_t{15}, size_t{16}, size_t{1000}, size_t{70001}})
    for (bool store : {true, false})
      check(n, store,
            [](State& s, size_t n, float lr, float b1, float b2, float eps, float wd, float gs,
               int64_t step, float* model, uint16_t* bits) {
              cpu::adamw_to_bf16(s.p.data(), s.g.data(), s.m.data(), s.v.data(), int64_t(n), lr, b1,
                                 b2, eps, wd, gs, step, model, bits);
            });
}

// The CPU backend's op and Backend's default (adamw, copy, round_to: what a backend without a
// fused kernel runs) give the same bits.
TEST(AdamwBf16, BackendOpAndItsDefaultAgree) {
  Backend& be = cpu_backend();
  for (bool use_default : {false, true})
    check(4099, true,
          [&](State& s, size_t n, float lr, float b1, float b2, float eps, float wd, float gs,
              int64_t step, float* model, uint16_t* bits) {
            if (use_default)
              be.Backend::adamw_to_bf16(s.p.data(), s.g.data(), s.m.data(), s.v.data(), int64_t(n),
                                        lr, b1, b2, eps, wd, gs, step, model, bits);
            else
              be.adamw_to_bf16(s.p.data(), s.g.data(), s.m.data(), s.v.data(), int64_t(n), lr, b1,
                               b2, eps, wd, gs, step, model, bits);
          });
}

TEST(AdamwBf16, StepZeroIsRefused) {
  std::vector<float> x(4, 1.f);
  std::vector<uint16_t> h(4);
  EXPECT_THROW(cpu::adamw_to_bf16(x.data(), x.data(), x.data(), x.data(), 4, 1e-3f, 0.9f, 0.95f,
                                  1e-8f, 0.f, 1.f, 0, x.data(), h.data()),
               Error);
}
