// The mixture-of-experts and ring-attention Backend ops on the GPU against the CPU backend, and
// one MoE layer run through each backend end to end. Skipped without a device.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "cuda/cuda_test_util.h"
#include "kernels/backend.h"
#include "kernels/grad_check.h"
#include "model/decoder.h"
#include "model/mirror_communicator.h"
#include "model/model_config.h"
#include "model/model_test_util.h"
#include "model/moe_layer.h"
#include "parallel/expert_parallel.h"
#include "parallel/ring_attention.h"

namespace loom {
namespace {

using test::close;
using test::close_scaled;
using test::DevBuf;
using test::gpu;
using test::random_floats;
using test::random_ints;
using test::same_bits;

TEST(CudaMoeOps, RouterMatchesCpu) {
  LOOM_REQUIRE_GPU();
  Backend& cpu = cpu_backend();
  const int N = 300, E = 8;
  auto logits = random_floats(size_t(N) * E, 1, -3, 3);
  for (bool sig : {false, true})
    for (int k : {1, 2, 3}) {
      const bool renorm = k > 1;
      std::vector<float> s(size_t(N) * E), w(size_t(N) * k), dl(size_t(N) * E);
      std::vector<int32_t> idx(size_t(N) * k);
      cpu.moe_router_forward(s.data(), idx.data(), w.data(), logits.data(), N, E, k, sig, renorm);
      auto dw = random_floats(w.size(), 2), ds = random_floats(s.size(), 3);
      cpu.moe_router_backward(dl.data(), dw.data(), ds.data(), s.data(), idx.data(), N, E, k, sig,
                              renorm);
      DevBuf gl(logits), gs(s.size() * 4), gi(idx.size() * 4), gw(w.size() * 4), gdw(dw), gds(ds),
          gdl(dl.size() * 4);
      for (DevBuf* b : {&gs, &gi, &gw, &gdl}) b->poison();
      gpu()->moe_router_forward(gs.f(), gi.i(), gw.f(), gl.f(), N, E, k, sig, renorm);
      EXPECT_TRUE(close(gs.get(), s, 1e-5, 1e-7)) << "sigmoid " << sig << " k " << k;
      EXPECT_EQ(gi.get<int32_t>(), idx) << "sigmoid " << sig << " k " << k;
      EXPECT_TRUE(close(gw.get(), w, 1e-5, 1e-7)) << "sigmoid " << sig << " k " << k;
      gs.set(s);  // backward from the CPU's scores
      gw.set(w);
      gpu()->moe_router_backward(gdl.f(), gdw.f(), gds.f(), gs.f(), gi.i(), N, E, k, sig, renorm);
      EXPECT_TRUE(close(gdl.get(), dl, 1e-5, 1e-6)) << "sigmoid " << sig << " k " << k;
    }
}

TEST(CudaMoeOps, AuxLossAndStatsMatchCpu) {
  LOOM_REQUIRE_GPU();
  Backend& cpu = cpu_backend();
  const int N = 257, E = 6, k = 2;
  auto scores = random_floats(size_t(N) * E, 4, 0, 1);
  auto idx = random_ints(size_t(N) * k, 5, 0, E - 1);
  auto ds0 = random_floats(scores.size(), 6);
  std::vector<float> ds = ds0, stats(2 * E + 1);
  const double loss = cpu.moe_aux_loss(ds.data(), scores.data(), idx.data(), N, E, k, 0.01f, 3.f);
  cpu.moe_expert_stats(stats.data(), scores.data(), idx.data(), N, E, k);
  DevBuf gsc(scores), gi(idx), gds(ds0), gst(stats.size() * 4);
  gst.poison();
  const double gloss = gpu()->moe_aux_loss(gds.f(), gsc.f(), gi.i(), N, E, k, 0.01f, 3.f);
  EXPECT_NEAR(gloss, loss, 1e-12 * std::fabs(loss) + 1e-15);
  EXPECT_TRUE(close(gds.get(), ds, 1e-6, 1e-9));
  EXPECT_NEAR(gpu()->moe_aux_loss(nullptr, gsc.f(), gi.i(), N, E, k, 0.01f, 3.f), loss,
              1e-12 * std::fabs(loss));
  gpu()->moe_expert_stats(gst.f(), gsc.f(), gi.i(), N, E, k);
  EXPECT_TRUE(close(gst.get(), stats, 1e-7, 0));
  // A row vector onto every row.
  auto x = random_floats(size_t(N) * E, 7), row = random_floats(E, 8);
  std::vector<float> want = x;
  cpu.add_row_broadcast(want.data(), row.data(), N, E);
  DevBuf gx(x), grow(row);
  gpu()->add_row_broadcast(gx.f(), grow.f(), N, E);
  EXPECT_TRUE(same_bits(gx.get(), want));
}

TEST(CudaMoeOps, RoutingPlanMatchesCpuAndRejectsBadExperts) {
  LOOM_REQUIRE_GPU();
  Backend& cpu = cpu_backend();
  const int N = 200, E = 5, k = 2;
  auto idx = random_ints(size_t(N) * k, 9, 0, E - 1);
  for (int cap : {-1, 0, 30, 1000}) {
    std::vector<int32_t> plan(size_t(Backend::moe_plan_ints(N, E, k)));
    cpu.moe_plan_routing(plan.data(), idx.data(), N, E, k, cap);
    DevBuf gi(idx), gp(plan.size() * 4);
    gp.poison();
    gpu()->moe_plan_routing(gp.i(), gi.i(), N, E, k, cap);
    EXPECT_EQ(gp.get<int32_t>(), plan) << "capacity " << cap;
  }
  auto bad = idx;
  bad[77] = E;  // token 38, slot 1
  std::vector<int32_t> plan(size_t(Backend::moe_plan_ints(N, E, k)));
  EXPECT_THROW(cpu.moe_plan_routing(plan.data(), bad.data(), N, E, k, -1), Error);
  DevBuf gb(bad), gp(plan.size() * 4);
  gpu()->moe_plan_routing(gp.i(), gb.i(), N, E, k, -1);
  try {
    gpu()->sync();
    ADD_FAILURE() << "an expert index outside [0, E) must be reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 38"), std::string::npos) << e.what();
  }
  gpu()->sync();  // reported once
}

TEST(CudaMoeOps, PermutationsMatchCpu) {
  LOOM_REQUIRE_GPU();
  Backend& cpu = cpu_backend();
  const int N = 150, E = 4, k = 2, C = 40;
  auto idx = random_ints(size_t(N) * k, 10, 0, E - 1);
  for (int i = 0; i < N; ++i)  // distinct experts per token, as top-k gives
    if (idx[size_t(i) * k] == idx[size_t(i) * k + 1])
      idx[size_t(i) * k + 1] = (idx[size_t(i) * k] + 1) % E;
  std::vector<int32_t> plan(size_t(Backend::moe_plan_ints(N, E, k)));
  cpu.moe_plan_routing(plan.data(), idx.data(), N, E, k, 60);  // some dropped
  const int rows = plan[size_t(3 * E)];
  const int32_t* row_of = plan.data() + 3 * E + 1;
  const int32_t* token_of = row_of + N * k;
  auto x = random_floats(size_t(N) * C, 11), w = random_floats(size_t(N) * k, 12, 0, 1);
  auto eo = random_floats(size_t(rows) * C, 13), dy = random_floats(size_t(N) * C, 14);
  std::vector<float> xp(size_t(rows) * C), dx(size_t(N) * C), y(size_t(N) * C),
      deo(size_t(rows) * C), dw(size_t(N) * k);
  cpu.moe_permute(xp.data(), x.data(), token_of, rows, C);
  cpu.moe_permute_backward(dx.data(), eo.data(), row_of, N, k, C);
  cpu.moe_unpermute(y.data(), eo.data(), w.data(), row_of, N, k, C);
  cpu.moe_unpermute_backward(deo.data(), dw.data(), dy.data(), eo.data(), w.data(), row_of, N, k,
                             C);
  DevBuf gplan(plan), gx(x), gw(w), geo(eo), gdy(dy), gxp(xp.size() * 4), gdx(dx.size() * 4),
      gy(y.size() * 4), gdeo(deo.size() * 4), gdw(dw.size() * 4);
  for (DevBuf* b : {&gxp, &gdx, &gy, &gdw}) b->poison();
  gdeo.set(std::vector<float>(deo.size(), 0.f));
  const int32_t* grow = gplan.i() + 3 * E + 1;
  gpu()->moe_permute(gxp.f(), gx.f(), grow + N * k, rows, C);
  EXPECT_TRUE(same_bits(gxp.get(), xp));
  gpu()->moe_permute_backward(gdx.f(), geo.f(), grow, N, k, C);
  EXPECT_TRUE(close(gdx.get(), dx, 1e-6, 1e-7));
  gpu()->moe_unpermute(gy.f(), geo.f(), gw.f(), grow, N, k, C);
  EXPECT_TRUE(close(gy.get(), y, 1e-6, 1e-6));
  gpu()->moe_unpermute_backward(gdeo.f(), gdw.f(), gdy.f(), geo.f(), gw.f(), grow, N, k, C);
  EXPECT_TRUE(close(gdeo.get(), deo, 1e-6, 1e-7));
  EXPECT_TRUE(close(gdw.get(), dw, 1e-6, 1e-6));
}

TEST(CudaRingOps, BlockAttentionMatchesCpu) {
  LOOM_REQUIRE_GPU();
  Backend& cpu = cpu_backend();
  const int Hq = 4, Hkv = 2, D = 16, ldq = (Hq + 2 * Hkv) * D, ldk = 2 * Hkv * D;
  const float scale = 0.25f;
  for (auto [nq, nk] : {std::pair{70, 90}, std::pair{5, 1}, std::pair{33, 0}}) {
    auto q = random_floats(size_t(nq) * ldq, 15),
         kv = random_floats(size_t(std::max(nk, 1)) * ldk, 16);
    std::vector<float> out(size_t(nq) * Hq * D), lse(size_t(nq) * Hq);
    cpu.attention_block_forward(out.data(), lse.data(), q.data(), ldq, kv.data(),
                                kv.data() + Hkv * D, ldk, nq, nk, Hq, Hkv, D, scale);
    DevBuf gq(q), gkv(kv), go(out.size() * 4), gl(lse.size() * 4);
    go.poison();
    gl.poison();
    gpu()->attention_block_forward(go.f(), gl.f(), gq.f(), ldq, gkv.f(), gkv.f() + Hkv * D, ldk, nq,
                                   nk, Hq, Hkv, D, scale);
    EXPECT_TRUE(close(go.get(), out, 1e-5, 1e-6)) << nq << "x" << nk;
    EXPECT_TRUE(close(gl.get(), lse, 1e-5, 1e-6)) << nq << "x" << nk;
    if (nk == 0) continue;
    // Backward adds into what dq, dk, dv hold.
    auto dout = random_floats(out.size(), 17);
    auto dq0 = random_floats(q.size(), 18), dkv0 = random_floats(kv.size(), 19);
    std::vector<float> dq = dq0, dkv = dkv0;
    cpu.attention_block_backward(dq.data(), dkv.data(), dkv.data() + Hkv * D, dout.data(),
                                 out.data(), lse.data(), q.data(), ldq, kv.data(),
                                 kv.data() + Hkv * D, ldk, nq, nk, Hq, Hkv, D, scale);
    DevBuf gdo(dout), gdq(dq0), gdkv(dkv0);
    go.set(out);
    gl.set(lse);
    gpu()->attention_block_backward(gdq.f(), gdkv.f(), gdkv.f() + Hkv * D, gdo.f(), go.f(), gl.f(),
                                    gq.f(), ldq, gkv.f(), gkv.f() + Hkv * D, ldk, nq, nk, Hq, Hkv,
                                    D, scale);
    EXPECT_TRUE(close_scaled(gdq.get(), dq, 1e-5)) << nq << "x" << nk;
    EXPECT_TRUE(close_scaled(gdkv.get(), dkv, 1e-5)) << nq << "x" << nk;
  }
}

TEST(CudaRingOps, MergeAndAdd2dMatchCpu) {
  LOOM_REQUIRE_GPU();
  Backend& cpu = cpu_backend();
  const int N = 37, H = 3, D = 8;
  const float ninf = -std::numeric_limits<float>::infinity();
  auto oa = random_floats(size_t(N) * H * D, 20), ob = random_floats(size_t(N) * H * D, 21);
  auto la = random_floats(size_t(N) * H, 22, -4, 4), lb = random_floats(size_t(N) * H, 23, -4, 4);
  la[0] = ninf;          // one side empty
  la[1] = lb[1] = ninf;  // both empty
  lb[5] = ninf;
  std::vector<float> out(oa.size()), lse(la.size());
  cpu.attention_merge(out.data(), lse.data(), oa.data(), la.data(), ob.data(), lb.data(), N, H, D);
  DevBuf goa(oa), gla(la), gob(ob), glb(lb);
  // In place into the a side, as the ring loop merges.
  gpu()->attention_merge(goa.f(), gla.f(), goa.f(), gla.f(), gob.f(), glb.f(), N, H, D);
  EXPECT_TRUE(close(goa.get(), out, 1e-6, 1e-7));
  EXPECT_TRUE(close(gla.get(), lse, 1e-6, 1e-7));

  const int rows = 9, cols = 5, ldd = 12, lds = 7;
  auto dst = random_floats(size_t(rows) * ldd, 24), src = random_floats(size_t(rows) * lds, 25);
  std::vector<float> want = dst;
  cpu.add_2d(want.data(), ldd, src.data(), lds, rows, cols);
  DevBuf gd(dst), gsrc(src);
  gpu()->add_2d(gd.f(), ldd, gsrc.f(), lds, rows, cols);
  EXPECT_TRUE(same_bits(gd.get(), want));
}

// One MoE layer (router, top-k, capacity, experts, combine, aux loss) forward and backward on
// the GPU against the same layer on the CPU backend: GeLU and SwiGLU experts, dropless and
// with a capacity that drops.
TEST(CudaMoeLayer, ForwardBackwardMatchCpu) {
  LOOM_REQUIRE_GPU();
  // Exact fp32 GEMMs, so the router's logits (and so the top-k choice) match the CPU's.
  const GemmMath math = gpu()->gemm_math();
  gpu()->set_gemm_math(GemmMath::FP32);
  for (Family f : {Family::GPT2, Family::Llama})
    for (double capacity : {0.0, 0.75}) {
      ModelConfig c = model_preset(f == Family::GPT2 ? "tiny-moe" : "tiny-llama-moe");
      c.d_model = 16;
      c.d_ff = 24;
      c.n_experts = 4;
      c.top_k = 2;
      c.aux_loss_coeff = 0.1;
      c.capacity_factor = capacity;
      const int N = 48, C = c.d_model, E = c.n_experts, H = c.fc_dim(), F = c.d_ff;
      auto x = random_floats(size_t(N) * C, 30), dy = random_floats(size_t(N) * C, 31);
      auto router = random_floats(size_t(E) * C, 32), w1 = random_floats(size_t(E) * H * C, 33);
      auto w2 = random_floats(size_t(E) * C * F, 34);
      // CPU.
      std::vector<float> y(size_t(N) * C), dx(size_t(N) * C), gr(router.size(), 0.f),
          g1(w1.size(), 0.f), g2(w2.size(), 0.f);
      MoeLayer cl(c, ExpertParallel{}, cpu_backend());
      const double aux = cl.forward(y.data(), x.data(), N, {router.data(), w1.data(), w2.data()});
      cl.backward(dx.data(), dy.data(), x.data(), N, {router.data(), w1.data(), w2.data()},
                  {gr.data(), g1.data(), g2.data()}, 0.5f);
      // GPU.
      DevBuf gx(x), gdy(dy), grt(router), gw1(w1), gw2(w2), gy(y.size() * 4), gdx(dx.size() * 4);
      // Zeros, as the CPU's gradients started: backward accumulates (+=) into them.
      DevBuf ggr(std::vector<float>(gr.size(), 0.f)), gg1(std::vector<float>(g1.size(), 0.f)),
          gg2(std::vector<float>(g2.size(), 0.f));
      gy.poison();
      gdx.poison();
      MoeLayer gl(c, ExpertParallel{}, *gpu());
      const double gaux = gl.forward(gy.f(), gx.f(), N, {grt.f(), gw1.f(), gw2.f()});
      gl.backward(gdx.f(), gdy.f(), gx.f(), N, {grt.f(), gw1.f(), gw2.f()},
                  {ggr.f(), gg1.f(), gg2.f()}, 0.5f);
      gpu()->sync();
      const std::string what = std::string(f == Family::GPT2 ? "gelu" : "swiglu") + " capacity " +
                               std::to_string(capacity);
      EXPECT_EQ(gl.topk(), cl.topk()) << what;
      EXPECT_EQ(gl.stats().assigned, cl.stats().assigned) << what;
      EXPECT_EQ(gl.stats().dropped, cl.stats().dropped) << what;
      if (capacity > 0) {
        EXPECT_GT(cl.stats().dropped, 0) << what;
      }
      EXPECT_NEAR(gaux, aux, 1e-6 * std::fabs(aux)) << what;
      EXPECT_TRUE(close_scaled(gy.get(), y, 1e-4)) << what;
      EXPECT_TRUE(close_scaled(gdx.get(), dx, 1e-4)) << what;
      EXPECT_TRUE(close_scaled(ggr.get(), gr, 1e-4)) << what;
      EXPECT_TRUE(close_scaled(gg1.get(), g1, 1e-4)) << what;
      EXPECT_TRUE(close_scaled(gg2.get(), g2, 1e-4)) << what;
    }
  gpu()->set_gemm_math(math);
}

// The real Decoder with MoE layers, experts split over two ranks (EP) and ring attention (CP),
// each over a two-rank mirror communicator whose collectives are Backend copies
// (tests/model/mirror_communicator.h: the partner holds the same data), on the GPU against
// the same run on the CPU backend: two steps' losses, sequence log-probabilities and every
// gradient.
enum class Layout { Moe, Ep2, Cp2 };

struct StepResult {
  double loss = 0, loss2 = 0;
  std::vector<double> seq;
  std::vector<float> grads;
};

StepResult moe_ring_step(Backend& be, Family f, Layout lay, double capacity) {
  ModelConfig c = test::tiny(f);
  c.n_experts = 4;
  c.top_k = 2;
  c.aux_loss_coeff = 0.1;
  c.capacity_factor = capacity;
  c.validate();
  test::MirrorCommunicator mirror(be);
  ExpertParallel ep;
  if (lay == Layout::Ep2) {
    ep.size = 2;
    ep.comm = &mirror;
    ep.make_exchange = &parallel::make_expert_exchange;
  }
  Decoder m(c, be, Recompute::None, DType::F32, {}, ep);
  if (lay == Layout::Cp2) m.set_context_parallel(parallel::context_parallel_layout(mirror));
  m.params().init(7);
  m.params().zero_grad();
  StepResult r;
  for (int step = 0; step < 2; ++step) {
    test::Data d = test::make_data(step == 0 ? std::vector<int>{8, 12} : std::vector<int>{4, 8},
                                   c.vocab, 3 + step);
    d.targets[5] = -1;
    // CP: rank 0's rows of every document (chunks 0 and 3 of 4).
    CpBatch batch;
    std::vector<int32_t> tokens = d.tokens, targets = d.targets;
    ModelInput in = d.input();
    if (lay == Layout::Cp2) {
      batch = CpBatch::make(d.cu.data(), int(d.cu.size()) - 1, 2);
      const cpu::CpShard& s = batch.shards[0];
      tokens.clear();
      targets.clear();
      for (int32_t g : s.global_rows) {
        tokens.push_back(d.tokens[size_t(g)]);
        targets.push_back(d.targets[size_t(g)]);
      }
      in = ModelInput{tokens.data(),      targets.data(),
                      s.positions.data(), s.local_cu_seqlens.data(),
                      s.rows(),           int(s.local_cu_seqlens.size()) - 1};
      in.cp = &batch;
    }
    StepOutputs out;
    const double loss = m.forward_backward(in, 0.25f, step == 0 ? &out : nullptr);
    (step == 0 ? r.loss : r.loss2) = loss;
    if (step == 0) r.seq = out.seq_logprobs;
  }
  r.grads.resize(size_t(m.params().total()));
  m.params().read_grads(0, m.params().total(), r.grads.data());
  return r;
}

TEST(CudaMoeRingDecoder, MoeExpertAndContextParallelStepsMatchCpu) {
  LOOM_REQUIRE_GPU();
  const GemmMath math = gpu()->gemm_math();
  gpu()->set_gemm_math(GemmMath::FP32);  // the same top-k choices as the CPU
  struct Case {
    Family f;
    Layout lay;
    double capacity;
    const char* name;
  };
  for (const Case& k : {Case{Family::GPT2, Layout::Moe, 0.75, "gpt2 moe capacity 0.75"},
                        Case{Family::Llama, Layout::Moe, 0.0, "llama moe dropless"},
                        Case{Family::Llama, Layout::Ep2, 0.0, "llama ep2"},
                        Case{Family::Llama, Layout::Cp2, 0.0, "llama moe cp2"},
                        Case{Family::GPT2, Layout::Cp2, 0.0, "gpt2 moe cp2"}}) {
    const StepResult want = moe_ring_step(cpu_backend(), k.f, k.lay, k.capacity);
    StepResult got;
    try {
      got = moe_ring_step(*gpu(), k.f, k.lay, k.capacity);
      gpu()->sync();
    } catch (const std::exception& e) {
      ADD_FAILURE() << k.name << ": " << e.what();
      continue;
    }
    EXPECT_NEAR(got.loss, want.loss, 1e-5 * std::fabs(want.loss)) << k.name;
    EXPECT_NEAR(got.loss2, want.loss2, 1e-5 * std::fabs(want.loss2)) << k.name;
    ASSERT_EQ(got.seq.size(), want.seq.size()) << k.name;
    for (size_t i = 0; i < want.seq.size(); ++i)
      EXPECT_NEAR(got.seq[i], want.seq[i], 1e-4 * std::fabs(want.seq[i]) + 1e-5) << k.name;
    EXPECT_TRUE(close_scaled(got.grads, want.grads, 1e-4)) << k.name;
  }
  gpu()->set_gemm_math(math);
}

}  // namespace
}  // namespace loom
