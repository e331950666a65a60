// The data-parallel reducer under lazy gradient zeroing (model/grad_zeroing.h): a linear whose
// backward got no rows on this rank (an MoE expert without tokens, an empty micro-batch) still
// holds the previous step's gradient, pending. The reducer launches a bucket during backward,
// before the Decoder's end-of-backward settle, so it must settle the bucket itself: the rank
// sends zeros there and the sum is the partner's gradient alone, under ZeRO-0 (in place) and
// ZeRO-1 (into the shard, which no later settle touches).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/error.h"
#include "kernels/backend.h"
#include "model/params.h"
#include "parallel/grad_reduce.h"
#include "parallel/refusing_communicator.h"

using namespace loom;

namespace {

constexpr float kPartner = 0.5f;  // every gradient element of the other rank

// Rank 0 of two: records what this rank sends and adds the partner's gradient (kPartner).
class RecordingPair final : public test::RefusingCommunicator {
 public:
  std::vector<float> sent;  // the flat gradient as sent, NaN where nothing was sent
  explicit RecordingPair(int64_t total)
      : RefusingCommunicator("recording-dp", 0, 2), sent(size_t(total), std::nanf("")) {}

  comm::Work all_reduce_async(void* buf, int64_t n, DType, comm::ReduceOp) override {
    float* g = static_cast<float*>(buf);
    record(g, n);
    for (int64_t i = 0; i < n; ++i) g[i] += kPartner;
    return {};
  }
  comm::Work reduce_scatter_async(const void* send, void* recv, const std::vector<int64_t>& counts,
                                  DType, comm::ReduceOp) override {
    const float* s = static_cast<const float*>(send);
    record(s, counts[0] + counts[1]);
    float* r = static_cast<float*>(recv);
    for (int64_t i = 0; i < counts[0]; ++i) r[i] = s[i] + kPartner;
    return {};
  }

  const float* grads = nullptr;  // the flat gradient buffer, to place what is sent

 private:
  void record(const float* send, int64_t n) {
    const int64_t at = send - grads;
    ASSERT_TRUE(at >= 0 && at + n <= int64_t(sent.size())) << "a send outside the gradients";
    std::memcpy(sent.data() + at, send, sizeof(float) * size_t(n));
  }
};

}  // namespace

TEST(GradReducer, LinearWithoutRowsSendsZerosNotThePreviousStep) {
  for (int zero : {0, 1}) {
    ParamSet P;
    P.add("lin_a.weight", {8, 4}, true, ParamInit::Zeros);  // gets rows: its GEMM writes it
    P.add("lin_b.weight", {8, 4}, true, ParamInit::Zeros);  // gets no rows this step
    P.add("norm.bias", {8}, false, ParamInit::Zeros);
    P.allocate();
    const ParamInfo a = P.info("lin_a.weight"), b = P.info("lin_b.weight");
    P.allow_lazy_zero(a.offset, a.offset + a.numel);
    P.allow_lazy_zero(b.offset, b.offset + b.numel);
    const int64_t n = P.total();

    // The previous step's gradients, then a lazy zero_grad: the linears' ranges keep them.
    for (int64_t i = 0; i < n; ++i) P.grad()[i] = 7.f;
    P.zero_grad();
    ASSERT_EQ(P.grad()[b.offset], 7.f) << "zero_grad skipped the lazy range";
    // This step's backward: lin_a's GEMM overwrites its range, lin_b gets no rows.
    P.grad_overwritten(a.offset, a.offset + a.numel);
    for (int64_t i = 0; i < a.numel; ++i) P.grad()[a.offset + i] = 1.f;

    RecordingPair dp(n);
    dp.grads = P.grad();
    const parallel::FlatShards shards(0, n, 2);
    std::vector<float> shard(size_t(shards.shard), -1.f);
    // One-parameter buckets, every one ready at stage 0: launched from on_ready, as during
    // backward (before any end-of-backward settle).
    parallel::GradReducer reducer(P, dp, shards, zero, /*bucket_elems=*/1, /*overlap=*/true,
                                  DType::F32, cpu_backend(), zero ? shard.data() : nullptr,
                                  std::vector<int>(P.infos().size(), 0));
    reducer.start_micro(true);
    reducer.on_ready(0);
    EXPECT_EQ(reducer.started_in_backward(), int64_t(reducer.num_buckets()));
    reducer.finish();

    for (int64_t i = 0; i < n; ++i) {
      const bool in_a = i >= a.offset && i < a.offset + a.numel;
      ASSERT_EQ(dp.sent[size_t(i)], in_a ? 1.f : 0.f) << "ZeRO-" << zero << ", element " << i;
      const float sum = (in_a ? 1.f : 0.f) + kPartner;
      if (zero == 0) {
        ASSERT_EQ(P.grad()[i], sum) << "ZeRO-0, element " << i;
      } else if (i < shards.end(0)) {
        ASSERT_EQ(shard[size_t(i)], sum) << "ZeRO-1, element " << i;
      }
    }
    EXPECT_FALSE(P.grads_pending(0, n));
  }
}

// A call the fake does not serve fails, naming the fake and the operation (the shared base of
// the tests' fake communicators, parallel/refusing_communicator.h).
TEST(GradReducer, FakeCommunicatorRefusesWhatItDoesNotServe) {
  RecordingPair dp(4);
  float buf[4] = {};
  try {
    dp.all_gather(buf, {2, 2}, DType::F32);
    FAIL() << "the all-gather was not refused";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("recording-dp communicator: all_gather"),
              std::string::npos)
        << e.what();
  }
}
