#include "kernels/cpu/sgemm_peak.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/blas.h"

namespace loom {

double measure_sgemm_peak_gflops(int threads, int n, int reps) {
  LOOM_CHECK(n > 0 && reps > 0, "measure_sgemm_peak_gflops: n=", n, " reps=", reps);
  // The OpenMP build of OpenBLAS also sets the OpenMP thread count: save and restore both.
  const int saved_blas = cpu::blas_threads();
  const int saved_omp = omp_get_max_threads();
  if (threads > 0) {
    cpu::set_blas_threads(threads);
    omp_set_num_threads(threads);
  }
  const size_t count = static_cast<size_t>(n) * n;
  std::vector<float> a(count), b(count), c(count, 0.0f);
  // Deterministic, non-trivial values (denormal-free, no special cases in the kernel).
  for (size_t i = 0; i < count; ++i) {
    a[i] = static_cast<float>((i * 7 + 3) % 101) / 101.0f - 0.5f;
    b[i] = static_cast<float>((i * 13 + 5) % 97) / 97.0f - 0.5f;
  }
  double best = 1e300;
  for (int r = 0; r <= reps; ++r) {  // run 0 warms caches and the BLAS thread pool
    const auto t0 = std::chrono::steady_clock::now();
    cpu::blas_sgemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::min(best, dt);
  }
  cpu::set_blas_threads(saved_blas);
  omp_set_num_threads(saved_omp);
  return 2.0 * n * static_cast<double>(n) * n / best * 1e-9;
}

}  // namespace loom
