// The one AdamW: a data-parallel shard is a flat range [lo, hi) of the parameter layout, and
// stepping a set in ranges (cut anywhere, mid-parameter too) must give exactly the whole-set
// optimizer's weights and state. The data-parallel engine and one process rely on it.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "optim/adamw.h"

using namespace loom;

namespace {

// Three parameters, one without decay, with the 16-float alignment padding between them.
void build(ParamSet& P) {
  P.add("a.weight", {7, 5}, true, ParamInit::Normal, 0.5f);
  P.add("a.bias", {5}, false, ParamInit::Normal, 0.5f);
  P.add("b.weight", {9, 3}, true, ParamInit::Normal, 0.5f);
  P.allocate();
  P.init(42);
}

// Gradients that differ per step and element (and some large, so that steps differ in bf16).
void fill_grads(ParamSet& P, int step) {
  for (const ParamInfo& p : P.infos())
    for (int64_t i = 0; i < p.numel; ++i)
      P.grad()[p.offset + i] = 0.01f * float((i * 7 + step * 13 + p.offset) % 23) - 0.1f;
}

// The MiB figure Backend::memory_report prints for a class's held bytes ("<cls> <held> MiB
// held"); 0 when the class has not appeared yet.
double held_mib(const Backend& be, const std::string& cls) {
  const std::string r = be.memory_report();
  const size_t at = r.find(" " + cls + " ");
  return at == std::string::npos ? 0.0 : std::stod(r.substr(at + cls.size() + 2));
}

void expect_same(const float* a, const float* b, int64_t n, const char* what) {
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(a[i], b[i]) << what << " element " << i;
}

// Runs `steps` steps with the whole-set AdamW on A and with one ranged AdamW per cut of B, and
// checks the weights, the master copies and the moments are bit-identical.
void check_ranges(DType dtype, const std::vector<int64_t>& cuts) {
  ParamSet A, B;
  build(A);
  build(B);
  if (dtype != DType::F32) {
    round_to(dtype, A.data(), size_t(A.total()));
    round_to(dtype, B.data(), size_t(B.total()));
  }
  const AdamWConfig cfg;
  AdamW whole(A, cfg, dtype, cpu_backend());
  std::vector<std::unique_ptr<AdamW>> parts;
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    parts.push_back(
        std::make_unique<AdamW>(B, cfg, dtype, cpu_backend(), cuts[k], cuts[k + 1], false));
    parts.back()->sync_master_from_model();
  }
  for (int s = 0; s < 5; ++s) {
    fill_grads(A, s);
    fill_grads(B, s);
    whole.step(1e-2 * (s + 1), 0.5f);
    for (auto& p : parts) p->step(1e-2 * (s + 1), 0.5f);
  }
  expect_same(A.data(), B.data(), A.total(), "model weights");
  // The state, parameter slice by parameter slice, against the whole set's tensors.
  auto full = whole.state_tensors();
  int64_t seen = 0;
  for (auto& p : parts) {
    EXPECT_EQ(p->steps_taken(), 5);
    for (const StateSlice& sl : p->state_slices()) {
      ASSERT_TRUE(full.count(sl.name)) << sl.name;
      const Tensor& t = full.at(sl.name);
      ASSERT_EQ(t.numel(), sl.global_numel) << sl.name;
      ASSERT_LE(sl.offset + sl.tensor.numel(), sl.global_numel) << sl.name;
      expect_same(t.data<float>() + sl.offset, sl.tensor.data<float>(), sl.tensor.numel(),
                  sl.name.c_str());
      seen += sl.tensor.numel();
    }
  }
  // Every element of every state tensor covered exactly once.
  int64_t expected = 0;
  for (auto& [name, t] : full) expected += t.numel();
  EXPECT_EQ(seen, expected);
}

}  // namespace

TEST(AdamW, RangesCutAnywhereMatchTheWholeSetFp32) {
  ParamSet P;
  build(P);
  const int64_t n = P.total();
  // A cut inside a.weight, one in the padding or bias, one inside b.weight; and an empty range.
  check_ranges(DType::F32, {0, 11, 40, 40, n - 5, n});
}

TEST(AdamW, RangesCutAnywhereMatchTheWholeSetBf16Master) {
  ParamSet P;
  build(P);
  check_ranges(DType::BF16, {0, 3, 37, P.total()});
}

TEST(AdamW, FrozenParameterLeftAlone) {
  ParamSet P;
  build(P);
  P.set_trainable("a.bias", false);
  const ParamInfo& bias = P.info("a.bias");
  std::vector<float> before(P.data() + bias.offset, P.data() + bias.offset + bias.numel);
  std::vector<float> other(P.data(), P.data() + bias.offset);
  // A range starting inside a.weight and covering the bias.
  AdamW opt(P, AdamWConfig{}, DType::F32, cpu_backend(), 4, P.total(), false);
  fill_grads(P, 0);
  opt.step(0.1, 1.f);
  expect_same(before.data(), P.data() + bias.offset, bias.numel, "frozen a.bias");
  // Outside the range nothing moved either; inside it the trained weights did.
  expect_same(other.data(), P.data(), 4, "a.weight before the range");
  EXPECT_NE(other[4], P.data()[4]);
  for (const StateSlice& sl : opt.state_slices()) {
    if (sl.name != "exp_avg.a.bias") continue;
    for (int64_t i = 0; i < sl.tensor.numel(); ++i) EXPECT_EQ(sl.tensor.data<float>()[i], 0.f);
  }
}

TEST(AdamW, KeepMasterAtFp32) {
  // ZeRO-3: a master copy at fp32 too; the model's buffer is written from it only on request.
  ParamSet P;
  build(P);
  AdamW opt(P, AdamWConfig{}, DType::F32, cpu_backend(), 0, P.total(), true);
  ASSERT_NE(opt.master(), nullptr);
  opt.sync_master_from_model();
  std::vector<float> model(P.data(), P.data() + P.total());
  fill_grads(P, 1);
  opt.update(0.1, 1.f, P.grad());
  expect_same(model.data(), P.data(), P.total(), "model before write_model");
  EXPECT_NE(opt.master()[0], model[0]);
  opt.write_model(0, 3);
  EXPECT_EQ(P.data()[0], opt.master()[0]);
  EXPECT_EQ(P.data()[3], model[3]);  // outside [0, 3)
}

TEST(AdamW, RangeOutsideTheSetIsAnError) {
  ParamSet P;
  build(P);
  try {
    AdamW opt(P, AdamWConfig{}, DType::F32, cpu_backend(), 5, P.total() + 1, false);
    FAIL() << "accepted a range past the end";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the parameter set"), std::string::npos)
        << e.what();
  }
  AdamW shard(P, AdamWConfig{}, DType::F32, cpu_backend(), 5, 9, false);
  EXPECT_THROW(shard.state_tensors(), Error);  // a shard has no whole tensors
}

// The state (moments, and the master copy when kept apart) is allocated through the backend as
// buffer class "optimizer", zeroed, and freed with the optimizer.
TEST(AdamW, StateIsTheBackendsOptimizerMemory) {
  ParamSet P;
  P.add("big.weight", {512, 1024}, true, ParamInit::Normal, 0.5f);  // 2 MiB of fp32
  P.allocate();
  P.init(7);
  Backend& be = cpu_backend();
  const double before = held_mib(be, "optimizer");
  for (const DType t : {DType::F32, DType::BF16}) {
    {
      AdamW opt(P, AdamWConfig{}, t, be);
      const int buffers = t == DType::F32 ? 2 : 3;  // m, v (and the master under bf16)
      EXPECT_NEAR(held_mib(be, "optimizer") - before, 2.0 * buffers, 0.01) << dtype_name(t);
      for (const StateSlice& s : opt.state_slices()) {
        if (s.name.rfind("exp_avg", 0) != 0) continue;
        for (int64_t i = 0; i < s.tensor.numel(); i += 4099)
          ASSERT_EQ(s.tensor.data<float>()[i], 0.f) << s.name << " starts zero";
      }
    }
    EXPECT_NEAR(held_mib(be, "optimizer"), before, 0.01) << dtype_name(t) << ": freed";
  }
}

// The bf16 policy (not ZeRO-3) derives the model's weights and the set's bf16 copy in the
// update's own pass. Against the same steps taken in separate passes (a kept master: update,
// then write_model's copy and rounding), with a frozen parameter and padding in between: the
// same model weights and master bit for bit, a bf16 copy that is the model's bits, and the
// whole set noted as written.
TEST(AdamW, Bf16FusedPassMatchesSeparatePasses) {
  ParamSet A, B;
  build(A);
  build(B);
  for (ParamSet* P : {&A, &B}) {
    P->set_trainable("a.bias", false);
    round_to(DType::BF16, P->data(), size_t(P->total()));
    P->allocate_bf16_copy();
  }
  AdamW fused(A, AdamWConfig{}, DType::BF16, cpu_backend());
  AdamW passes(B, AdamWConfig{}, DType::BF16, cpu_backend(), 0, B.total(), true);
  passes.sync_master_from_model();
  for (int s = 0; s < 4; ++s) {
    fill_grads(A, s);
    fill_grads(B, s);
    fused.step(1e-2 * (s + 1), 0.5f);
    passes.step(1e-2 * (s + 1), 0.5f);
  }
  expect_same(A.data(), B.data(), A.total(), "model weights");
  expect_same(fused.master(), passes.master(), A.total(), "master");
  for (int64_t i = 0; i < A.total(); ++i) {
    ASSERT_EQ(A.bf16_data()[i], f32_to_bf16(A.data()[i])) << "bf16 copy element " << i;
    ASSERT_EQ(B.bf16_data()[i], A.bf16_data()[i]) << "bf16 copy element " << i;
  }
  const auto written = A.take_bf16_written();
  ASSERT_EQ(written.size(), 1u);
  EXPECT_EQ(written[0], ParamSet::Range(0, A.total()));
  EXPECT_TRUE(A.take_bf16_written().empty());  // taken
}

// After a fused step the model is current, but a master changed through the handed-out state
// (a checkpoint's restore writes the state_slices views) must still reach the model and its
// bf16 copy on sync_model_from_master.
TEST(AdamW, Bf16MasterRestoredAfterAStepReachesTheModel) {
  ParamSet P;
  build(P);
  round_to(DType::BF16, P.data(), size_t(P.total()));
  P.allocate_bf16_copy();
  AdamW opt(P, AdamWConfig{}, DType::BF16, cpu_backend());
  fill_grads(P, 0);
  opt.step(1e-2, 1.f);
  for (const StateSlice& sl : opt.state_slices())
    if (sl.name.rfind("master.", 0) == 0)
      for (int64_t i = 0; i < sl.tensor.numel(); ++i) sl.tensor.data<float>()[i] = 0.375f;
  P.take_bf16_written();
  opt.sync_model_from_master();
  const ParamInfo& w = P.info("b.weight");
  for (int64_t i = 0; i < w.numel; ++i) {
    ASSERT_EQ(P.data()[w.offset + i], 0.375f) << i;
    ASSERT_EQ(P.bf16_data()[w.offset + i], f32_to_bf16(0.375f)) << i;
  }
  EXPECT_FALSE(P.take_bf16_written().empty());
}

// A data-parallel shard's update writes its own range of the model (and notes it); write_model
// elsewhere is left to the caller as before.
TEST(AdamW, Bf16ShardWritesOnlyItsRange) {
  ParamSet P;
  build(P);
  round_to(DType::BF16, P.data(), size_t(P.total()));
  P.allocate_bf16_copy();
  std::vector<float> before(P.data(), P.data() + P.total());
  AdamW shard(P, AdamWConfig{}, DType::BF16, cpu_backend(), 10, 30, false);
  shard.sync_master_from_model();
  fill_grads(P, 0);
  shard.update(0.1, 1.f, P.grad() + 10);
  expect_same(before.data(), P.data(), 10, "before the shard");
  expect_same(before.data() + 30, P.data() + 30, P.total() - 30, "after the shard");
  for (int64_t i = 10; i < 30; ++i) EXPECT_EQ(P.data()[i], round_bf16(shard.master()[i - 10]));
  const auto written = P.take_bf16_written();
  ASSERT_EQ(written.size(), 1u);
  EXPECT_EQ(written[0], ParamSet::Range(10, 30));
}
