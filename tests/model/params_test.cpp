// ParamSet initialisation by ranges: drawing any flat ranges gives exactly the values of a full
// init() there and leaves every other element zero and every other page untouched (what lets a
// ZeRO-3 rank initialise only its shard), for every kind of parameter and shard layout.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/guarded_backend.h"
#include "model/decoder.h"
#include "model/params.h"

using namespace loom;

namespace {

// Every kind of parameter init() knows: unsharded normal, ones, zeros, row and column shards
// of tensor parallelism, expert shards split inside the experts along rows and along columns.
ParamSet every_kind(Backend& be = cpu_backend()) {
  ParamSet P;
  P.add("embed", {7, 5}, false, ParamInit::Normal, 0.02f);
  P.add("norm.weight", {5}, false, ParamInit::Ones);
  P.add("norm.bias", {5}, false, ParamInit::Zeros);
  P.add("rows", {3, 6}, true, ParamInit::Normal, 0.5f);
  P.set_shard("rows", {8, 6}, 0, {5, 1, 6});
  P.add("cols", {4, 3}, true, ParamInit::Normal, 0.5f);
  P.set_shard("cols", {4, 9}, 1, {3});
  P.add("experts.w1", {2, 3, 5}, true, ParamInit::Normal, 1.f);
  P.set_shard("experts.w1", {4, 6, 5}, 0, {2, 3});
  P.set_inner_shard("experts.w1", 1, {1, 4, 5});
  P.add("experts.w2", {2, 5, 3}, true, ParamInit::Normal, 1.f);
  P.set_shard("experts.w2", {4, 5, 9}, 0, {0, 3});
  P.set_inner_shard("experts.w2", 2, {6});
  P.allocate(be);
  return P;
}

bool same_bits(float a, float b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

// Initialises `ranges` of `part` (fresh) and compares every element with `full` (init()).
void expect_ranges_match(ParamSet& full, ParamSet& part, const std::vector<ParamSet::Range>& ranges,
                         uint64_t seed) {
  full.init(seed);
  part.init_ranges(seed, ranges);
  for (int64_t i = 0; i < full.total(); ++i) {
    bool inside = false;
    for (auto [a, b] : ranges) inside = inside || (a <= i && i < b);
    const float want = inside ? full.data()[i] : 0.f;
    ASSERT_TRUE(same_bits(part.data()[i], want))
        << "element " << i << (inside ? " (drawn)" : " (not drawn)") << ": " << part.data()[i]
        << " vs " << want;
  }
}

// Random disjoint ranges cutting parameters, rows and the padding between parameters anywhere.
std::vector<ParamSet::Range> random_ranges(int64_t total, uint64_t seed) {
  std::vector<int64_t> cuts;
  for (int i = 0; i < 12; ++i) cuts.push_back(static_cast<int64_t>(uniform_at(seed, 7, i) * total));
  cuts.push_back(0);
  cuts.push_back(total);
  std::sort(cuts.begin(), cuts.end());
  std::vector<ParamSet::Range> ranges;
  for (size_t i = 0; i + 1 < cuts.size(); i += 2) ranges.push_back({cuts[i], cuts[i + 1]});
  return ranges;
}

int64_t resident_bytes(const void* p, int64_t bytes) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) / page * page;
  const uintptr_t b = (reinterpret_cast<uintptr_t>(p) + bytes + page - 1) / page * page;
  std::vector<unsigned char> vec((b - a) / page);
  EXPECT_EQ(mincore(reinterpret_cast<void*>(a), b - a, vec.data()), 0);
  int64_t n = 0;
  for (unsigned char v : vec) n += (v & 1) ? static_cast<int64_t>(page) : 0;
  return n;
}

}  // namespace

TEST(ParamSet, InitRangesMatchFullInitEveryKindOfParameter) {
  for (uint64_t trial = 0; trial < 20; ++trial) {
    ParamSet full = every_kind(), part = every_kind();
    expect_ranges_match(full, part, random_ranges(full.total(), trial), 3 + trial);
  }
}

TEST(ParamSet, InitRangesMatchFullInitDecoder) {
  for (const char* preset : {"tiny", "tiny-llama", "tiny-moe"}) {
    ModelConfig c = model_preset(preset);
    c.n_layer = 2;
    Decoder full(c, cpu_backend()), part(c, cpu_backend());
    SCOPED_TRACE(preset);
    expect_ranges_match(full.params(), part.params(), random_ranges(full.params().total(), 1), 9);
  }
}

TEST(ParamSet, DrawWritesAnyRangeElsewhere) {
  ParamSet P = every_kind();
  P.init(4);
  for (auto [a, b] : random_ranges(P.total(), 2)) {
    std::vector<float> out(b - a, 0.f);
    P.draw(4, a, b, out.data());
    for (int64_t i = a; i < b; ++i) ASSERT_TRUE(same_bits(out[i - a], P.data()[i])) << i;
  }
  std::vector<float> out(1);
  EXPECT_THROW(P.draw(4, 0, P.total() + 1, out.data()), Error);
}

// The flat buffers take no memory until written, and init_ranges writes only the pages of its
// ranges.
TEST(ParamSet, InitRangesTouchesOnlyTheirPages) {
  ParamSet P;
  P.add("a", {1 << 20}, true, ParamInit::Normal, 0.02f);
  P.add("b", {1 << 20}, true, ParamInit::Normal, 0.02f);
  P.add("c", {1 << 20}, false, ParamInit::Ones);
  P.allocate();
  const int64_t bytes = P.total() * 4, page = sysconf(_SC_PAGESIZE);
  EXPECT_EQ(resident_bytes(P.data(), bytes), 0);
  EXPECT_EQ(resident_bytes(P.grad(), bytes), 0);
  const int64_t lo = 1000, hi = (1 << 20) + 300000;  // a's tail and the start of b
  P.init_ranges(1, {{lo, hi}});
  const int64_t drawn = resident_bytes(P.data(), bytes);
  EXPECT_GE(drawn, (hi - lo) * 4);
  EXPECT_LE(drawn, (hi - lo) * 4 + 2 * page);
  EXPECT_EQ(resident_bytes(P.grad(), bytes), 0);
}

// On a backend whose memory the host cannot touch (the guarded test backend), values and
// gradients are its buffers: init() draws on the host and copies over (the padding stays zero),
// the staging copies move any range, and in-place host access is refused naming the operation.
TEST(ParamSet, LivesOnItsBackendAndStagesThroughTheHost) {
  test::GuardedBackend g;
  ParamSet ref = every_kind(), P = every_kind(g);
  EXPECT_TRUE(ref.host_accessible());
  EXPECT_FALSE(P.host_accessible());
  EXPECT_EQ(&P.backend(), &g);
  EXPECT_EQ(g.live_buffers(), 2u);  // values and gradients
  ref.init(11);
  P.init(11);
  const int64_t n = P.total();
  std::vector<float> got(n, -1.f);
  P.read_values(0, n, got.data());
  for (int64_t i = 0; i < n; ++i) ASSERT_TRUE(same_bits(got[i], ref.data()[i])) << i;
  // A range written and read back; the rest unchanged.
  std::vector<float> in = {1.5f, -2.f, 3.25f};
  P.write_values(20, 23, in.data());
  std::vector<float> back(5);
  P.read_values(19, 24, back.data());
  EXPECT_TRUE(same_bits(back[0], ref.data()[19]));
  EXPECT_EQ(back[1], 1.5f);
  EXPECT_EQ(back[3], 3.25f);
  EXPECT_TRUE(same_bits(back[4], ref.data()[23]));
  // Gradients start zero (allocated zeroed).
  std::vector<float> grads(n, -1.f);
  P.read_grads(0, n, grads.data());
  for (float v : grads) ASSERT_EQ(v, 0.f);
  EXPECT_THROW(P.read_values(0, n + 1, got.data()), Error);
  EXPECT_THROW(P.write_values(5, 4, in.data()), Error);
  EXPECT_THROW(P.read_grads(-1, 3, grads.data()), Error);
  try {
    P.host_data("exporting to Hugging Face");
    FAIL() << "host access to guarded parameters was allowed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exporting to Hugging Face"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(P.tensors("saving a checkpoint"), Error);
  EXPECT_THROW(P.grad_tensors(), Error);
  EXPECT_NO_THROW(ref.tensors("saving a checkpoint"));
  // Copies between sets: device to device on one backend, staged between two.
  ParamSet Q = every_kind(g), R = every_kind();
  Q.copy_values_from(P);
  R.copy_values_from(Q);
  EXPECT_TRUE(same_bits(R.data()[21], -2.f));
  EXPECT_TRUE(same_bits(R.data()[0], ref.data()[0]));
  EXPECT_TRUE(same_bits(R.data()[n - 1], ref.data()[n - 1]));
  ParamSet other;
  other.add("x", {3}, false, ParamInit::Ones);
  other.allocate();
  EXPECT_THROW(other.copy_values_from(P), Error);
}

// Parameters and gradients are accounted in the backend's memory report, and freed with the set.
TEST(ParamSet, AllocatesThroughTheBackend) {
  test::GuardedBackend g;
  {
    ParamSet P;
    P.add("w", {1000}, true, ParamInit::Normal, 0.02f);
    EXPECT_THROW(P.host_data("anything"), Error);  // not allocated yet
    P.allocate(g);
    EXPECT_THROW(P.allocate(g), Error);
    EXPECT_THROW(P.add("late", {3}, false, ParamInit::Zeros), Error);
    const std::string r = g.memory_report();
    EXPECT_NE(r.find("parameters"), std::string::npos) << r;
    EXPECT_NE(r.find("gradients"), std::string::npos) << r;
    EXPECT_EQ(g.live_buffers(), 2u);
  }
  EXPECT_EQ(g.live_buffers(), 0u);
}

// Checkpoint staging: host_values are views on the CPU backend (a load writes in place) and
// staged copies elsewhere, which store_values copies back.
TEST(ParamSet, HostValuesStageCheckpointsOffTheHost) {
  ParamSet ref = every_kind();
  ref.init(2);
  auto views = ref.host_values();
  EXPECT_EQ(views.at("rows").data<float>(), ref.data() + ref.info("rows").offset);
  test::GuardedBackend g;
  ParamSet P = every_kind(g);
  P.init(2);
  auto staged = P.host_values();
  ASSERT_EQ(staged.size(), views.size());
  for (const auto& [name, t] : views) {
    const Tensor& s = staged.at(name);
    ASSERT_EQ(s.shape(), t.shape()) << name;
    EXPECT_EQ(std::memcmp(s.data<float>(), t.data<float>(), t.nbytes()), 0) << name;
  }
  // A "checkpoint load" into the staged tensors, then stored: the backend holds it.
  staged.at("cols").data<float>()[5] = 42.f;
  staged.at("norm.weight").data<float>()[0] = -3.f;
  P.store_values(staged);
  std::vector<float> got(P.total());
  P.read_values(0, P.total(), got.data());
  EXPECT_EQ(got[P.info("cols").offset + 5], 42.f);
  EXPECT_EQ(got[P.info("norm.weight").offset], -3.f);
  EXPECT_TRUE(same_bits(got[P.info("rows").offset], ref.data()[ref.info("rows").offset]));
  std::map<std::string, Tensor> wrong = {{"cols", Tensor::zeros({3})}};
  EXPECT_THROW(P.store_values(wrong), Error);
  std::map<std::string, Tensor> unknown = {{"nope", Tensor::zeros({3})}};
  EXPECT_THROW(P.store_values(unknown), Error);
}
