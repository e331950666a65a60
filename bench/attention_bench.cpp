// Causal attention forward/backward speed (cpu::attention_*) on GPT-2 and Llama shapes.
// Prints GFLOP/s (causal FLOPs: forward 2*2*T^2/2*D*Hq per sequence, backward 2.5x forward),
// the ratio to this machine's OpenBLAS sgemm throughput with the same threads (the baseline),
// GFLOP/s per CPU-second per thread (meaningful on a shared machine), and the peak heap memory
// the kernel allocates per call; then one JSON line with the same figures.
//
//   bench_attention [--reps N] [--threads N] [--case NAME]
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <new>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/sgemm_peak.h"

// ---- heap accounting: every operator new in the process goes through these ------------------

namespace {
std::atomic<int64_t> g_live{0}, g_peak{0};

void* counted_alloc(size_t n, size_t align) {
  // A header of `head` bytes in front of each block keeps `align` alignment; its last 16 bytes
  // hold the block's size and the header's own size.
  const size_t head = std::max<size_t>(align, 16);
  void* raw = align > 16 ? std::aligned_alloc(align, (n + head + align - 1) / align * align)
                         : std::malloc(n + head);
  if (!raw) throw std::bad_alloc();
  char* p = static_cast<char*>(raw) + head;
  std::memcpy(p - 16, &n, sizeof n);
  std::memcpy(p - 8, &head, sizeof head);
  const int64_t live = g_live += (int64_t)n;
  int64_t peak = g_peak.load();
  while (live > peak && !g_peak.compare_exchange_weak(peak, live)) {
  }
  return p;
}

void counted_free(void* p) {
  if (!p) return;
  size_t n, head;
  std::memcpy(&n, static_cast<char*>(p) - 16, sizeof n);
  std::memcpy(&head, static_cast<char*>(p) - 8, sizeof head);
  g_live -= (int64_t)n;
  std::free(static_cast<char*>(p) - head);
}
}  // namespace

void* operator new(size_t n) {
  return counted_alloc(n, 16);
}
void* operator new[](size_t n) {
  return counted_alloc(n, 16);
}
void* operator new(size_t n, std::align_val_t a) {
  return counted_alloc(n, (size_t)a);
}
void* operator new[](size_t n, std::align_val_t a) {
  return counted_alloc(n, (size_t)a);
}
void operator delete(void* p) noexcept {
  counted_free(p);
}
void operator delete[](void* p) noexcept {
  counted_free(p);
}
void operator delete(void* p, size_t) noexcept {
  counted_free(p);
}
void operator delete[](void* p, size_t) noexcept {
  counted_free(p);
}
void operator delete(void* p, std::align_val_t) noexcept {
  counted_free(p);
}
void operator delete[](void* p, std::align_val_t) noexcept {
  counted_free(p);
}
void operator delete(void* p, size_t, std::align_val_t) noexcept {
  counted_free(p);
}
void operator delete[](void* p, size_t, std::align_val_t) noexcept {
  counted_free(p);
}

namespace {

struct Case {
  const char* name;
  int B, T, Hq, Hkv, D;
};

struct Figures {
  double fwd_s, bwd_s, fwd_cpu_s, bwd_cpu_s;  // best wall-clock and best CPU time per call
  double fwd_flops;
  int64_t fwd_bytes, bwd_bytes;
};

double wall_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
// CPU time of all threads: on a shared machine it shows the kernel's own efficiency even when
// wall-clock time includes waiting for a core.
double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

// Best wall and CPU time over at least `reps` runs and at least 0.3 s (short cases need many
// runs to see one undisturbed by other processes), after one warm-up run that also measures the
// peak heap growth during a call.
template <typename F>
void best_time(int reps, double* wall, double* cpu, int64_t* peak_bytes, F&& fn) {
  const int64_t before = g_live.load();
  g_peak = before;
  fn();
  *peak_bytes = g_peak.load() - before;
  *wall = *cpu = 1e300;
  const double start = wall_now();
  for (int r = 0; r < reps || (wall_now() - start < 0.3 && r < 1000); ++r) {
    const double w0 = wall_now(), c0 = cpu_now();
    fn();
    *cpu = std::min(*cpu, cpu_now() - c0);
    *wall = std::min(*wall, wall_now() - w0);
  }
}

Figures run_case(const Case& c, int reps) {
  const int N = c.B * c.T, ld = (c.Hq + 2 * c.Hkv) * c.D;
  std::vector<int32_t> cu(c.B + 1);
  for (int b = 0; b <= c.B; ++b) cu[b] = b * c.T;
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> qkv((size_t)N * ld), dout((size_t)N * c.Hq * c.D);
  for (float& x : qkv) x = normal(gen);
  for (float& x : dout) x = normal(gen);
  std::vector<float> out(dout.size()), lse((size_t)N * c.Hq), dqkv(qkv.size());
  const float scale = 1.0f / std::sqrt((float)c.D);
  const float* q = qkv.data();
  const float* k = q + c.Hq * c.D;
  const float* v = k + c.Hkv * c.D;
  float* dq = dqkv.data();
  float* dk = dq + c.Hq * c.D;
  float* dv = dk + c.Hkv * c.D;

  Figures f{};
  best_time(reps, &f.fwd_s, &f.fwd_cpu_s, &f.fwd_bytes, [&] {
    loom::cpu::attention_forward(out.data(), lse.data(), q, k, v, ld, cu.data(), c.B, c.Hq, c.Hkv,
                                 c.D, scale);
  });
  best_time(reps, &f.bwd_s, &f.bwd_cpu_s, &f.bwd_bytes, [&] {
    loom::cpu::attention_backward(dq, dk, dv, dout.data(), q, k, v, out.data(), lse.data(), ld,
                                  cu.data(), c.B, c.Hq, c.Hkv, c.D, scale);
  });
  // Causal FLOPs: QK^T and PV over the visible half of each sequence's score matrix.
  f.fwd_flops = (double)c.B * 2.0 * c.T * (double)c.T * c.D * c.Hq;
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3, threads = 0;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if ((a == "--reps" || a == "--threads") && i + 1 < argc) {
      (a == "--reps" ? reps : threads) = std::atoi(argv[++i]);
    } else if (a == "--case" && i + 1 < argc) {
      only = argv[++i];
    } else {
      std::fprintf(stderr,
                   "usage: bench_attention [--reps N] [--threads N] [--case NAME]\n"
                   "unknown argument: %s\n",
                   a.c_str());
      return 1;
    }
  }
  if (reps < 1) reps = 1;
  if (threads > 0) omp_set_num_threads(threads);
  const int nthreads = omp_get_max_threads();

  const Case cases[] = {
      {"gpt2_4x64", 4, 64, 12, 12, 64},
      {"gpt2_4x1024", 4, 1024, 12, 12, 64},
      {"llama_gqa_1x4096_d128", 1, 4096, 32, 8, 128},
  };
  std::vector<std::pair<Case, Figures>> results;
  for (const Case& c : cases) {
    if (!only.empty() && only != c.name) continue;
    std::fprintf(stderr, "running %s ...\n", c.name);
    results.push_back({c, run_case(c, reps)});
  }
  // Measured after the cases, so OpenBLAS's spinning worker threads do not slow them down.
  const double sgemm = loom::measure_sgemm_peak_gflops(nthreads);

  std::printf("causal attention, %d threads; baseline: OpenBLAS sgemm 2048^3 = %.1f GFLOP/s\n",
              nthreads, sgemm);
  std::printf("GFLOP/s from wall time; cpu GF/s/thr = FLOPs / CPU seconds of all threads\n");
  std::printf("%-22s %9s %8s %6s %9s %8s %6s %8s %8s %9s %9s\n", "case", "fwd ms", "GFLOP/s",
              "%sgemm", "bwd ms", "GFLOP/s", "%sgemm", "fwd cpu", "bwd cpu", "fwd KiB", "bwd KiB");
  std::printf("%-22s %9s %8s %6s %9s %8s %6s %8s %8s %9s %9s\n", "", "", "", "", "", "", "",
              "GF/s/thr", "GF/s/thr", "peak mem", "peak mem");
  std::string json = "{\"bench\":\"attention\",\"threads\":" + std::to_string(nthreads) +
                     ",\"sgemm_gflops\":" + std::to_string(sgemm) + ",\"cases\":[";
  bool first = true;
  for (const auto& [c, f] : results) {
    const double fwd = f.fwd_flops / f.fwd_s * 1e-9, bwd = 2.5 * f.fwd_flops / f.bwd_s * 1e-9;
    const double fwd_cpu = f.fwd_flops / f.fwd_cpu_s * 1e-9;
    const double bwd_cpu = 2.5 * f.fwd_flops / f.bwd_cpu_s * 1e-9;
    std::printf("%-22s %9.2f %8.1f %5.0f%% %9.2f %8.1f %5.0f%% %8.1f %8.1f %9.1f %9.1f\n", c.name,
                f.fwd_s * 1e3, fwd, 100 * fwd / sgemm, f.bwd_s * 1e3, bwd, 100 * bwd / sgemm,
                fwd_cpu, bwd_cpu, f.fwd_bytes / 1024.0, f.bwd_bytes / 1024.0);
    char buf[640];
    std::snprintf(buf, sizeof buf,
                  "%s{\"case\":\"%s\",\"B\":%d,\"T\":%d,\"Hq\":%d,\"Hkv\":%d,\"D\":%d,"
                  "\"fwd_ms\":%.3f,\"fwd_gflops\":%.2f,\"fwd_vs_sgemm\":%.3f,"
                  "\"bwd_ms\":%.3f,\"bwd_gflops\":%.2f,\"bwd_vs_sgemm\":%.3f,"
                  "\"fwd_cpu_gflops_per_thread\":%.2f,\"bwd_cpu_gflops_per_thread\":%.2f,"
                  "\"fwd_peak_bytes\":%lld,\"bwd_peak_bytes\":%lld}",
                  first ? "" : ",", c.name, c.B, c.T, c.Hq, c.Hkv, c.D, f.fwd_s * 1e3, fwd,
                  fwd / sgemm, f.bwd_s * 1e3, bwd, bwd / sgemm, fwd_cpu, bwd_cpu,
                  (long long)f.fwd_bytes, (long long)f.bwd_bytes);
    json += buf;
    first = false;
  }
  std::printf("%s]}\n", json.c_str());
  return 0;
}
