// The bf16 policy's 2-byte weights (ParamSet::drop_fp32, precision/bf16_gemms.h's
// drop_fp32_weights): the parameters the bf16 GEMMs read keep no fp32 values in the model; the
// bf16 copy is their only model copy. Tested: the set's readers and writers go through the copy,
// the pages are really returned, and a model trained with the fp32 values dropped is the model
// trained with them kept, bit for bit (losses, bf16 weights, widened values, masters).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>

#include "core/error.h"
#include "core/rng.h"
#include "kernels/cpu/gemm_bf16.h"
#include "model/decoder.h"
#include "optim/adamw.h"
#include "parallel/page_memory.h"
#include "precision/bf16_gemms.h"
#include "small_bf16_models.h"

using namespace loom;

namespace {

bool has_bf16_gemms() {
  return cpu::bf16_gemm_path() == cpu::Bf16GemmPath::OneDnn;
}

using test::small_batch;
using test::small_bf16_model;
using Data = test::SmallBatch;

int64_t page() {
  return int64_t(sysconf(_SC_PAGESIZE));
}

std::vector<float> values_of(const ParamSet& P) {
  std::vector<float> v(size_t(P.total()));
  P.read_values(0, P.total(), v.data());
  return v;
}

}  // namespace

// Writers round into the bf16 copy and readers widen it; the fp32 pages stay returned.
TEST(Bf16Weights, SetReadersAndWritersGoThroughTheCopy) {
  ParamSet P;
  P.add("w", {64, 256}, true, ParamInit::Normal, 1.f);  // 16 pages of fp32
  P.add("b", {256}, false, ParamInit::Normal, 1.f);
  P.allocate();
  P.init(3);
  const std::vector<float> drawn = values_of(P);
  EXPECT_THROW(P.drop_fp32({"w"}), Error);  // no bf16 copy yet
  P.allocate_bf16_copy();
  P.drop_fp32({"w"});
  EXPECT_TRUE(P.info("w").fp32_dropped);
  EXPECT_FALSE(P.info("b").fp32_dropped);
  EXPECT_TRUE(P.fp32_dropped_at(P.info("w").offset + 5));
  EXPECT_FALSE(P.fp32_dropped_at(P.info("b").offset));
  const int64_t w_bytes = 4 * P.info("w").numel;
  EXPECT_LE(parallel::resident_bytes(P.fp32_storage_ptr("w"), w_bytes), 2 * page());
  std::vector<float> v = values_of(P);
  for (const ParamInfo& p : P.infos())
    for (int64_t i = 0; i < p.numel; ++i) {
      const float want = p.fp32_dropped ? round_bf16(drawn[p.offset + i]) : drawn[p.offset + i];
      ASSERT_EQ(v[p.offset + i], want) << p.name << " " << i;
    }
  EXPECT_NE(drawn[P.info("w").offset], round_bf16(drawn[P.info("w").offset]));  // could fail
  // write_values rounds into the copy; nothing is resident again.
  std::vector<float> in(size_t(P.total()), 0.f);
  for (size_t i = 0; i < in.size(); ++i) in[i] = 1.f + 1e-3f * float(i % 1000);
  P.write_values(0, P.total(), in.data());
  EXPECT_LE(parallel::resident_bytes(P.fp32_storage_ptr("w"), w_bytes), 2 * page());
  v = values_of(P);
  const int64_t wo = P.info("w").offset;
  for (int64_t i = 0; i < P.info("w").numel; ++i) ASSERT_EQ(v[wo + i], round_bf16(in[wo + i]));
  // host_values hands out widened copies; store_values rounds them back into the copy.
  auto host = P.host_values();
  host.at("w").data<float>()[7] = 2.5f;
  P.store_values(host);
  EXPECT_EQ(values_of(P)[wo + 7], 2.5f);
  EXPECT_THROW(P.tensors("a test"), Error);  // no fp32 values to view in place
  // widen_rows: the selected rows only, then returned.
  const int32_t ids[] = {3, 60};
  P.widen_rows("w", ids, 2);
  EXPECT_EQ(P.fp32_storage()[wo + 3 * 256 + 7], v[wo + 3 * 256 + 7]);
  EXPECT_EQ(P.fp32_storage()[wo + 60 * 256 + 9], v[wo + 60 * 256 + 9]);
  EXPECT_EQ(P.fp32_storage()[wo + 10 * 256], 0.f);
  P.release_fp32("w");
  EXPECT_LE(parallel::resident_bytes(P.fp32_storage() + wo, w_bytes), 2 * page());
}

// The raw accessors of the fp32 values (data, ptr, host_data, host_ptr) refuse a dropped
// parameter, naming it and the caller's operation, instead of handing out its zeros; a kept
// parameter reads as before, and fp32_storage / fp32_storage_ptr give the storage explicitly.
TEST(Bf16Weights, RawAccessorsRefuseDroppedParameters) {
  ParamSet P;
  P.add("w", {64, 256}, true, ParamInit::Normal, 1.f);
  P.add("b", {256}, false, ParamInit::Normal, 1.f);
  P.allocate();
  P.init(3);
  const std::vector<float> drawn = values_of(P);
  P.allocate_bf16_copy();
  P.drop_fp32({"w"});
  const ParamSet& C = P;
  const auto refuses = [](const std::function<void()>& f, const std::string& op) {
    try {
      f();
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("'w'"), std::string::npos) << m;
      EXPECT_NE(m.find(op), std::string::npos) << m;
      EXPECT_NE(m.find("keeps no fp32 values"), std::string::npos) << m;
      return;
    }
    ADD_FAILURE() << op << " handed out a dropped parameter's zeros";
  };
  refuses([&] { P.ptr("w"); }, "ParamSet::ptr");
  refuses([&] { C.ptr("w"); }, "ParamSet::ptr");
  refuses([&] { P.host_ptr("w", "a host read"); }, "a host read");
  refuses([&] { P.data(); }, "ParamSet::data()");
  refuses([&] { C.data(); }, "ParamSet::data()");
  refuses([&] { P.host_data("a whole-buffer read"); }, "a whole-buffer read");
  refuses([&] { C.host_data("a const read"); }, "a const read");
  refuses([&] { P.tensors("an export"); }, "an export");
  // Kept parameters: their values, in place.
  EXPECT_EQ(P.ptr("b")[5], drawn[P.info("b").offset + 5]);
  EXPECT_EQ(P.host_ptr("b", "a test")[7], drawn[P.info("b").offset + 7]);
  // The storage, asked for by name: the dropped parameter's zeros.
  EXPECT_EQ(P.fp32_storage_ptr("w"), P.fp32_storage() + P.info("w").offset);
  EXPECT_EQ(P.fp32_storage_ptr("w")[3], 0.f);
  EXPECT_NE(drawn[P.info("w").offset + 3], 0.f);
}

// A Decoder whose linear weight is dropped but read by no GEMM recipe (the fp32 GEMM would
// multiply by zeros) refuses the forward pass, naming the weight.
TEST(Bf16Weights, ALinearWithoutRecipeRefusesADroppedWeight) {
  Decoder m(small_bf16_model(Family::GPT2), cpu_backend(), Recompute::None, DType::BF16);
  m.params().init(5);
  m.params().allocate_bf16_copy();
  m.params().drop_fp32({"blocks.0.mlp.fc.weight"});
  const Data d = small_batch(2, 24, 11);
  try {
    m.forward_loss(d.input());
    ADD_FAILURE() << "the forward pass read a dropped weight's zeros";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'blocks.0.mlp.fc.weight'"), std::string::npos)
        << e.what();
  }
}

// Two models from the same weights, one with the fp32 values of its GEMM weights dropped:
// every loss, gradient, bf16 weight, widened value and master weight equal bit for bit over
// steps, evaluation included, for GPT-2 (tied embedding: the lookup reads widened rows) and
// Llama; and the dropped model's fp32 buffer holds none of those pages, AdamW included.
TEST(Bf16Weights, TrainingWithoutFp32ValuesIsBitIdentical) {
  if (!has_bf16_gemms()) GTEST_SKIP() << "no AVX512-BF16 here: the fp32 container stays";
  for (Family f : {Family::GPT2, Family::Llama}) {
    Decoder kept(small_bf16_model(f), cpu_backend(), Recompute::None, DType::BF16);
    Decoder drop(small_bf16_model(f), cpu_backend(), Recompute::None, DType::BF16);
    for (Decoder* m : {&kept, &drop}) {
      m->params().init(5);
      round_to(DType::BF16, m->params().data(), size_t(m->params().total()));
    }
    AdamW ok(kept.params(), AdamWConfig{}, DType::BF16, cpu_backend());
    AdamW od(drop.params(), AdamWConfig{}, DType::BF16, cpu_backend());
    auto rk = attach_bf16_gemms(kept, true), rd = attach_bf16_gemms(drop, true);
    drop_fp32_weights(drop);
    ParamSet &K = kept.params(), &D = drop.params();
    int64_t dropped = 0, runs = 0;
    for (const ParamInfo& p : D.infos()) {
      const bool gemm_weight = p.name == "embed.wte" || p.name == "head.weight" ||
                               (p.name.find(".weight") != std::string::npos &&
                                (p.name.find(".attn.") != std::string::npos ||
                                 p.name.find(".mlp.") != std::string::npos));
      EXPECT_EQ(p.fp32_dropped, gemm_weight) << p.name;
      if (p.fp32_dropped) dropped += p.numel, ++runs;
    }
    ASSERT_GT(4 * dropped, 4 * page() * runs);  // so that the memory check below can fail
    const Data d = small_batch(2, 24, 11);
    for (int s = 0; s < 4; ++s) {
      rk->new_weights(), rd->new_weights();
      K.zero_grad(), D.zero_grad();
      const double lk = kept.forward_backward(d.input(), 1.f / 48);
      const double ld = drop.forward_backward(d.input(), 1.f / 48);
      ASSERT_EQ(lk, ld) << "step " << s;
      ASSERT_EQ(0, std::memcmp(K.grad(), D.grad(), 4 * size_t(K.total()))) << "step " << s;
      ok.step(1e-2, 1.f), od.step(1e-2, 1.f);
    }
    rk->new_weights(), rd->new_weights();
    EXPECT_EQ(kept.forward_loss(d.input()), drop.forward_loss(d.input()));
    EXPECT_EQ(0, std::memcmp(K.bf16_data(), D.bf16_data(), 2 * size_t(K.total())));
    const std::vector<float> vk = values_of(K), vd = values_of(D);
    EXPECT_EQ(0, std::memcmp(vk.data(), vd.data(), 4 * vk.size()));
    EXPECT_EQ(0, std::memcmp(vk.data(), K.data(), 4 * vk.size()));  // kept: its own values
    EXPECT_EQ(0, std::memcmp(ok.master(), od.master(), 4 * size_t(K.total())));
    // The dropped parameters' fp32 pages (but the few they share with kept neighbours) are not
    // resident, after optimizer steps and embedding lookups.
    const int64_t rk_bytes = parallel::resident_bytes(K.data(), 4 * K.total());
    const int64_t rd_bytes = parallel::resident_bytes(D.fp32_storage(), 4 * D.total());
    EXPECT_GE(rk_bytes - rd_bytes, 4 * dropped - 2 * page() * runs);
    EXPECT_EQ(rk->weight_conversions(), int64_t(kept.linears().size()));
    EXPECT_EQ(rd->weight_conversions(), 0);  // the copy is the weight: never converted
  }
}
