// bf16 GEMM benchmark. Baseline: fp32 sgemm (blas.h, OpenBLAS here) on the same shapes. Runs
// the GPT-2 124M training GEMMs (C = 768; qkv 768->2304, attn proj 768->768, fc 768->3072,
// fc proj 3072->768, lm head 768->50304) for B4xT64 (256 tokens) and B8xT256 (2048 tokens), in
// the three training layouts:
//   fwd      out[T,OC]  = x[T,IC] W[OC,IC]^T      (bf16 out)
//   dinp     dx[T,IC]   = dout[T,OC] W[OC,IC]     (bf16 out)
//   dweight  dW[OC,IC] += dout[T,OC]^T x[T,IC]    (fp32 out, beta = 1)
// and prints GFLOP/s of fp32 sgemm, of the bf16 GEMM on oneDNN and on the fallback (convert to
// fp32 + sgemm), and the ratio bf16 / sgemm; then the bf16 probe (gemm_bf16_peak.h) beside the
// sgemm probe. Best of at least 3 runs and --min-time seconds after a warm-up.
//
//   bench_gemm_bf16 [--threads N] [--min-time SECONDS] [--no-fallback]
// Times are wall-clock on a shared machine: the 1-minute load average is printed with them.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/bench_util.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/cpu/bf16_convert.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gemm_bf16.h"
#include "kernels/cpu/gemm_bf16_peak.h"
#include "kernels/cpu/sgemm_peak.h"

namespace {

using loom::load_average;

// Best of at least 3 runs: the bf16 GEMMs are long enough that 3 settle.
double time_best(const std::function<void()>& fn, double min_time) {
  return loom::time_best(fn, min_time, 3);
}

std::vector<float> filled(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(s >> 8) / 16777216.0f - 0.5f;
  }
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = loom::f32_to_bf16(v[i]);
  return h;
}

int parse_int(const char* s, const char* flag) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  LOOM_CHECK(end != s && *end == '\0' && v > 0, flag, " expects a positive integer, got '", s, "'");
  return static_cast<int>(v);
}

double parse_seconds(const char* s) {
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  LOOM_CHECK(end != s && *end == '\0' && v >= 0.0, "--min-time expects seconds, got '", s, "'");
  return v;
}

double max_deviation(const std::vector<float>& ref, const std::vector<uint16_t>& got) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    worst = std::max(worst, double(std::fabs(ref[i] - loom::bf16_to_f32(got[i]))));
    scale = std::max(scale, double(std::fabs(ref[i])));
  }
  return scale > 0 ? worst / scale : worst;
}

struct Linear {
  const char* name;
  int in, out;
};

enum class Layout { Fwd, Dinp, Dweight };
const char* layout_name(Layout l) {
  return l == Layout::Fwd ? "fwd" : l == Layout::Dinp ? "dinp" : "dweight";
}

struct Totals {
  double flops = 0, sgemm = 0, bf16 = 0, fallback = 0;
};

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  double min_time = 0.3;
  bool with_fallback = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) {
      threads = parse_int(argv[++i], "--threads");
    } else if (a == "--min-time" && i + 1 < argc) {
      min_time = parse_seconds(argv[++i]);
    } else if (a == "--no-fallback") {
      with_fallback = false;
    } else {
      loom::fail("unknown argument '", a,
                 "' (usage: bench_gemm_bf16 [--threads N] [--min-time S] [--no-fallback])");
    }
  }
  loom::set_num_threads(threads);
  std::printf("load average before: %.2f (on %d threads); bf16 path: %s\n", load_average(), threads,
              loom::cpu::bf16_gemm_path_name());
  const bool have_onednn = loom::cpu::bf16_gemm_path() == loom::cpu::Bf16GemmPath::OneDnn;

  const Linear layers[] = {{"qkv", 768, 2304},
                           {"attn_proj", 768, 768},
                           {"fc", 768, 3072},
                           {"fc_proj", 3072, 768},
                           {"lm_head", 768, 50304}};
  const struct {
    const char* name;
    int tokens;
  } batches[] = {{"B4xT64", 256}, {"B8xT256", 2048}};

  std::printf("\n%-8s %-9s %-8s %-18s %9s %9s %9s %9s\n", "batch", "layer", "layout", "M x N x K",
              "sgemm", "bf16", "fallback", "bf16/sg");
  std::printf("%-8s %-9s %-8s %-18s %9s %9s %9s %9s\n", "", "", "", "", "GFLOP/s", "GFLOP/s",
              "GFLOP/s", "");
  for (const auto& batch : batches) {
    const int T = batch.tokens;
    Totals totals, block;  // block: the four transformer-block layers (no lm head)
    for (const Linear& l : layers) {
      const auto x = filled(size_t(T) * l.in, 1), w = filled(size_t(l.out) * l.in, 2),
                 dout = filled(size_t(T) * l.out, 3);
      const auto x16 = to_bf16(x), w16 = to_bf16(w), dout16 = to_bf16(dout);
      std::vector<float> out(size_t(T) * l.out), dinp(size_t(T) * l.in),
          dweight(size_t(l.out) * l.in, 0.0f);
      std::vector<uint16_t> out16(out.size()), dinp16(dinp.size());
      for (Layout layout : {Layout::Fwd, Layout::Dinp, Layout::Dweight}) {
        int M = 0, N = 0, K = 0;
        std::function<void()> sgemm, bf16;
        // Largest |bf16 - fp32| over the largest |fp32| of one output: a sanity check that the
        // timed GEMMs compute the same thing (bf16 inputs: expect ~1e-2).
        std::function<double()> deviation;
        switch (layout) {
          case Layout::Fwd:
            M = T, N = l.out, K = l.in;
            sgemm = [&] {
              loom::cpu::gemm(false, true, M, N, K, 1.0f, x.data(), K, w.data(), K, 0.0f,
                              out.data(), N);
            };
            bf16 = [&] {
              loom::cpu::gemm_bf16(false, true, M, N, K, 1.0f, x16.data(), K, w16.data(), K, 0.0f,
                                   out16.data(), N);
            };
            deviation = [&] { return max_deviation(out, out16); };
            break;
          case Layout::Dinp:
            M = T, N = l.in, K = l.out;
            sgemm = [&] {
              loom::cpu::gemm(false, false, M, N, K, 1.0f, dout.data(), K, w.data(), N, 0.0f,
                              dinp.data(), N);
            };
            bf16 = [&] {
              loom::cpu::gemm_bf16(false, false, M, N, K, 1.0f, dout16.data(), K, w16.data(), N,
                                   0.0f, dinp16.data(), N);
            };
            deviation = [&] { return max_deviation(dinp, dinp16); };
            break;
          case Layout::Dweight:
            M = l.out, N = l.in, K = T;
            sgemm = [&] {
              loom::cpu::gemm(true, false, M, N, K, 1.0f, dout.data(), M, x.data(), N, 1.0f,
                              dweight.data(), N);
            };
            bf16 = [&] {
              loom::cpu::gemm_bf16(true, false, M, N, K, 1.0f, dout16.data(), M, x16.data(), N,
                                   1.0f, dweight.data(), N);
            };
            break;
        }
        const double flops = 2.0 * M * double(N) * K;
        const double t_sgemm = time_best(sgemm, min_time);
        const double t_bf16 = have_onednn ? time_best(bf16, min_time) : 0.0;
        double dev = deviation ? deviation() : -1.0;
        double t_fallback = 0.0;
        if (with_fallback) {
          loom::cpu::force_bf16_gemm_fallback(true);
          t_fallback = time_best(bf16, min_time);
          if (deviation) dev = std::max(dev, deviation());
          loom::cpu::force_bf16_gemm_fallback(false);
        }
        auto gf = [&](double t) { return t > 0 ? flops / t * 1e-9 : 0.0; };
        const std::string shape =
            std::to_string(M) + "x" + std::to_string(N) + "x" + std::to_string(K);
        std::printf("%-8s %-9s %-8s %-18s %9.1f %9.1f %9.1f %9.2f", batch.name, l.name,
                    layout_name(layout), shape.c_str(), gf(t_sgemm), gf(t_bf16), gf(t_fallback),
                    t_bf16 > 0 ? t_sgemm / t_bf16 : 0.0);
        if (dev >= 0) std::printf("  dev %.1e", dev);
        std::printf("\n");
        std::fflush(stdout);
        for (Totals* t : {&totals, std::string(l.name) == "lm_head" ? nullptr : &block}) {
          if (t == nullptr) continue;
          t->flops += flops;
          t->sgemm += t_sgemm;
          t->bf16 += t_bf16;
          t->fallback += t_fallback;
        }
      }
    }
    for (const auto& [label, t] : {std::pair{"block", block}, std::pair{"all", totals}}) {
      auto gf = [&](double s) { return s > 0 ? t.flops / s * 1e-9 : 0.0; };
      std::printf("%-8s %-9s %-8s %-18s %9.1f %9.1f %9.1f %9.2f\n", batch.name, label, "total", "",
                  gf(t.sgemm), gf(t.bf16), gf(t.fallback), t.bf16 > 0 ? t.sgemm / t.bf16 : 0.0);
    }
  }
  {
    // Array conversions (bf16_convert.h) against their portable loops: GB/s of bytes read and
    // written, on a 768 x 50304 matrix (the lm head / embedding weight).
    const size_t n = size_t(768) * 50304;
    const auto f = filled(n, 9);
    std::vector<uint16_t> h(n);
    std::vector<float> back(n);
    auto gbs = [&](double t, double bytes_per_elem) { return n * bytes_per_elem / t * 1e-9; };
    const double t_narrow =
        time_best([&] { loom::cpu::f32_to_bf16_array(f.data(), h.data(), n); }, min_time);
    const double t_narrow_portable =
        time_best([&] { loom::cpu::f32_to_bf16_array_portable(f.data(), h.data(), n); }, min_time);
    const double t_widen =
        time_best([&] { loom::cpu::bf16_to_f32_array(h.data(), back.data(), n); }, min_time);
    const double t_widen_portable = time_best(
        [&] { loom::cpu::bf16_to_f32_array_portable(h.data(), back.data(), n); }, min_time);
    std::printf(
        "\nconversions, %zu elements (%s): fp32->bf16 %.1f GB/s (portable, 1 thread "
        "%.1f); bf16->fp32 %.1f GB/s (portable, 1 thread %.1f)\n",
        n, loom::cpu::bf16_convert_uses_avx512() ? "avx512" : "portable", gbs(t_narrow, 6),
        gbs(t_narrow_portable, 6), gbs(t_widen, 6), gbs(t_widen_portable, 6));
  }
  const double sgemm_peak = loom::measure_sgemm_peak_gflops(threads);
  const double bf16_peak = loom::measure_bf16_gemm_peak_gflops(threads);
  std::printf(
      "\nprobes (%d threads): sgemm peak %.1f GFLOP/s (2048^3); bf16 GEMM probe %.1f "
      "GFLOP/s (124M block layers, 2048 tokens, path %s); ratio %.2f\n",
      threads, sgemm_peak, bf16_peak, loom::cpu::bf16_gemm_path_name(), bf16_peak / sgemm_peak);
  std::printf("load average after: %.2f\n", load_average());
  return 0;
}
