// Decode attention over the paged KV cache (cpu::paged_attention) on gpt2-124m's shape: one
// token's 12 layers for --streams sequences of --context cached positions, fp32, bf16 and fp8
// pools (fp8: E4M3 codes and a scale byte per row, kernels/cpu/kv_fp8.h); each type's time
// against fp32's.
// Between tokens a buffer the size of the int8 weights (128 MB) is read, as the GEMVs would, so
// the keys and values come from memory, not the caches. Prints microseconds per token (all
// layers) and the KV bytes read per second against the streaming-read probe of `loom bench serve
// --decode` (infer::measure_read_bandwidth_gbs, on the same threads, the faster of a run before
// and one after), beside the load average.
//
//   bench_paged_attention [--threads N] [--context C] [--streams S] [--reps R] [--flush 0|1]
//
// --flush 0 skips the read between tokens: the keys and values then come from the caches (L2/L3
// for one stream), which times the kernel's arithmetic rather than the memory.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/bench_util.h"
#include "core/dtype.h"
#include "core/log.h"
#include "infer/decode_bench.h"
#include "infer/kv_cache.h"
#include "kernels/cpu/gemm_lowp_pages.h"
#include "kernels/cpu/kv_fp8.h"
#include "kernels/cpu/paged_attention.h"

namespace {}  // namespace

int main(int argc, char** argv) {
  int threads = 1, context = 192, streams = 1, reps = 20, flush_between = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (a == "--threads")
      threads = v;
    else if (a == "--context")
      context = v;
    else if (a == "--streams")
      streams = v;
    else if (a == "--reps")
      reps = v;
    else if (a == "--flush")
      flush_between = v;
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (threads < 1 || context < 1 || streams < 1 || reps < 1) {
    std::fprintf(stderr, "--threads, --context, --streams and --reps must be positive\n");
    return 2;
  }
  omp_set_num_threads(threads);
  using namespace loom;
  const int layers = 12, H = 12, D = 64, bs = 16, ld = 3 * H * D;
  const float scale = 0.125f;
  const int blocks_per_seq = (context + bs - 1) / bs;
  const int num_blocks = blocks_per_seq * streams;
  // Each stream's blocks shuffled over the pool, as a served cache's are.
  std::vector<int32_t> ids(num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(1));
  std::vector<cpu::PagedChunk> chunks(streams);
  for (int s = 0; s < streams; ++s)
    chunks[s] = {1, context - 1, ids.data() + size_t(s) * blocks_per_seq, blocks_per_seq};
  std::vector<float> q(size_t(streams) * ld, 0.01f), out(size_t(streams) * H * D);
  std::vector<char> flush(size_t(128) << 20, 1);
  const size_t pool = size_t(num_blocks) * bs * H * D;
  std::printf(
      "paged attention, gpt2-124m shape (12 layers x 12 heads x 64), context %d, %d "
      "stream(s), %d thread(s), %s\n",
      context, streams, threads, flush_between ? "from memory" : "in cache");
  const double probe_before = infer::measure_read_bandwidth_gbs();
  struct Row {
    DType dt;
    double best, mean, bytes;
  };
  std::vector<Row> rows;
  for (DType dt : {DType::F32, DType::BF16, DType::F8E4M3}) {
    const size_t esz = dtype_size(dt);
    // On huge pages, as infer::KvCache keeps its pool.
    std::vector<cpu::HugeBuffer> k(layers), v(layers), ks(layers), vs(layers);
    std::mt19937 rng(2);
    std::uniform_real_distribution<float> ud(-1, 1);
    for (int l = 0; l < layers; ++l) {
      k[l] = cpu::HugeBuffer(pool * esz);
      v[l] = cpu::HugeBuffer(pool * esz);
      if (dt == DType::F8E4M3) {  // random rows, encoded as paged_kv_write does
        ks[l] = cpu::HugeBuffer(pool / D);
        vs[l] = cpu::HugeBuffer(pool / D);
        std::vector<float> row(D);
        for (size_t r = 0; r < pool / D; ++r) {
          for (float& x : row) x = ud(rng);
          ks[l].as<uint8_t>()[r] =
              cpu::kv_fp8_encode_row(row.data(), D, k[l].as<uint8_t>() + r * D);
          for (float& x : row) x = ud(rng);
          vs[l].as<uint8_t>()[r] =
              cpu::kv_fp8_encode_row(row.data(), D, v[l].as<uint8_t>() + r * D);
        }
        continue;
      }
      for (size_t e = 0; e < pool; ++e) {
        const float a = ud(rng), b = ud(rng);
        if (dt == DType::F32) {
          std::memcpy(k[l].as<char>() + e * 4, &a, 4);
          std::memcpy(v[l].as<char>() + e * 4, &b, 4);
        } else {
          const uint16_t ha = f32_to_bf16(a), hb = f32_to_bf16(b);
          std::memcpy(k[l].as<char>() + e * 2, &ha, 2);
          std::memcpy(v[l].as<char>() + e * 2, &hb, 2);
        }
      }
    }
    for (float& x : q) x = ud(rng);
    double best = 1e30, total = 0;
    volatile long sink = 0;
    for (int r = 0; r < reps; ++r) {
      long s = 0;
      if (flush_between)
        for (size_t i = 0; i < flush.size(); i += 64) s += flush[i];
      sink = sink + s;
      const double t0 = loom::now_seconds();
      for (int l = 0; l < layers; ++l) {
        cpu::PagedKvLayer c;
        c.k = k[l].data();
        c.v = v[l].data();
        c.dtype = dt;
        c.num_blocks = num_blocks;
        c.block_size = bs;
        c.n_kv_head = H;
        c.head_dim = D;
        if (dt == DType::F8E4M3) {
          c.k_scale = ks[l].as<uint8_t>();
          c.v_scale = vs[l].as<uint8_t>();
        }
        cpu::paged_attention(out.data(), q.data(), ld, c, chunks.data(), streams, H, scale);
      }
      const double t = loom::now_seconds() - t0;
      best = std::min(best, t);
      total += t;
    }
    const double bytes =
        2.0 * layers * streams * context * H * (D * esz + (dt == DType::F8E4M3 ? 1 : 0));
    rows.push_back({dt, best, total / reps, bytes});
  }
  const double probe = std::max(probe_before, infer::measure_read_bandwidth_gbs());
  for (const Row& r : rows)
    std::printf(
        "  %s cache: best %.1f us/token (mean %.1f), %.2f MB of KV, %.1f GB/s = %.0f%% of the "
        "probe's %.1f; %.2fx fp32's speed; load %.2f\n",
        infer::kv_stored_name(r.dt), r.best * 1e6, r.mean * 1e6, r.bytes / 1e6,
        r.bytes / r.best / 1e9, 100 * r.bytes / r.best / 1e9 / probe, probe, rows[0].best / r.best,
        loom::load_average());
  return 0;
}
