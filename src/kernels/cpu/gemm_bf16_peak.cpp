#include "kernels/cpu/gemm_bf16_peak.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/gemm_bf16.h"

namespace loom {
namespace {

std::vector<uint16_t> bf16_values(size_t n, uint32_t salt) {
  std::vector<uint16_t> v(n);
  // Deterministic, non-trivial values of training-like magnitude.
  for (size_t i = 0; i < n; ++i)
    v[i] = f32_to_bf16(static_cast<float>((i * 7 + salt) % 101) / 101.0f - 0.5f);
  return v;
}

}  // namespace

double measure_bf16_gemm_peak_gflops(int threads, int tokens, int reps) {
  LOOM_CHECK(tokens > 0 && reps > 0, "measure_bf16_gemm_peak_gflops: tokens=", tokens,
             " reps=", reps);
  const int saved_blas = cpu::blas_threads();
  const int saved_omp = omp_get_max_threads();
  if (threads > 0) {
    cpu::set_blas_threads(threads);
    omp_set_num_threads(threads);
  }
  struct Linear {
    int in, out;
  };
  const Linear layers[] = {{768, 2304}, {768, 768}, {768, 3072}, {3072, 768}};
  double flops = 0.0, seconds = 0.0;
  for (const Linear& l : layers) {
    const auto x = bf16_values(static_cast<size_t>(tokens) * l.in, 3);
    const auto w = bf16_values(static_cast<size_t>(l.out) * l.in, 5);
    const auto dout = bf16_values(static_cast<size_t>(tokens) * l.out, 11);
    std::vector<uint16_t> out(static_cast<size_t>(tokens) * l.out);
    std::vector<uint16_t> dinp(static_cast<size_t>(tokens) * l.in);
    std::vector<float> dweight(static_cast<size_t>(l.out) * l.in, 0.0f);
    auto best_of = [&](auto&& gemm) {
      double best = 1e300;
      for (int r = 0; r <= reps; ++r) {  // run 0 creates the primitive and warms caches
        const auto t0 = std::chrono::steady_clock::now();
        gemm();
        const double dt =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (r > 0) best = std::min(best, dt);
      }
      return best;
    };
    seconds += best_of([&] {
      cpu::gemm_bf16(false, true, tokens, l.out, l.in, 1.0f, x.data(), l.in, w.data(), l.in, 0.0f,
                     out.data(), l.out);
    });
    seconds += best_of([&] {
      cpu::gemm_bf16(false, false, tokens, l.in, l.out, 1.0f, dout.data(), l.out, w.data(), l.in,
                     0.0f, dinp.data(), l.in);
    });
    seconds += best_of([&] {
      cpu::gemm_bf16(true, false, l.out, l.in, tokens, 1.0f, dout.data(), l.out, x.data(), l.in,
                     1.0f, dweight.data(), l.in);
    });
    flops += 3.0 * 2.0 * tokens * static_cast<double>(l.in) * l.out;
  }
  cpu::set_blas_threads(saved_blas);
  omp_set_num_threads(saved_omp);
  return flops / seconds * 1e-9;
}

}  // namespace loom
