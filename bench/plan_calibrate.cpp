// Measures this machine for the planner (driven by bench/plan_calibrate.sh):
//   mpirun -n 2 bench_plan_calibrate comm --out comm.json
//       all-reduce, all-gather and reduce-scatter of 4 KiB ... 16 MiB between local ranks
//       (fp32), best of 5;
//   [mpirun -n R] bench_plan_calibrate compute --threads T --comm comm.json --out FILE.toml
//       the 2048^3 sgemm peak and sgemm at the GEMM shapes of small-model training, with T
//       OpenBLAS threads, every rank at once; stream-triad bandwidth from DRAM and inside the
//       last-level cache, every rank at once;
//       fits the planner's GEMM curve and the ring model's bandwidth and latency
//       (src/plan/calibration.h) and writes a cluster file `loom plan --config` reads.
// Prints every figure; asserts nothing about speed.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/bench_util.h"
#include "core/error.h"
#include "core/fs.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/sgemm_peak.h"
#include "plan/calibration.h"

using namespace loom;
using namespace loom::plan;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string arg(const std::vector<std::string>& a, const std::string& key, const std::string& def) {
  for (size_t i = 0; i + 1 < a.size(); ++i)
    if (a[i] == key) return a[i + 1];
  LOOM_CHECK(!def.empty(), "missing option ", key);
  return def;
}

int run_comm(const std::vector<std::string>& a) {
  comm::Communicator& w = comm::world();
  LOOM_CHECK(w.size() >= 2, "comm: run under mpirun -n 2 (or more); got ", w.size(), " rank(s)");
  std::vector<CommSample> samples;
  for (int64_t bytes = 4096; bytes <= (int64_t(32) << 20); bytes *= 4) {
    const int64_t n = bytes / 4;
    std::vector<float> buf(size_t(n), 1.0f);
    std::vector<int64_t> counts(size_t(w.size()), n / w.size());
    counts.back() += n - (n / w.size()) * w.size();
    const size_t mine = static_cast<size_t>(counts[static_cast<size_t>(w.rank())]);
    std::vector<float> recv(mine + 1);
    for (Collective op :
         {Collective::all_reduce, Collective::all_gather, Collective::reduce_scatter}) {
      const int inner = bytes <= (1 << 20) ? 50 : 3;
      double best = 1e30;
      for (int rep = 0; rep < 6; ++rep) {  // rep 0 warms up
        w.barrier();
        double t0 = now();
        for (int i = 0; i < inner; ++i) {
          if (op == Collective::all_reduce)
            w.all_reduce(buf.data(), n, DType::F32, comm::ReduceOp::Sum);
          else if (op == Collective::all_gather)
            w.all_gather(buf.data(), counts, DType::F32);
          else
            w.reduce_scatter(buf.data(), recv.data(), counts, DType::F32, comm::ReduceOp::Sum);
        }
        double dt = (now() - t0) / inner;
        w.all_reduce_f64(&dt, 1, comm::ReduceOp::Max);
        if (rep > 0) best = std::min(best, dt);
        std::fill(buf.begin(), buf.end(), 1.0f);  // keep sums finite
      }
      samples.push_back({op, w.size(), double(bytes), best});
      if (w.rank() == 0)
        std::printf("%-10s %d ranks %10lld B  %9.1f us  %7.2f GB/s algbw\n", name(op), w.size(),
                    (long long)bytes, best * 1e6, bytes / best / 1e9);
    }
  }
  if (w.rank() == 0) {
    LinkFit f = fit_link(samples);
    std::printf("fit: bus bandwidth %.2f GB/s, latency %.2f us per hop, summing %.2f GB/s\n",
                f.bw_gbs, f.lat_us, f.reduce_bw_gbs);
    write_file_atomic(arg(a, "--out", "comm.json"), comm_samples_json(samples).dump(2) + "\n");
  }
  comm::finalize();
  return 0;
}

// C[M,N] = op(A) op(B), row-major, as the linear layer calls it (kernels/cpu/gemm.cpp).
double time_sgemm(int M, int N, int K, bool ta, bool tb) {
  std::vector<float> A(size_t(M) * K, 0.25f), B(size_t(K) * N, 0.5f), C(size_t(M) * N);
  double flops = 2.0 * M * N * K;
  int inner = std::max(1, int(0.05 / (flops / 20e9)));  // ~50 ms per batch at 20 GFLOP/s
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {  // rep 0 warms up
    double t0 = now();
    for (int i = 0; i < inner; ++i)
      loom::cpu::blas_sgemm(ta, tb, M, N, K, 1.0f, A.data(), ta ? M : K, B.data(), tb ? K : N, 0.0f,
                            C.data(), N);
    if (rep > 0) best = std::min(best, (now() - t0) / inner);
  }
  return flops / best / 1e9;
}

// Stream triad a = b + s c over three arrays of n floats per thread, `threads` threads at once;
// total GB/s. Small n: the arrays stay in the cache and the triad repeats to last ~20 ms.
double triad_gbs(int threads, size_t n) {
  const int inner = std::max<int>(1, int((size_t(64) << 20) / (12 * n)));
  double total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
  {
    std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
    double best = 1e30;
    for (int rep = 0; rep < 5; ++rep) {  // rep 0 warms up
#pragma omp barrier
      double t0 = now();
      for (int it = 0; it < inner; ++it) {
        for (size_t i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
        b[it % n] = a[(it * 7) % n];  // a data dependence between repeats
      }
      double dt = (now() - t0) / inner;
      if (rep > 0) best = std::min(best, dt);
    }
    if (a[n / 2] < 0) std::printf("?");  // keep the loop
    total += 3.0 * 4 * n / best / 1e9;
  }
  return total;
}

// One GPT-2 layer's elementwise work as Loom runs it (two layer norms, GELU, two residual adds,
// forward and backward) on n tokens of width h, expressed as the bandwidth the planner's
// elementwise term would need to match it: that term charges 16 bytes per element of the
// hidden-size and MLP tensors per forward for 2-byte activations (x2 for fp32), backward 2x.
double elementwise_gbs(int n, int h) {
  const int64_t nh = int64_t(n) * h, nf = 4 * nh;
  std::vector<float> x(nh, 0.5f), y(nh), g(nh, 0.01f), dx(nh), w(h, 1.0f), b(h, 0.0f), dw(h), db(h),
      mean(n), rstd(n), u(nf, 0.3f), v(nf), du(nf, 0.01f), dv(nf);
  auto layer = [&] {
    for (int k = 0; k < 2; ++k) {
      cpu::layernorm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), n, h,
                             1e-5f);
      cpu::add(dx.data(), x.data(), y.data(), nh);
    }
    cpu::gelu_forward(v.data(), u.data(), nf);
    for (int k = 0; k < 2; ++k) {
      cpu::layernorm_backward(dx.data(), dw.data(), db.data(), g.data(), x.data(), w.data(),
                              mean.data(), rstd.data(), n, h);
      cpu::add_inplace(dx.data(), g.data(), nh);
    }
    cpu::gelu_backward(dv.data(), u.data(), du.data(), nf);
  };
  double best = 1e30;
  for (int rep = 0; rep < 6; ++rep) {  // rep 0 warms up
    double t0 = now();
    for (int i = 0; i < 10; ++i) layer();
    if (rep > 0) best = std::min(best, (now() - t0) / 10);
  }
  const double charged = 3 * 16.0 * 2 * (double(nh) + double(nf));  // fwd + 2x bwd, fp32
  return charged / best / 1e9;
}

// Last-level cache in bytes, from sysfs (glibc's sysconf reports 10x too much on some VMs);
// 0 if the system does not say.
double llc_bytes() {
  for (const char* idx : {"index3", "index2"}) {
    std::string path = cat("/sys/devices/system/cpu/cpu0/cache/", idx, "/size");
    FILE* f = std::fopen(path.c_str(), "r");
    if (!f) continue;
    double v = 0;
    char unit = 0;
    int got = std::fscanf(f, "%lf%c", &v, &unit);
    std::fclose(f);
    if (got >= 1 && v > 0) return v * (unit == 'K' ? 1024.0 : unit == 'M' ? 1048576.0 : 1.0);
  }
  return 0;
}

int run_compute(const std::vector<std::string>& a) {
  // Under mpirun every rank measures at the same time (barrier before each figure) and the
  // figures are averaged: ranks that share a node's cache and memory bus are measured sharing
  // them, as they train.
  comm::Communicator& w = comm::world();
  const bool root = w.rank() == 0;
  auto together = [&](auto measure) {
    w.barrier();
    double v = measure();
    w.all_reduce_f64(&v, 1, comm::ReduceOp::Avg);
    return v;
  };
  Calibration c;
  c.threads_per_rank = std::stoi(arg(a, "--threads", "1"));
  c.ranks_per_node = w.size();
  c.name = arg(a, "--name", "this-machine");
  c.load_avg = load_average();
  std::time_t t = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M UTC", std::gmtime(&t));
  char host[128] = "?";
  gethostname(host, sizeof host - 1);
  c.measured_at = cat(date, " on ", host, ", ", sysconf(_SC_NPROCESSORS_ONLN), " cores");

  const int T = c.threads_per_rank;
  loom::cpu::set_blas_threads(T);
  omp_set_num_threads(T);
  c.peak_gflops = together([&] { return measure_sgemm_peak_gflops(T, 2048, 3); });
  if (root) std::printf("sgemm 2048^3, %d thread(s): %.1f GFLOP/s\n", T, c.peak_gflops);
  // The linear layers of small-model training, (tokens, in, out): GPT-2 with d = 128 on 1024
  // tokens and d = 384 on 512 tokens (QKV, projection, MLP up and down, byte-level head), each
  // timed as its three GEMMs: forward X W^T, input gradient dY W, weight gradient dY^T X.
  const int layers[][3] = {{1024, 128, 384}, {1024, 128, 128}, {1024, 128, 512}, {1024, 512, 128},
                           {1024, 128, 256}, {512, 384, 1152}, {512, 384, 384},  {512, 384, 1536},
                           {512, 1536, 384}, {512, 384, 256}};
  for (auto& l : layers) {
    const int n = l[0], in = l[1], out = l[2];
    struct {
      int M, N, K;
      bool ta, tb;
    } g3[] = {{n, out, in, false, true}, {n, in, out, false, false}, {out, in, n, true, false}};
    for (auto& g : g3) {
      double r = together([&] { return time_sgemm(g.M, g.N, g.K, g.ta, g.tb); });
      c.gemm_samples.push_back({double(g.M), double(g.N), double(g.K), r});
      if (root)
        std::printf("sgemm %5d x %5d x %5d %s%s: %7.1f GFLOP/s\n", g.M, g.N, g.K, g.ta ? "T" : "N",
                    g.tb ? "T" : "N", r);
    }
  }
  // The peak is the best rate measured (the square GEMM usually; on a busy machine any).
  for (const GemmSample& g : c.gemm_samples) c.peak_gflops = std::max(c.peak_gflops, g.gflops);
  c.gemm = fit_gemm_curve(c.gemm_samples, c.peak_gflops);
  if (root)
    std::printf("peak %.1f GFLOP/s; fit: eff = %.3f / (1 + %.1f (1/M + 1/N + 1/K))\n",
                c.peak_gflops, c.gemm.top, c.gemm.d0);
  const int streams = T * c.ranks_per_node;
  c.mem_bw_gbs = together([&] { return triad_gbs(T, size_t(16) << 20); });
  double all = c.mem_bw_gbs * c.ranks_per_node;
  if (root)
    std::printf("triad, %d thread(s) at once: %.1f GB/s (%.1f per rank)\n", T * c.ranks_per_node,
                all, c.mem_bw_gbs);
  if (double llc = llc_bytes(); llc > 0) {
    c.cache_mb = llc / 1e6 / c.ranks_per_node;
    // Elementwise work on tensors that stay in the cache: Loom's own kernels at the runs'
    // widths (the triad inside the cache is printed for comparison).
    size_t n = size_t(llc / 2 / streams / 12);
    double triad = together([&] { return triad_gbs(T, n); });
    double e1 = together([&] { return elementwise_gbs(1024, 128); });
    double e2 = together([&] { return elementwise_gbs(512, 384); });
    c.cache_bw_gbs = 2 / (1 / e1 + 1 / e2);
    if (root)
      std::printf(
          "in cache, per rank: triad %.1f GB/s; Loom's layer-norm/GELU/residual kernels as the "
          "planner counts them: %.1f (1024 x 128), %.1f (512 x 384) -> %.1f GB/s\n",
          triad, e1, e2, c.cache_bw_gbs);
  }
  c.mem_gb = double(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE) / 1e9 / c.ranks_per_node;
  if (root) {
    std::string comm_file = arg(a, "--comm", "comm.json");
    c.link = fit_link(parse_comm_samples(Json::parse(read_file(comm_file), comm_file), comm_file));
    std::printf("link: %.2f GB/s, %.2f us, summing %.2f GB/s (from %s)\n", c.link.bw_gbs,
                c.link.lat_us, c.link.reduce_bw_gbs, comm_file.c_str());
    std::printf("load average (1 min): %.2f\n", c.load_avg);
    std::string out = arg(a, "--out", "this-machine.toml");
    write_file_atomic(out, cluster_toml(c));
    std::printf("wrote %s\n", out.c_str());
  }
  comm::finalize();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::vector<std::string> a(argv + 1, argv + argc);
    LOOM_CHECK(!a.empty() && (a[0] == "comm" || a[0] == "compute"),
               "usage: bench_plan_calibrate comm --out FILE (under mpirun -n 2) | [mpirun -n R] "
               "compute --threads T --comm FILE --name NAME --out FILE");
    return a[0] == "comm" ? run_comm(a) : run_compute(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_plan_calibrate: %s\n", e.what());
    return 1;
  }
}
