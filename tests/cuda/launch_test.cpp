// Host-side launch planning: grid sizes, attention tile shapes and schedules, reduction
// chunking, multi-tensor chunk tables. Also: without a GPU the backend reports it clearly.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "core/error.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/launch.h"

namespace loom::cuda {
namespace {

TEST(Launch, Grid1dCoversAndCaps) {
  EXPECT_EQ(grid_1d(0), 1);
  EXPECT_EQ(grid_1d(1), 1);
  EXPECT_EQ(grid_1d(256), 1);
  EXPECT_EQ(grid_1d(257), 2);
  EXPECT_EQ(grid_1d(1000, 128, 4), 2);
  EXPECT_EQ(grid_1d(int64_t{1} << 40), kMaxGrid1d);
  EXPECT_THROW(grid_1d(10, 0), Error);
}

TEST(Launch, AttentionTileConfigFitsTheHeadDim) {
  for (int D : {1, 16, 32, 33, 64, 80, 96, 128, 160, 256}) {
    const AttnTileConfig c = attn_tile_config(D);
    EXPECT_GE(c.dmax, D);
    EXPECT_LT(c.dmax / 2, std::max(D, 32)) << "D=" << D << " should use the smallest DMAX";
    EXPECT_EQ(c.dmax % c.group, 0);
    EXPECT_EQ(c.rows * c.group, c.threads);
    EXPECT_EQ(32 % c.group, 0) << "a row's threads must sit inside one warp";
    // K and V (or Q and dO) tiles in fp32 fit the 48 KiB of static shared memory.
    EXPECT_LE(2 * c.tile * c.dmax * 4 + 2 * c.tile * 4, 48 * 1024);
    EXPECT_LE(c.tile, 64) << "scores of a tile live in registers";
  }
  EXPECT_THROW(attn_tile_config(0), Error);
  EXPECT_THROW(attn_tile_config(257), Error);
}

// Every (sequence, tile) of every non-empty sequence appears exactly once in each list, and
// the lists are sorted by causal cost, most expensive first.
TEST(Launch, AttentionScheduleCoversEveryTileOnceByCost) {
  const std::vector<int32_t> cu = {0, 100, 100, 130, 400, 401};  // one empty sequence
  const int rows = 64;
  const AttnSchedule s = plan_attention(cu.data(), 5, rows);
  EXPECT_EQ(s.max_len, 270);
  EXPECT_EQ(s.tokens, 401);
  std::set<std::pair<int, int>> want;
  for (int q = 0; q < 5; ++q)
    for (int t = 0; t * rows < cu[q + 1] - cu[q]; ++t) want.insert({q, t});
  for (const auto* items : {&s.q_items, &s.k_items}) {
    std::set<std::pair<int, int>> got;
    for (size_t i = 0; i < items->size(); i += 2) got.insert({(*items)[i], (*items)[i + 1]});
    EXPECT_EQ(got, want);
    EXPECT_EQ(items->size(), 2 * want.size());
  }
  auto nb = [&](int q) { return (cu[q + 1] - cu[q] + rows - 1) / rows; };
  for (int i = 1; i < s.num_q_items(); ++i)
    EXPECT_GE(s.q_items[2 * i - 1] + 1, s.q_items[2 * i + 1] + 1);  // query cost = tile + 1
  for (int i = 1; i < s.num_k_items(); ++i)
    EXPECT_GE(nb(s.k_items[2 * i - 2]) - s.k_items[2 * i - 1],
              nb(s.k_items[2 * i]) - s.k_items[2 * i + 1]);
  EXPECT_EQ(s.q_items[0], 3);  // the longest sequence's last tile comes first
  EXPECT_EQ(s.q_items[1], nb(3) - 1);
  EXPECT_EQ(causal_tile_pairs(cu.data(), 5, rows), 3 + 0 + 1 + 15 + 1);
  EXPECT_TRUE(plan_attention(cu.data(), 0, rows).q_items.empty());
}

TEST(Launch, ReductionChunksDependOnlyOnTheSize) {
  EXPECT_EQ(colred_chunks(1), 1);
  EXPECT_EQ(colred_chunks(64), 1);
  EXPECT_EQ(colred_chunks(65), 2);
  EXPECT_EQ(colred_chunks(1 << 20), 128);
  EXPECT_EQ(sumsq_blocks(0), 1);
  EXPECT_EQ(sumsq_blocks(int64_t{1} << 40), 1024);
  EXPECT_GT(sumsq_blocks(1 << 20), 1);
}

TEST(Launch, MultiTensorChunksCoverEachTensorExactly) {
  const std::vector<int64_t> sizes = {5, 0, 130, 64};
  const auto chunks = multi_tensor_chunks(sizes, 64);
  std::map<int, int64_t> covered;
  std::map<int, int64_t> next;
  for (const MtChunk& c : chunks) {
    EXPECT_GT(c.len, 0);
    EXPECT_LE(c.len, 64);
    EXPECT_EQ(c.offset, next[c.tensor]);  // contiguous, in order
    next[c.tensor] = c.offset + c.len;
    covered[c.tensor] += c.len;
  }
  EXPECT_EQ(covered[0], 5);
  EXPECT_EQ(covered.count(1), 0u);
  EXPECT_EQ(covered[2], 130);
  EXPECT_EQ(covered[3], 64);
  EXPECT_EQ(chunks.size(), 1u + 3u + 1u);
  EXPECT_THROW(multi_tensor_chunks({-1}, 64), Error);
}

TEST(Launch, GemmMathNames) {
  for (GemmMath m : {GemmMath::FP32, GemmMath::TF32, GemmMath::BF16, GemmMath::FP16})
    EXPECT_EQ(gemm_math_from_name(gemm_math_name(m)), m);
  EXPECT_THROW(gemm_math_from_name("fp64"), Error);
}

// A device that is not there is refused with a clear error, not a crash: without a GPU (this
// CI machine) every device is missing; with n GPUs, device n is.
TEST(Launch, MissingDeviceIsReportedNotCrashed) {
  const int n = cuda_device_count();
  CudaOptions opt;
  opt.device = n;
  try {
    CudaBackend be(opt);
    FAIL() << "constructing a CUDA backend on device " << n << " of " << n << " must throw";
  } catch (const Error& e) {
    const std::string expected = n == 0 ? "no CUDA device" : "does not exist";
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::cuda
