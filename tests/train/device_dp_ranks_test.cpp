// The data-parallel engine over two ranks on a device, without a GPU or a second process: rank
// 0 of a pair whose partner holds the same gradients (a mirror), every byte of its collectives
// moved by Backend ops, so a run over the guarded backend (tests/kernels/guarded_backend.h)
// faults on any host touch of a shard, a bucket, a bf16 wire buffer or a gathered block. With
// two ranks this rank owns half the flat buffer: ZeRO-3 gathers and releases blocks that are
// partly another rank's, and the bucket counts and shard offsets are those of a real pair.
// The numbers are not a real two-rank run's (the partner's blocks are never sent: they keep
// what this rank holds there); tests/parallel checks those over MPI. The guarded run must
// equal the same run on the CPU backend bit for bit. (The trainer's multi-rank device path uses
// the NCCL communicator, which needs GPUs; this is the engine it drives.)
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "kernels/guarded_backend.h"
#include "model/decoder.h"
#include "model/model_test_util.h"
#include "parallel/data_parallel.h"
#include "parallel/refusing_communicator.h"
#include "same_bits.h"

using namespace loom;

namespace {

// Rank 0 of two whose partner holds the same gradients: sums are twice this rank's values
// (x + x is exact, so the bf16 sum in fp32 is too), and a gather leaves the partner's blocks as
// they are (they would hold the partner's master shard).
class MirrorPair final : public test::RefusingCommunicator {
 public:
  explicit MirrorPair(Backend& be) : RefusingCommunicator("mirror-dp", 0, 2), be_(be) {}
  comm::Work all_reduce_async(void* buf, int64_t n, DType t, comm::ReduceOp op) override {
    LOOM_CHECK(t == DType::F32 && op == comm::ReduceOp::Sum, "mirror-dp: fp32 sums only");
    be_.scale_inplace(static_cast<float*>(buf), 2.f, n);
    return {};
  }
  comm::Work reduce_scatter_async(const void* send, void* recv, const std::vector<int64_t>& counts,
                                  DType t, comm::ReduceOp op) override {
    LOOM_CHECK(t == DType::F32 && op == comm::ReduceOp::Sum, "mirror-dp: fp32 sums only");
    check(counts);
    if (counts[0] == 0) return {};
    be_.copy_d2d(recv, send, size_t(counts[0]) * sizeof(float));
    be_.scale_inplace(static_cast<float*>(recv), 2.f, counts[0]);
    return {};
  }
  comm::Work reduce_scatter_bf16_async(const uint16_t* send, float* recv,
                                       const std::vector<int64_t>& counts) override {
    check(counts);
    if (counts[0] == 0) return {};
    be_.convert(recv, DType::F32, send, DType::BF16, counts[0]);
    be_.scale_inplace(recv, 2.f, counts[0]);
    ++bf16_reductions_;
    return {};
  }
  comm::Work all_gather_async(void*, const std::vector<int64_t>& counts, DType) override {
    check(counts);
    ++gathers_;
    return {};
  }
  void all_reduce_f64(double* buf, int64_t n, comm::ReduceOp op) override {
    if (op == comm::ReduceOp::Sum)
      for (int64_t i = 0; i < n; ++i) buf[i] *= 2;
  }
  int64_t gathers() const { return gathers_; }
  int64_t bf16_reductions() const { return bf16_reductions_; }

 private:
  static void check(const std::vector<int64_t>& counts) {
    LOOM_CHECK(counts.size() == 2, "mirror-dp: one count per rank");
  }
  Backend& be_;
  int64_t gathers_ = 0, bf16_reductions_ = 0;
};

struct Result {
  std::vector<double> sq;
  std::vector<float> values, shard;
  int64_t lo = 0, hi = 0, total = 0, gathers = 0, bf16_reductions = 0;
  int max_units = 0;
};

// Three steps of two micro-batches (the second smaller) of a tiny Llama, the engine drawing
// the initial weights (under ZeRO-3 only this rank's shard and the resident parameters), small
// buckets so that there are several.
Result run(Backend& be, int zero, DType reduce, DType act) {
  const ModelConfig c = test::tiny(Family::Llama);
  Decoder m(c, be, Recompute::None, act);
  MirrorPair pair(be);
  parallel::DataParallelOptions o;
  o.zero = zero;
  o.grad_reduce_dtype = reduce;
  o.bucket_elems = 1500;
  o.init_seed = 7;
  parallel::DataParallel dp(m, pair, o, AdamWConfig{}, act, be);
  Result r;
  const test::Data d1 = test::make_data({9, 7}, c.vocab, 3),
                   d2 = test::make_data({5, 6}, c.vocab, 4);
  for (int step = 0; step < 3; ++step) {
    dp.start_step(2);
    dp.start_micro(0);
    m.forward_backward(d1.input(), 0.25f);
    dp.finish_micro();
    dp.start_micro(1);
    m.forward_backward(d2.input(), 0.5f);
    dp.finish_micro();
    r.sq.push_back(dp.grad_sq_local());
    dp.step(1e-2, 1.f);
  }
  const ParamSet& P = m.params();
  r.values.resize(size_t(P.total()));
  P.read_values(0, P.total(), r.values.data());
  if (zero >= 1) r.shard = dp.reduced_grad_shard();
  r.lo = dp.shard_begin();
  r.hi = dp.shard_end();
  r.total = P.total();
  r.gathers = pair.gathers();
  r.bf16_reductions = pair.bf16_reductions();
  r.max_units = dp.max_gathered_units();
  return r;
}

[[noreturn]] void guarded_child(int zero, DType reduce, DType act) {
  std::string bad;
  try {
    const Result want = run(cpu_backend(), zero, reduce, act);
    test::GuardedBackend g;
    g.set_strict(true);  // no host scratch handed to an op either
    const Result got = run(g, zero, reduce, act);
    // What the CPU run must show for the test to mean anything: a real half shard, and the
    // collectives of the layout under test.
    if (!(want.lo == 0 && want.hi > 0 && want.hi < want.total)) bad += " (not half a shard)";
    if (zero >= 1 && want.gathers == 0) bad += " (no parameter gathers)";
    if (zero == 3 && !(want.max_units >= 1 && want.max_units <= 2))
      bad += " (ZeRO-3 did not gather block by block)";
    if (reduce == DType::BF16 && want.bf16_reductions == 0) bad += " (no bf16 reductions)";
    for (double s : want.sq)
      if (!(s > 0)) bad += " (a zero gradient norm)";
    if (got.sq != want.sq) bad += " gradient norms";
    if (!loom::test::same_bits(got.values, want.values)) bad += " weights";
    if (!loom::test::same_bits(got.shard, want.shard)) bad += " reduced gradient shard";
    if (got.gathers != want.gathers || got.max_units != want.max_units) bad += " gathers";
    for (const std::string& op :
         std::set<std::string>(g.host_pointer_ops().begin(), g.host_pointer_ops().end()))
      bad += " (host memory given to " + op + ")";
    if (g.ops() < 200) bad += " (too few ops went through the guarded backend)";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "run threw: %s\n", e.what());
    std::exit(2);
  }
  if (!bad.empty()) std::fprintf(stderr, "guarded engine differs:%s\n", bad.c_str());
  std::exit(bad.empty() ? 0 : 1);
}

}  // namespace

// ZeRO-3 over two ranks (fp32 and bf16 storage, fp32 and bf16 reduction), and ZeRO-0 and ZeRO-2
// with bf16 reduction (ZeRO-0: the rounded sums gathered back into the gradients).
TEST(DeviceDataParallel, GuardedTwoRankEngineEqualsCpu) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(guarded_child(3, DType::F32, DType::F32), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(guarded_child(3, DType::BF16, DType::BF16), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(guarded_child(0, DType::BF16, DType::F32), ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(guarded_child(2, DType::BF16, DType::BF16), ::testing::ExitedWithCode(0), "");
}
