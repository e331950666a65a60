// Paged attention (cpu::paged_attention over a block pool) against the dense causal attention
// (cpu_backend().attention_forward) on random data: each chunk's queries must see exactly what
// the dense kernel computes for the same rows of the whole sequence, for decodes, chunked
// prefills (start_pos > 0) ending on and off block boundaries, GQA and MHA, fp32 and bf16 pools;
// and the same bits whatever the thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/cpu/paged_attention.h"

namespace loom::cpu {
namespace {

struct Case {
  int Hq, Hkv, D, bs;
  std::vector<std::pair<int, int>> chunks;  // (start_pos, n) per sequence
  DType dtype;
};

void run_case(const Case& cs, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int Hq = cs.Hq, Hkv = cs.Hkv, D = cs.D, bs = cs.bs;
  const int ld = (Hq + 2 * Hkv) * D;
  const float scale = 1.0f / std::sqrt(float(D));
  const int ns = static_cast<int>(cs.chunks.size());

  // Random block tables over a shuffled pool with spare blocks.
  int total_blocks = 3;
  for (auto [start, n] : cs.chunks) total_blocks += (start + n + bs - 1) / bs;
  std::vector<int32_t> ids(total_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const int64_t pool_elems = int64_t(total_blocks) * bs * Hkv * D;
  std::vector<float> kf(pool_elems, NAN), vf(pool_elems, NAN);  // unwritten slots poison
  std::vector<uint16_t> kh(pool_elems, 0x7fc0), vh(pool_elems, 0x7fc0);
  PagedKvLayer cache;
  cache.dtype = cs.dtype;
  cache.k = cs.dtype == DType::F32 ? (void*)kf.data() : (void*)kh.data();
  cache.v = cs.dtype == DType::F32 ? (void*)vf.data() : (void*)vh.data();
  cache.num_blocks = total_blocks;
  cache.block_size = bs;
  cache.n_kv_head = Hkv;
  cache.head_dim = D;

  std::vector<std::vector<int32_t>> tables(ns);
  std::vector<std::vector<float>> qkv(ns);
  std::vector<PagedChunk> past, now;
  std::vector<float> q_new, k_new, v_new, k_past, v_past, expect;
  int next_id = 0;
  for (int s = 0; s < ns; ++s) {
    auto [start, n] = cs.chunks[s];
    const int L = start + n;
    for (int b = 0; b < (L + bs - 1) / bs; ++b) tables[s].push_back(ids[next_id++]);
    auto& x = qkv[s];
    x.resize(size_t(L) * ld);
    for (float& e : x) e = nd(rng);
    if (cs.dtype == DType::BF16)  // the dense reference sees the values the pool stores
      for (int p = 0; p < L; ++p)
        for (int i = Hq * D; i < ld; ++i) x[size_t(p) * ld + i] = round_bf16(x[size_t(p) * ld + i]);
    std::vector<float> out(size_t(L) * Hq * D), lse(size_t(L) * Hq);
    std::vector<int32_t> cu{0, L};
    cpu_backend().attention_forward(out.data(), lse.data(), x.data(), x.data() + Hq * D,
                                    x.data() + (Hq + Hkv) * D, ld, cu.data(), 1, Hq, Hkv, D, scale);
    expect.insert(expect.end(), out.begin() + size_t(start) * Hq * D, out.end());
    for (int p = 0; p < L; ++p) {
      const float* row = x.data() + size_t(p) * ld;
      auto& kd = p < start ? k_past : k_new;
      auto& vd = p < start ? v_past : v_new;
      kd.insert(kd.end(), row + Hq * D, row + (Hq + Hkv) * D);
      vd.insert(vd.end(), row + (Hq + Hkv) * D, row + ld);
      if (p >= start) q_new.insert(q_new.end(), row, row + Hq * D);
    }
    past.push_back({start, 0, tables[s].data(), (int)tables[s].size()});
    now.push_back({n, start, tables[s].data(), (int)tables[s].size()});
  }
  // The cached past, then this step's new rows, as the runner would write them.
  paged_kv_write(cache, k_past.data(), v_past.data(), Hkv * D, past.data(), ns);
  paged_kv_write(cache, k_new.data(), v_new.data(), Hkv * D, now.data(), ns);
  std::vector<float> got(expect.size(), NAN);
  paged_attention(got.data(), q_new.data(), Hq * D, cache, now.data(), ns, Hq, scale);
  for (size_t i = 0; i < expect.size(); ++i)
    ASSERT_NEAR(got[i], expect[i], 1e-5) << "element " << i;
  // The bits do not depend on the thread count, which decides how many ranges the kv heads are
  // split into (a single decode over 4 threads: 4 ranges).
  const int threads = omp_get_max_threads();
  for (int t : {1, 3, 4}) {
    omp_set_num_threads(t);
    std::vector<float> again(expect.size(), NAN);
    paged_attention(again.data(), q_new.data(), Hq * D, cache, now.data(), ns, Hq, scale);
    EXPECT_EQ(again, got) << t << " threads";
  }
  omp_set_num_threads(threads);
}

TEST(PagedAttention, DecodesMatchDense) {
  for (DType dt : {DType::F32, DType::BF16})
    run_case({8, 2, 32, 16, {{0, 1}, {15, 1}, {16, 1}, {40, 1}, {63, 1}}, dt}, 1);
}

// Head dimensions the vector dot product splits differently (pairs of 16 lanes, a last single
// vector, the scalar loop), over many blocks (each one's successor prefetched).
TEST(PagedAttention, DecodesMatchDenseForEveryHeadDimension) {
  for (int D : {48, 80, 24, 12})
    for (DType dt : {DType::F32, DType::BF16})
      run_case({4, 2, D, 8, {{0, 1}, {7, 1}, {8, 1}, {100, 1}, {200, 3}}, dt}, 7 + D);
  // The largest head the decode kernel keeps in registers, blocks of 32 (two tiles of 16).
  for (DType dt : {DType::F32, DType::BF16})
    run_case({4, 2, 128, 32, {{0, 1}, {31, 1}, {32, 1}, {47, 1}, {150, 1}}, dt}, 9);
}

TEST(PagedAttention, ChunkedPrefillMatchesDense) {
  for (DType dt : {DType::F32, DType::BF16}) {
    run_case({4, 4, 16, 16, {{0, 37}, {16, 16}, {5, 30}, {33, 1}}, dt}, 2);    // MHA
    run_case({6, 2, 8, 4, {{0, 4}, {4, 4}, {7, 9}, {3, 50}, {0, 1}}, dt}, 3);  // GQA, tiny blocks
  }
}

TEST(PagedAttention, OneLongPrefillAndManyDecodesTogether) {
  std::vector<std::pair<int, int>> chunks{{0, 130}};
  for (int i = 0; i < 12; ++i) chunks.push_back({i * 7 + 1, 1});
  run_case({8, 1, 64, 16, chunks, DType::F32}, 4);
}

// One decode: its kv heads are split into ranges over the threads, each range read a block at
// a time in memory order.
TEST(PagedAttention, OneDecodeOverThreadsMatchesDense) {
  run_case({8, 4, 32, 16, {{70, 1}}, DType::F32}, 5);   // GQA
  run_case({6, 6, 16, 16, {{40, 1}}, DType::BF16}, 6);  // MHA
}

TEST(PagedAttention, RejectsBadTablesAndShapes) {
  std::vector<float> k(4 * 4 * 2), v(k.size()), q(8), out(8);
  PagedKvLayer c{k.data(), v.data(), DType::F32, 4, 4, 1, 2};
  std::vector<int32_t> table{0};
  PagedChunk too_short{5, 0, table.data(), 1};  // 5 positions need 2 blocks
  EXPECT_THROW(paged_attention(out.data(), q.data(), 2, c, &too_short, 1, 1, 1.0f), Error);
  std::vector<int32_t> bad{7};
  PagedChunk out_of_pool{1, 0, bad.data(), 1};
  EXPECT_THROW(paged_kv_write(c, k.data(), v.data(), 2, &out_of_pool, 1), Error);
  PagedChunk ok{1, 0, table.data(), 1};
  EXPECT_THROW(paged_attention(out.data(), q.data(), 1, c, &ok, 1, 1, 1.0f), Error);  // ldq < D
  c.n_kv_head = 2;
  c.head_dim = 1;
  EXPECT_THROW(paged_attention(out.data(), q.data(), 3, c, &ok, 1, 3, 1.0f), Error);  // 3 % 2
}

}  // namespace
}  // namespace loom::cpu
