// Attention over the paged KV cache equals the dense causal attention of the whole sequence,
// for chunked prefill (queries starting mid-sequence), decode, GQA and MHA, blocks in any order.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/rng.h"
#include "kernels/backend.h"
#include "kernels/cpu/paged_attention.h"

using namespace loom;

namespace {

void check(int L, int start, int Hq, int Hkv, int D, int bs, DType dtype) {
  const int ld = (Hq + 2 * Hkv) * D;
  std::vector<float> qkv(size_t(L) * ld);
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = 2 * uniform_at(3, 4, i) - 1;
  if (dtype == DType::BF16)  // the cache rounds keys and values: compare against that
    for (int i = 0; i < L; ++i)
      for (int j = Hq * D; j < ld; ++j)
        qkv[size_t(i) * ld + j] = round_bf16(qkv[size_t(i) * ld + j]);
  const float scale = 1.f / std::sqrt(float(D));
  std::vector<float> dense(size_t(L) * Hq * D), lse(size_t(L) * Hq);
  const int32_t cu[2] = {0, L};
  cpu_backend().attention_forward(dense.data(), lse.data(), qkv.data(), qkv.data() + Hq * D,
                                  qkv.data() + (Hq + Hkv) * D, ld, cu, 1, Hq, Hkv, D, scale);
  // A pool twice as large as needed, the sequence's blocks scattered through it.
  const int nblocks = (L + bs - 1) / bs, pool = 2 * nblocks + 1;
  std::vector<int32_t> table;
  for (int b = 0; b < nblocks; ++b) table.push_back(pool - 1 - 2 * b);  // distinct, descending
  const size_t elems = size_t(pool) * bs * Hkv * D;
  std::vector<float> kf(elems), vf(elems);
  std::vector<uint16_t> kb(elems), vb(elems);
  cpu::PagedKv kv;
  kv.dtype = dtype;
  kv.k = dtype == DType::F32 ? static_cast<void*>(kf.data()) : kb.data();
  kv.v = dtype == DType::F32 ? static_cast<void*>(vf.data()) : vb.data();
  kv.block_size = bs, kv.Hkv = Hkv, kv.D = D;
  // Earlier positions written as one prefill, the rest as the chunk being computed.
  cpu::paged_kv_write(kv, table.data(), 0, start, qkv.data() + Hq * D, qkv.data() + (Hq + Hkv) * D,
                      ld);
  const float* q = qkv.data() + size_t(start) * ld;
  cpu::paged_kv_write(kv, table.data(), start, L - start, q + Hq * D, q + (Hq + Hkv) * D, ld);
  std::vector<float> out(size_t(L - start) * Hq * D);
  cpu::paged_attention_forward(out.data(), q, ld, L - start, start, Hq, scale, kv, table.data());
  for (size_t i = 0; i < out.size(); ++i)
    ASSERT_NEAR(out[i], dense[size_t(start) * Hq * D + i], 1e-5)
        << "L=" << L << " start=" << start << " Hq=" << Hq << " Hkv=" << Hkv << " i=" << i;
}

}  // namespace

TEST(PagedAttention, MatchesDenseAttentionForPrefillChunksAndDecode) {
  for (DType t : {DType::F32, DType::BF16}) {
    check(37, 0, 4, 4, 8, 16, t);    // whole prefill, MHA
    check(37, 20, 4, 2, 8, 16, t);   // a chunk mid-sequence, GQA
    check(33, 32, 6, 2, 16, 16, t);  // one decode token at a block boundary
    check(16, 15, 2, 1, 4, 4, t);    // small blocks
  }
}
