// The weight-only decode kernels (kernels/cpu/gemm_lowp.h) alone: one pass over every linear
// layer of gpt2-124m (12 x [qkv 768->2304, proj 768->768, fc 768->3072, proj 3072->768] and the
// head 768->50304, each its own allocation, 124M weights: far past the caches) for M input rows,
// as one decode step of M streams does. Prints, per weight type and M, the time per pass, the
// weight bytes read per second (against the measured streaming-read bandwidth: the roofline of
// M = 1) and the multiply-adds per second (what bounds M = 16). Figures, not assertions.
// Two times per weight type and M: the best whole pass, and the sum over the layers of each
// call's best time ("per call"): on a loaded machine a pass (2-25 ms) is rarely left alone by
// the scheduler, a single call (20-700 us) often is, so the second is the steadier figure.
//
//   bench_gemm_lowp [--threads 1] [--reps 10] [--layers 12] [--head 1] [--m 1,16]
//                   [--types fp32,bf16,int8,fp8] [--huge 1] [--one 0]
//
// "mean" is the mean pass beside the best (what every call's spread inflates).
//
// Types fp8bw and fp8vbmi are fp8 with its single-input GEMV on the AVX512BW steps or on the byte
// permutes (the same bits; plain fp8 takes the CPU's default): `--types
// fp8vbmi,fp8bw,fp8vbmi,fp8bw` compares them alternating. Types bf16gemv, int8gemv and fp8gemv keep
// batches of kAmxMinRows or more off the AMX tile path (kernels/cpu/gemm_lowp_amx.h) on CPUs that
// have it: `--m 16 --types bf16,bf16gemv`.
// --huge 0 puts the weights and the bandwidth probe on 4 KiB pages instead of 2 MiB ones.
// --one 1 makes the same weights one [N, 768] matrix, read by one call instead of 4 per layer
// and the head's: the difference is what the calls cost beyond their bytes (thread start,
// each thread's first rows fetched cold, the wait for the slower thread at the end).
//
// Under valgrind --tool=callgrind (say --reps 1 --layers 1 --head 0, collecting in the kernels
// only: --collect-atstart=no --toggle-collect='loom::cpu::linear_*'
// --toggle-collect='loom::cpu::gemv_f32w*') the instruction counts per weight say what a kernel
// costs whatever the machine's load.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "core/bench_util.h"
#include "core/log.h"
#include "core/rng.h"
#include "infer/decode_bench.h"
#include "kernels/cpu/bf16_convert.h"
#include "kernels/cpu/gemm_lowp.h"
#include "kernels/cpu/gemm_lowp_amx.h"
#include "kernels/cpu/gemm_lowp_pages.h"

using namespace loom;

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

// Each type's weights of every layer lie in one allocation, as infer::QuantizedWeights keeps them
// (so that the huge pages of --huge 1 cover them whole).
struct Layer {
  int K, N;
  std::vector<float> scale, bias;
  float* f32 = nullptr;
  uint16_t* bf16 = nullptr;
  int8_t* i8 = nullptr;
  uint8_t* f8 = nullptr;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr,
               "bench_gemm_lowp: %s\nusage: bench_gemm_lowp [--threads N] [--reps N] [--layers "
               "N] [--head 0|1] [--m 1,16] [--types fp32,bf16,int8,fp8,fp8bw,fp8vbmi] [--huge 0|1] "
               "[--one 0|1]\n",
               why);
  std::exit(2);
}

int positive(const char* flag, const std::string& v) {
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != 0 || x < 1 || x > 100000)
    usage((std::string(flag) + " wants a positive integer, got '" + v + "'").c_str());
  return int(x);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 1, reps = 10, n_layer = 12, head = 1, huge = 1, one = 0;
  std::vector<int> ms = {1, 16};
  std::vector<std::string> types = {"fp32", "bf16", "int8", "fp8"};
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (i + 1 >= argc) usage(("a value is missing after " + k).c_str());
    const std::string v = argv[i + 1];
    if (k == "--threads")
      threads = positive("--threads", v);
    else if (k == "--reps")
      reps = positive("--reps", v);
    else if (k == "--layers")
      n_layer = positive("--layers", v);
    else if (k == "--head") {
      if (v != "0" && v != "1") usage(("--head wants 0 or 1, got '" + v + "'").c_str());
      head = v == "1";
    } else if (k == "--one") {
      if (v != "0" && v != "1") usage(("--one wants 0 or 1, got '" + v + "'").c_str());
      one = v == "1";
    } else if (k == "--huge") {
      if (v != "0" && v != "1") usage(("--huge wants 0 or 1, got '" + v + "'").c_str());
      huge = v == "1";
    } else if (k == "--m") {
      ms.clear();
      for (const std::string& m : split(v)) ms.push_back(positive("--m", m));
    } else if (k == "--types") {
      types = split(v);
      for (const std::string& t : types)
        if (t != "fp32" && t != "bf16" && t != "int8" && t != "fp8" && t != "fp8bw" &&
            t != "fp8vbmi" && t != "bf16gemv" && t != "int8gemv" && t != "fp8gemv")
          usage(("unknown type '" + t +
                 "' (fp32, bf16, int8, fp8, fp8bw, fp8vbmi, bf16gemv, int8gemv, fp8gemv)")
                    .c_str());
    } else
      usage(("unknown flag " + k).c_str());
  }
  omp_set_num_threads(threads);
  const int C = 768, V = 50304;
  std::vector<Layer> layers;
  for (int l = 0; l < n_layer; ++l)
    for (auto [K, N] : {std::pair{C, 3 * C}, {C, C}, {C, 4 * C}, {4 * C, C}})
      layers.push_back({K, N, {}, {}});
  if (head) layers.push_back({C, V, {}, {}});
  if (one) {  // the same weights as one [N, 768] matrix
    int64_t n = 0;
    for (const Layer& L : layers) n += int64_t(L.K) * L.N / C;
    layers.assign(1, Layer{C, int(n), {}, {}});
  }
  int64_t weights = 0;
  int max_k = 0, max_n = 0;
  for (const Layer& L : layers) weights += int64_t(L.K) * L.N;
  // Offsets in 64-byte units, as the serving copies align each layer.
  std::vector<int64_t> off;
  int64_t total = 0;
  for (const Layer& L : layers) {
    off.push_back(total);
    total += (int64_t(L.K) * L.N + 63) / 64 * 64;
  }
  cpu::HugeBuffer a32(size_t(total) * 4, huge), a16(size_t(total) * 2, huge),
      a8(size_t(total), huge), af8(size_t(total), huge);
  for (size_t i = 0; i < layers.size(); ++i) {
    Layer& L = layers[i];
    const size_t n = size_t(L.K) * L.N;
    max_k = std::max(max_k, L.K);
    max_n = std::max(max_n, L.N);
    L.f32 = a32.as<float>() + off[i];
    L.bf16 = a16.as<uint16_t>() + off[i];
    L.i8 = a8.as<int8_t>() + off[i];
    L.f8 = af8.as<uint8_t>() + off[i];
    for (size_t j = 0; j < n; ++j) L.f32[j] = 0.02f * normal_at(11, i, j);
    L.bias.assign(size_t(L.N), 0.01f);
    L.scale.resize(size_t(L.N));
    cpu::f32_to_bf16_array(L.f32, L.bf16, n);
    cpu::quantize_int8_rows(L.f32, L.N, L.K, L.i8, L.scale.data());
    std::vector<float> s8(size_t(L.N));
    cpu::quantize_fp8_rows(L.f32, L.N, L.K, L.f8, s8.data());
    // int8's scales serve fp8 too: the figures are about the bytes read, not the values.
  }
  const int max_m = *std::max_element(ms.begin(), ms.end());
  std::vector<float> x(size_t(max_m) * max_k), y(size_t(max_m) * max_n);
  for (size_t j = 0; j < x.size(); ++j) x[j] = normal_at(12, 0, j);
  const double bw = infer::measure_read_bandwidth_gbs(3, huge != 0);
  const double load0 = load_average();
  std::printf(
      "bench_gemm_lowp: %d layers%s, %.1fM weights, %d threads, AVX-512 %s, %s pages, "
      "fp8 by byte permutes %s, AMX tiles for M >= %d %s, streaming read %.2f GB/s, load %.2f\n",
      n_layer, head ? " + head" : "", weights / 1e6, threads,
      cpu::lowp_uses_avx512() ? "on" : "off", huge ? "2 MiB" : "4 KiB",
      cpu::lowp_uses_vbmi() ? "on" : "off", cpu::kAmxMinRows, cpu::lowp_uses_amx() ? "on" : "off",
      bw, load0);
  // What one OpenMP fork/join costs alone (best of 2000 regions): a pass makes one per call.
  double fork = 1e30;
  for (int r = 0; r < 2000; ++r) {
    volatile int sink = 0;
    const double t0 = now_seconds();
#pragma omp parallel
    sink = omp_get_thread_num();
    fork = std::min(fork, now_seconds() - t0);
    (void)sink;
  }
  std::printf("%zu calls per pass; an empty parallel region %.2f us (best of 2000)\n",
              layers.size(), fork * 1e6);
  std::printf("%-5s %3s %10s %10s %10s %8s %10s %12s %10s\n", "type", "M", "ms/pass", "mean",
              "GB/s", "of read", "GMAC/s", "ms per call", "GB/s");
  for (const std::string& type : types) {
    const bool gemv = type.ends_with("gemv");
    const std::string t = gemv ? type.substr(0, type.size() - 4) : type;
    const bool amx = cpu::lowp_uses_amx();  // (restored below)
    if (gemv) cpu::set_lowp_amx(false);
    const double bytes_per_weight = t == "fp32" ? 4 : t == "bf16" ? 2 : 1;
    const bool vbmi = cpu::lowp_uses_vbmi();  // (restored below)
    if (t == "fp8bw" || t == "fp8vbmi") cpu::set_lowp_vbmi(t == "fp8vbmi");
    for (int M : ms) {
      auto call = [&](Layer& L) {
        if (t == "fp32")
          cpu::gemv_f32w(y.data(), x.data(), L.f32, L.bias.data(), M, L.K, L.N);
        else if (t == "bf16")
          cpu::linear_bf16w(y.data(), x.data(), L.bf16, L.bias.data(), M, L.K, L.N);
        else if (t == "int8")
          cpu::linear_int8w(y.data(), x.data(), L.i8, L.scale.data(), L.bias.data(), M, L.K, L.N);
        else
          cpu::linear_fp8w(y.data(), x.data(), L.f8, L.scale.data(), L.bias.data(), M, L.K, L.N);
      };
      auto pass = [&] {
        for (Layer& L : layers) call(L);
      };
      pass();  // warm-up
      double best = 1e30, sum = 0;
      for (int r = 0; r < reps; ++r) {
        const double t0 = now_seconds();
        pass();
        const double dt = now_seconds() - t0;
        best = std::min(best, dt);
        sum += dt;
      }
      // Each call alone, best of reps per call (passes in order, so each call's weights come
      // from memory as in a pass).
      std::vector<double> call_best(layers.size(), 1e30);
      for (int r = 0; r < reps; ++r)
        for (size_t i = 0; i < layers.size(); ++i) {
          const double t0 = now_seconds();
          call(layers[i]);
          call_best[i] = std::min(call_best[i], now_seconds() - t0);
        }
      double calls = 0;
      for (double c : call_best) calls += c;
      const double gbs = weights * bytes_per_weight / best / 1e9;
      std::printf("%-5s %3d %10.2f %10.2f %10.2f %7.0f%% %10.2f %12.3f %10.2f\n", type.c_str(), M,
                  best * 1e3, sum / reps * 1e3, gbs, 100 * gbs / bw,
                  double(weights) * M / best / 1e9, calls * 1e3,
                  weights * bytes_per_weight / calls / 1e9);
    }
    cpu::set_lowp_vbmi(vbmi);
    cpu::set_lowp_amx(amx);
  }
  std::printf("load %.2f -> %.2f\n", load0, load_average());
  return 0;
}
