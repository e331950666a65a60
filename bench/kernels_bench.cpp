// CPU kernel benchmark. Baseline: this machine's OpenBLAS sgemm peak (square 1024 and 2048,
// 1 and 2 threads). Each kernel runs on GPT-2-124M shapes (N = 256 tokens, C = 768,
// V = 50304) and reports its time, achieved memory bandwidth (the bytes the op must read and
// write at least, over its time) and, for GEMM-based ops, GFLOP/s as a fraction of sgemm peak.
// A last row times a GPT-2 MLP block forward + backward as a whole (kernels interleaved, as in
// training), to show what the mix of BLAS and OpenMP kernels achieves against the peak.
//
//   bench_kernels [--threads N] [--min-time SECONDS]
// Prints a table, then one JSON line (prefixed "json: "). Times are wall-clock: on a loaded
// machine a 2-thread region waits whenever its second thread is descheduled (milliseconds), so
// the 1-minute load average is printed with the results; trust figures taken near load 0.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/bench_util.h"
#include "core/error.h"
#include "core/json.h"
#include "kernels/backend.h"
#include "kernels/cpu/sgemm_peak.h"

namespace {

using loom::Json;
using loom::load_average;
using loom::time_best;

constexpr int kN = 256, kC = 768, kV = 50304, kHeads = 12, kHeadDim = 64;

std::vector<float> filled(size_t n, float scale, uint32_t seed) {
  std::vector<float> v(n);
  uint32_t s = seed * 2654435761u + 1;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = scale * (static_cast<float>(s >> 8) / 16777216.0f - 0.5f);
  }
  return v;
}

struct Row {
  std::string name, shape;
  double seconds, bytes, flops;
};

int parse_int(const char* s, const char* flag) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  LOOM_CHECK(end != s && *end == '\0' && v > 0, flag, " expects a positive integer, got '", s, "'");
  return static_cast<int>(v);
}

int run(int argc, char** argv) {
  int threads = 2;
  double min_time = 0.2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--threads" && i + 1 < argc) {
      threads = parse_int(argv[++i], "--threads");
    } else if (a == "--min-time" && i + 1 < argc) {
      min_time = std::atof(argv[++i]);
      LOOM_CHECK(min_time > 0, "--min-time expects seconds > 0, got '", argv[i], "'");
    } else {
      loom::fail("unknown argument '", a, "' (usage: bench_kernels [--threads N] [--min-time S])");
    }
  }

  const double load_before = load_average();
  std::printf("load average before: %.2f (on %d threads)\n", load_before, threads);
  // Baseline: sgemm peak.
  Json peaks = Json::object();
  std::printf("OpenBLAS sgemm peak (best of 3):\n");
  double peak_at_threads = 0.0;
  for (int n : {1024, 2048}) {
    for (int t : {1, 2}) {
      const double g = loom::measure_sgemm_peak_gflops(t, n, 3);
      std::printf("  n=%-5d threads=%d  %8.1f GFLOP/s\n", n, t, g);
      peaks[loom::cat(n, "x", t, "t")] = g;
      if (t == threads) peak_at_threads = std::max(peak_at_threads, g);
    }
  }
  if (peak_at_threads == 0.0) peak_at_threads = loom::measure_sgemm_peak_gflops(threads);
  std::printf("  baseline for ratios: %.1f GFLOP/s (%d threads)\n\n", peak_at_threads, threads);

  loom::set_num_threads(threads);
  loom::Backend& be = loom::cpu_backend();
  const int N = kN, C = kC, V = kV, F = 4 * kC;
  const size_t NC = size_t{N} * C;

  // Buffers (sized for the largest use).
  auto inp = filled(size_t{N} * F * 2, 2.0f, 1), dout = filled(size_t{N} * F * 2, 1.0f, 2);
  auto out = filled(size_t{N} * F * 2, 1.0f, 3), dinp = filled(size_t{N} * F * 2, 1.0f, 4);
  auto w_big = filled(size_t{F} * C, 0.05f, 5), dw_big = filled(size_t{F} * C, 0.0f, 6);
  auto wte = filled(size_t{V} * C, 0.05f, 7), dwte = filled(size_t{V} * C, 0.0f, 8);
  auto bias = filled(F, 0.1f, 9), dbias = filled(F, 0.0f, 10);
  auto lnw = filled(C, 1.0f, 11), lnb = filled(C, 0.1f, 12);
  std::vector<float> mean(N), rstd(N), losses(N);
  auto logits = filled(size_t{N} * V, 4.0f, 13);
  std::vector<int32_t> ids(N), targets(N), pos(N);
  for (int i = 0; i < N; ++i) ids[i] = (i * 7919) % V, targets[i] = (i * 104729) % V, pos[i] = i;
  const int64_t P = int64_t{16} << 20;  // optimizer / reduction length (16M params)
  auto param = filled(P, 0.1f, 14), grad = filled(P, 0.01f, 15), m = filled(P, 0.0f, 16),
       v = filled(P, 0.0f, 17);
  const double f4 = sizeof(float);

  std::vector<Row> rows;
  auto bench = [&](const std::string& name, const std::string& shape, double bytes, double flops,
                   const std::function<void()>& fn) {
    rows.push_back({name, shape, time_best(fn, min_time), bytes, flops});
    const Row& r = rows.back();
    std::printf("%-26s %-22s %10.1f us", r.name.c_str(), r.shape.c_str(), r.seconds * 1e6);
    if (r.bytes > 0) std::printf(" %8.1f GB/s", r.bytes / r.seconds * 1e-9);
    if (r.flops > 0)
      std::printf(" %8.1f GFLOP/s %5.1f%% of peak", r.flops / r.seconds * 1e-9,
                  100.0 * r.flops / r.seconds * 1e-9 / peak_at_threads);
    std::printf("\n");
    std::fflush(stdout);
  };
  std::printf("%-26s %-22s %13s %13s\n", "kernel", "shape", "time", "bandwidth");

  auto mm_fwd = [&](const char* name, int IC, int OC, const float* w, const float* b) {
    bench(name, loom::cat(N, "x", IC, "->", OC), f4 * (N * IC + OC * IC + N * OC),
          2.0 * N * IC * OC,
          [&, IC, OC, w, b] { be.matmul_forward(out.data(), inp.data(), w, b, N, IC, OC); });
  };
  auto mm_bwd = [&](const char* name, int IC, int OC, float* dw, float* db) {
    bench(name, loom::cat(N, "x", IC, "->", OC), f4 * (2.0 * N * OC + 2.0 * OC * IC + 2.0 * N * IC),
          4.0 * N * IC * OC, [&, IC, OC, dw, db] {
            be.matmul_backward(dinp.data(), dw, db, dout.data(), inp.data(), w_big.data(), N, IC,
                               OC);
          });
  };
  mm_fwd("matmul_fwd qkv", C, 3 * C, w_big.data(), bias.data());
  mm_fwd("matmul_fwd fc", C, F, w_big.data(), bias.data());
  mm_fwd("matmul_fwd proj", F, C, w_big.data(), bias.data());
  bench("matmul_fwd lm_head", loom::cat(N, "x", C, "->", V),
        f4 * (NC + double(V) * C + double(N) * V), 2.0 * N * C * V,
        [&] { be.matmul_forward(logits.data(), inp.data(), wte.data(), nullptr, N, C, V); });
  mm_bwd("matmul_bwd fc", C, F, dw_big.data(), dbias.data());
  mm_bwd("matmul_bwd proj", F, C, dw_big.data(), dbias.data());
  bench("matmul_bwd lm_head", loom::cat(N, "x", C, "->", V),
        f4 * (2.0 * N * V + 2.0 * double(V) * C + 2.0 * NC), 4.0 * N * C * V, [&] {
          be.matmul_backward(dinp.data(), dwte.data(), nullptr, logits.data(), inp.data(),
                             wte.data(), N, C, V);
        });

  bench("embedding_fwd", loom::cat(N, "x", C), f4 * 2 * NC, 0,
        [&] { be.embedding_forward(out.data(), ids.data(), wte.data(), N, C, false); });
  bench("embedding_bwd", loom::cat(N, "x", C), f4 * 3 * NC, 0,
        [&] { be.embedding_backward(dwte.data(), dout.data(), ids.data(), N, C); });
  bench("layernorm_fwd", loom::cat(N, "x", C), f4 * 2 * NC, 0, [&] {
    be.layernorm_forward(out.data(), mean.data(), rstd.data(), inp.data(), lnw.data(), lnb.data(),
                         N, C, 1e-5f);
  });
  bench("layernorm_bwd", loom::cat(N, "x", C), f4 * 3 * NC, 0, [&] {
    be.layernorm_backward(dinp.data(), dw_big.data(), dbias.data(), dout.data(), inp.data(),
                          lnw.data(), mean.data(), rstd.data(), N, C);
  });
  bench("rmsnorm_fwd", loom::cat(N, "x", C), f4 * 2 * NC, 0,
        [&] { be.rmsnorm_forward(out.data(), rstd.data(), inp.data(), lnw.data(), N, C, 1e-5f); });
  bench("rmsnorm_bwd", loom::cat(N, "x", C), f4 * 3 * NC, 0, [&] {
    be.rmsnorm_backward(dinp.data(), dw_big.data(), dout.data(), inp.data(), lnw.data(),
                        rstd.data(), N, C);
  });
  const int64_t NF = int64_t{N} * F;
  bench("gelu_fwd", loom::cat(N, "x", F), f4 * 2 * NF, 0,
        [&] { be.gelu_forward(out.data(), inp.data(), NF); });
  bench("gelu_bwd", loom::cat(N, "x", F), f4 * 3 * NF, 0,
        [&] { be.gelu_backward(dinp.data(), inp.data(), dout.data(), NF); });
  bench("swiglu_fwd", loom::cat(N, "x2x", F), f4 * 3 * NF, 0,
        [&] { be.swiglu_forward(out.data(), inp.data(), N, F); });
  bench("swiglu_bwd", loom::cat(N, "x2x", F), f4 * 5 * NF, 0,
        [&] { be.swiglu_backward(dinp.data(), inp.data(), dout.data(), N, F); });
  bench("rope_fwd (q)", loom::cat(N, "x", kHeads, "x", kHeadDim), f4 * 2 * NC, 0,
        [&] { be.rope_forward(out.data(), pos.data(), N, kHeads, kHeadDim, 3 * C, 10000.0f); });
  bench("add", loom::cat(N, "x", C), f4 * 3 * NC, 0,
        [&] { be.add(out.data(), inp.data(), dout.data(), static_cast<int64_t>(NC)); });
  bench("add_inplace", loom::cat(N, "x", C), f4 * 3 * NC, 0,
        [&] { be.add_inplace(out.data(), inp.data(), static_cast<int64_t>(NC)); });
  const int srows = N * kHeads;
  bench("softmax_fwd", loom::cat(srows, "x", N), f4 * 2.0 * srows * N, 0,
        [&] { be.softmax_forward(out.data(), inp.data(), srows, N); });
  bench("softmax_bwd", loom::cat(srows, "x", N), f4 * 3.0 * srows * N, 0,
        [&] { be.softmax_backward(dinp.data(), out.data(), dout.data(), srows, N); });
  auto logits_copy = logits;
  bench("cross_entropy (fused)", loom::cat(N, "x", V), f4 * 2.0 * N * V, 0, [&] {
    be.cross_entropy(losses.data(), logits_copy.data(), logits.data(), targets.data(), N, V,
                     1.0f / N, nullptr);
  });
  bench("adamw", loom::cat(P), f4 * 7.0 * P, 0, [&] {
    be.adamw(param.data(), grad.data(), m.data(), v.data(), P, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f,
             1.0f, 10);
  });
  // The bf16 policy's step: the update on the fp32 master, then the model's rounded fp32 weights
  // and their bf16 copy (2 bytes) derived from it; as separate passes (adamw, copy, round and
  // store) and fused (adamw_to_bf16). Bytes: the fused pass's 8.5 words per element.
  std::vector<float> model(P);
  std::vector<uint16_t> model16(P);
  bench("adamw + bf16 copy (passes)", loom::cat(P), f4 * 8.5 * P, 0, [&] {
    be.adamw(param.data(), grad.data(), m.data(), v.data(), P, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f,
             1.0f, 10);
    be.copy_d2d(model.data(), param.data(), f4 * P);
    be.round_to(loom::DType::BF16, model.data(), P, model16.data());
  });
  bench("adamw_to_bf16 (fused)", loom::cat(P), f4 * 8.5 * P, 0, [&] {
    be.adamw_to_bf16(param.data(), grad.data(), m.data(), v.data(), P, 1e-4f, 0.9f, 0.95f, 1e-8f,
                     0.1f, 1.0f, 10, model.data(), model16.data());
  });
  bench("sum_squares", loom::cat(P), f4 * P, 0, [&] {
    volatile double s = be.sum_squares(grad.data(), P);
    (void)s;
  });
  bench("all_finite", loom::cat(P), f4 * P, 0, [&] {
    volatile bool ok = be.all_finite(grad.data(), P);
    (void)ok;
  });

  // A GPT-2 MLP block, forward and backward, kernels interleaved as in training. Ratio: GEMM
  // FLOPs over the block's total time, against sgemm peak.
  {
    auto x = filled(NC, 1.0f, 20), ln = filled(NC, 1.0f, 21), h = filled(NF, 1.0f, 22),
         a = filled(NF, 1.0f, 23), y = filled(NC, 1.0f, 24), dy = filled(NC, 1.0f, 25),
         dh = filled(NF, 1.0f, 26), da = filled(NF, 1.0f, 27), dln = filled(NC, 1.0f, 28),
         dx = filled(NC, 1.0f, 29);
    auto wfc = filled(size_t{F} * C, 0.05f, 30), wpr = filled(size_t{F} * C, 0.05f, 31);
    auto dwfc = filled(size_t{F} * C, 0.0f, 32), dwpr = filled(size_t{F} * C, 0.0f, 33);
    auto bfc = filled(F, 0.1f, 34), bpr = filled(C, 0.1f, 35), dbfc = filled(F, 0.0f, 36),
         dbpr = filled(C, 0.0f, 37), dlnw = filled(C, 0.0f, 38), dlnb = filled(C, 0.0f, 39);
    bench("mlp_block fwd+bwd", loom::cat(N, "x", C, "x", F), 0, 6.0 * 2.0 * N * C * F, [&] {
      be.layernorm_forward(ln.data(), mean.data(), rstd.data(), x.data(), lnw.data(), lnb.data(), N,
                           C, 1e-5f);
      be.matmul_forward(h.data(), ln.data(), wfc.data(), bfc.data(), N, C, F);
      be.gelu_forward(a.data(), h.data(), NF);
      be.matmul_forward(y.data(), a.data(), wpr.data(), bpr.data(), N, F, C);
      be.add_inplace(y.data(), x.data(), static_cast<int64_t>(NC));
      be.matmul_backward(da.data(), dwpr.data(), dbpr.data(), dy.data(), a.data(), wpr.data(), N, F,
                         C);
      be.gelu_backward(dh.data(), h.data(), da.data(), NF);
      be.matmul_backward(dln.data(), dwfc.data(), dbfc.data(), dh.data(), ln.data(), wfc.data(), N,
                         C, F);
      be.layernorm_backward(dx.data(), dlnw.data(), dlnb.data(), dln.data(), x.data(), lnw.data(),
                            mean.data(), rstd.data(), N, C);
      be.add_inplace(dx.data(), dy.data(), static_cast<int64_t>(NC));
    });
  }

  Json kernels = Json::array();
  for (const Row& r : rows) {
    Json k = Json::object();
    k["name"] = r.name;
    k["shape"] = r.shape;
    k["us"] = r.seconds * 1e6;
    if (r.bytes > 0) k["gbps"] = r.bytes / r.seconds * 1e-9;
    if (r.flops > 0) {
      k["gflops"] = r.flops / r.seconds * 1e-9;
      k["fraction_of_sgemm_peak"] = r.flops / r.seconds * 1e-9 / peak_at_threads;
    }
    kernels.push_back(k);
  }
  Json result = Json::object();
  result["bench"] = "kernels";
  result["threads"] = threads;
  result["load_average_before"] = load_before;
  result["load_average_after"] = load_average();
  result["sgemm_peak_gflops"] = peaks;
  result["baseline_gflops"] = peak_at_threads;
  result["kernels"] = kernels;
  std::printf("json: %s\n", result.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "bench_kernels: %s\n", e.what());
    return 1;
  }
}
