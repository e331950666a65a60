// Device-agnostic: the Decoder runs through a backend whose buffers the host cannot touch
// (tests/kernels/guarded_backend.h: PROT_NONE outside the backend's ops). A host loop over an
// activation, a std::copy into the arena or a host read of the losses faults there, as it
// would read garbage on a GPU. Each run happens in a child process (a death test that must
// exit 0), so a fault is this test's failure; the child also checks that the results equal a
// run on the CPU backend bit for bit (the ops are the same). The parameters and gradients are
// guarded buffers too (ParamSet allocates on the Decoder's backend): forward and backward read
// weights and write gradients only inside ops, and the test sees them through host staging.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ostream>
#include <set>
#include <string>
#include <vector>

#include "core/rng.h"
#include "kernels/guarded_backend.h"
#include "model/decoder.h"
#include "model/lora.h"
#include "model/mirror_communicator.h"
#include "model/model_test_util.h"
#include "parallel/expert_parallel.h"
#include "parallel/pipeline_stage.h"
#include "parallel/ring_attention.h"
#include "parallel/tensor_parallel.h"
#include "same_bits.h"

using namespace loom;

namespace {

using test::Data;
using test::tiny;

// Gradients (and values) as the host sees them: staged through copy_d2h, since on the guarded
// backend the parameters live in its memory like every other buffer.
std::vector<float> grads_of(const Decoder& m) {
  std::vector<float> g(size_t(m.params().total()));
  m.params().read_grads(0, m.params().total(), g.data());
  return g;
}
std::vector<float> values_of(const Decoder& m) {
  std::vector<float> v(size_t(m.params().total()));
  m.params().read_values(0, m.params().total(), v.data());
  return v;
}

struct Result {
  double loss = 0, loss2 = 0, fwd_loss = 0;
  std::vector<float> values, grads, logits;
  StepOutputs out;
};

// The layout of a run: none, TP over two ranks, TP with sequence parallelism, a MoE model in
// one process, experts split over two ranks (EP), or ring attention over two ranks (CP, with
// MoE layers too) (rank 0 of a mirror pair: tests/model/mirror_communicator.h).
enum class Tp { None, Tp2, Tp2Sp, Moe, Ep2, Cp2 };

// The micro-batch rank 0 of a two-rank CP group holds: its rows of every document.
struct CpData {
  CpBatch batch;
  std::vector<int32_t> tokens, targets;
  std::vector<float> weights;
  ModelInput input() const {
    const cpu::CpShard& s = batch.shards[0];
    ModelInput in{tokens.data(),      targets.data(),
                  s.positions.data(), s.local_cu_seqlens.data(),
                  s.rows(),           static_cast<int>(s.local_cu_seqlens.size()) - 1};
    in.loss_weights = weights.empty() ? nullptr : weights.data();
    in.cp = &batch;
    return in;
  }
};
CpData cp_share(const Data& d) {
  CpData l;
  l.batch = CpBatch::make(d.cu.data(), static_cast<int>(d.cu.size()) - 1, 2);
  for (int32_t g : l.batch.shards[0].global_rows) {
    l.tokens.push_back(d.tokens[size_t(g)]);
    l.targets.push_back(d.targets[size_t(g)]);
    if (!d.weights.empty()) l.weights.push_back(d.weights[size_t(g)]);
  }
  return l;
}

// Everything a step and the forward-only paths do: two micro-batches (the second smaller, so
// the buffers are reused), loss weights, sequence and token log-probabilities, forward_loss,
// and forward_logits of chosen rows (under SP too: the final norm's rows gathered).
Result run(Backend& be, Family f, Recompute rc, DType act, Tp tpm = Tp::None) {
  ModelConfig c = tiny(f);
  const bool moe = tpm == Tp::Moe || tpm == Tp::Ep2 || tpm == Tp::Cp2;
  if (moe) {
    c.n_experts = 4;
    c.top_k = 2;
    c.aux_loss_coeff = 0.1;
    // One process drops over a capacity for GPT-2 (CP refuses a capacity).
    c.capacity_factor = tpm == Tp::Moe && f == Family::GPT2 ? 0.75 : 0.0;
    c.validate();
  }
  test::MirrorCommunicator mirror(be);
  TensorParallel tp;
  if (tpm == Tp::Tp2 || tpm == Tp::Tp2Sp)
    tp = parallel::with_tensor_parallel_ops({2, 0, tpm == Tp::Tp2Sp, &mirror});
  ExpertParallel ep;
  if (tpm == Tp::Ep2) {
    ep.size = 2;
    ep.comm = &mirror;
    ep.make_exchange = &parallel::make_expert_exchange;
  }
  Decoder m(c, be, rc, act, tp, ep);
  if (tpm == Tp::Cp2) m.set_context_parallel(parallel::context_parallel_layout(mirror));
  m.params().init(7);
  m.params().zero_grad();
  // CP cuts every document into 4 chunks: lengths divisible by 4.
  Data d = test::make_data(tpm == Tp::Cp2 ? std::vector<int>{8, 12} : std::vector<int>{9, 7},
                           c.vocab, 3);
  d.targets[4] = -1;
  d.weights.assign(d.tokens.size(), 1.f);
  d.weights[2] = 0.f;
  d.weights[11] = -0.5f;
  const CpData cd = tpm == Tp::Cp2 ? cp_share(d) : CpData{};
  const ModelInput in = tpm == Tp::Cp2 ? cd.input() : d.input();
  Result r;
  r.values = values_of(m);  // init() drew on the host and copied over
  r.out.want_token_logprobs = true;
  r.loss = m.forward_backward(in, 0.25f, &r.out);
  // SP splits the tokens over the two ranks: an even count.
  Data d2 = test::make_data(
      tpm == Tp::Cp2 ? std::vector<int>{4, 8} : std::vector<int>{5, tpm == Tp::Tp2Sp ? 7 : 6},
      c.vocab, 4);
  const CpData cd2 = tpm == Tp::Cp2 ? cp_share(d2) : CpData{};
  const ModelInput in2 = tpm == Tp::Cp2 ? cd2.input() : d2.input();
  r.loss2 = m.forward_backward(in2, 0.5f);
  r.grads = grads_of(m);
  r.fwd_loss = m.forward_loss(in);
  if (tpm == Tp::Cp2) {
    if (mirror.unmatched() != 0) r.loss = -1;  // a ring message without its match
    return r;
  }
  const std::vector<int> rows = {10, 0, 6};
  r.logits.resize(rows.size() * c.vocab);
  m.forward_logits(in2, rows, r.logits.data());
  if (mirror.unmatched() != 0) r.loss = -1;
  return r;
}

// A pipeline of two chunks held by one process (virtual stages): the stage activations the
// caller passes between chunks are buffers of the same backend.
Result run_stages(Backend& be) {
  ModelConfig c = tiny(Family::GPT2);
  PipelineStage pp;
  pp.chunks = {{0, 1}, {1, 2}};
  Decoder m(c, be, Recompute::None, DType::F32, {}, {}, pp);
  m.params().init(7);
  m.params().zero_grad();
  Data d = test::make_data({9, 7}, c.vocab, 3);
  parallel::StageRunner st(m);
  const size_t bytes = size_t(st.act_elems(d.input().N)) * sizeof(float);
  BackendBuffer x(be, bytes, "stage"), dx(be, bytes, "stage");
  Result r;
  st.forward(0, d.input(), nullptr, x.as<float>());
  r.fwd_loss = st.forward_loss(1, d.input(), x.as<float>(), nullptr);
  r.loss = st.backward(1, d.input(), x.as<float>(), nullptr, dx.as<float>(), 0.25f);
  r.loss2 = st.backward(0, d.input(), nullptr, dx.as<float>(), nullptr, 0.25f);
  r.grads = grads_of(m);
  return r;
}

// LoRA adapters on every linear layer: their parameters live on the model's backend (guarded
// memory here), the step reads A and B and writes their gradients inside ops only, and the
// merge is a GEMM on the device. B starts non-zero (written through staging) so that every
// gradient and the merge are non-trivial.
Result run_lora(Backend& be) {
  ModelConfig c = tiny(Family::Llama);
  Decoder m(c, be);
  m.params().init(7);
  LoraConfig lc;
  lc.rank = 2;
  lc.alpha = 4;
  lc.seed = 5;
  Lora lora(m, lc);
  ParamSet& L = lora.params();
  std::vector<float> v(size_t(L.total()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1f * normal_at(9, 1, i);
  L.write_values(0, L.total(), v.data());
  Data d = test::make_data({9, 7}, c.vocab, 3);
  Result r;
  r.loss = m.forward_backward(d.input(), 0.25f);
  r.grads.resize(size_t(L.total()));
  L.read_grads(0, L.total(), r.grads.data());
  lora.merge_into_base();
  r.values = values_of(m);
  return r;
}

// In the child: the guarded run, compared with the CPU run; exits 0 only when all agree.
// pipeline: the stage path (run_stages) instead of run's; lora: run_lora; tp: run's layout.
[[noreturn]] void guarded_child(Family f, Recompute rc, DType act, bool pipeline = false,
                                bool lora = false, Tp tp = Tp::None) {
  auto go = [&](Backend& be) {
    return lora ? run_lora(be) : pipeline ? run_stages(be) : run(be, f, rc, act, tp);
  };
  const Result want = go(cpu_backend());
  test::GuardedBackend g;
  // Under bf16 storage Linear widens its input into a Backend buffer of the Decoder
  // (Linear::widen), so the bf16 paths are strict too. LoRA's adapters compute through their
  // own host scratch (model/lora.cpp): not strict.
  g.set_strict(!lora);
  Result got;
  try {
    got = go(g);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "guarded run threw: %s\n", e.what());
    std::exit(2);
  }
  std::string bad;
  if (got.loss != want.loss || got.loss2 != want.loss2) bad += " loss";
  if (got.fwd_loss != want.fwd_loss) bad += " forward_loss";
  if (!loom::test::same_bits(got.values, want.values)) bad += " initial values";
  if (!loom::test::same_bits(got.grads, want.grads)) bad += " gradients";
  if (!loom::test::same_bits(got.logits, want.logits)) bad += " logits";
  if (got.out.seq_logprobs != want.out.seq_logprobs) bad += " seq_logprobs";
  if (!loom::test::same_bits(got.out.token_logprobs, want.out.token_logprobs))
    bad += " token_logprobs";
  for (const std::string& op :
       std::set<std::string>(g.host_pointer_ops().begin(), g.host_pointer_ops().end()))
    bad += " (host memory given to " + op + ")";
  if (!pipeline && !lora && g.ops() < 50) bad += " (too few ops went through the guarded backend)";
  if (!bad.empty()) std::fprintf(stderr, "guarded run differs from the CPU run:%s\n", bad.c_str());
  std::exit(bad.empty() ? 0 : 1);
}

struct Case {
  Family family;
  Recompute recompute;
  DType act;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << (c.family == Family::GPT2 ? "gpt2" : "llama")
      << " recompute=" << recompute_name(c.recompute) << " " << dtype_name(c.act);
}

class DeviceAgnostic : public ::testing::TestWithParam<Case> {};

}  // namespace

TEST_P(DeviceAgnostic, DecoderTouchesNoBufferOutsideTheBackend) {
  // Re-executes the binary for the child: OpenMP's thread pool does not survive fork().
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Case c = GetParam();
  EXPECT_EXIT(guarded_child(c.family, c.recompute, c.act), ::testing::ExitedWithCode(0), "");
}

INSTANTIATE_TEST_SUITE_P(Paths, DeviceAgnostic,
                         ::testing::Values(Case{Family::GPT2, Recompute::None, DType::F32},
                                           Case{Family::Llama, Recompute::None, DType::F32},
                                           Case{Family::GPT2, Recompute::Selective, DType::F32},
                                           Case{Family::Llama, Recompute::Full, DType::F32},
                                           Case{Family::GPT2, Recompute::None, DType::BF16},
                                           Case{Family::Llama, Recompute::Selective, DType::BF16}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           const Case& c = i.param;
                           return std::string(c.family == Family::GPT2 ? "Gpt2" : "Llama") + "_" +
                                  recompute_name(c.recompute) + "_" + dtype_name(c.act);
                         });

TEST(DeviceAgnostic, PipelineStagesTouchNoBufferOutsideTheBackend) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(guarded_child(Family::GPT2, Recompute::None, DType::F32, true),
              ::testing::ExitedWithCode(0), "");
}

// Tensor parallelism (vocabulary-parallel embedding and cross-entropy, the Linears' edges, the
// logits gathered into rows) and sequence parallelism: no host loop left in their paths.
TEST(DeviceAgnostic, TensorParallelTouchesNoBufferOutsideTheBackend) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(guarded_child(Family::GPT2, Recompute::None, DType::F32, false, false, Tp::Tp2),
              ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(guarded_child(Family::Llama, Recompute::Selective, DType::F32, false, false, Tp::Tp2),
              ::testing::ExitedWithCode(0), "");
}

TEST(DeviceAgnostic, SequenceParallelTouchesNoBufferOutsideTheBackend) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(guarded_child(Family::GPT2, Recompute::None, DType::F32, false, false, Tp::Tp2Sp),
              ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(guarded_child(Family::Llama, Recompute::Full, DType::F32, false, false, Tp::Tp2Sp),
              ::testing::ExitedWithCode(0), "");
}

TEST(DeviceAgnostic, LoraAdaptersTouchNoBufferOutsideTheBackend) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(guarded_child(Family::Llama, Recompute::None, DType::F32, false, true),
              ::testing::ExitedWithCode(0), "");
}

// The MoE layers (router, top-k, capacity dropping, the experts' GEMMs, combine, aux loss) in
// one process, and with the experts split over two ranks (the all-to-all exchange on backend
// buffers): no host loop left in their paths.
TEST(DeviceAgnostic, MoeTouchesNoBufferOutsideTheBackend) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(guarded_child(Family::GPT2, Recompute::None, DType::F32, false, false, Tp::Moe),
              ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(guarded_child(Family::Llama, Recompute::Selective, DType::F32, false, false, Tp::Moe),
              ::testing::ExitedWithCode(0), "");
}

TEST(DeviceAgnostic, ExpertParallelTouchesNoBufferOutsideTheBackend) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(guarded_child(Family::Llama, Recompute::None, DType::F32, false, false, Tp::Ep2),
              ::testing::ExitedWithCode(0), "");
}

// Context parallelism: ring attention (the KV ring, the blockwise merge by log-sum-exp, the
// dK/dV accumulators travelling home) and the MoE statistics summed over the CP group.
TEST(DeviceAgnostic, ContextParallelTouchesNoBufferOutsideTheBackend) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(guarded_child(Family::Llama, Recompute::None, DType::F32, false, false, Tp::Cp2),
              ::testing::ExitedWithCode(0), "");
  EXPECT_EXIT(guarded_child(Family::GPT2, Recompute::Selective, DType::F32, false, false, Tp::Cp2),
              ::testing::ExitedWithCode(0), "");
}

// Host code that would read or write the parameters in place (checkpoints, exports, weight
// quantisation) is refused on such a backend with an error naming the operation; the staging
// copies work.
TEST(DeviceAgnostic, HostAccessToParametersIsRefusedNamingTheOperation) {
  test::GuardedBackend g;
  Decoder m(tiny(Family::GPT2), g);
  EXPECT_FALSE(m.params().host_accessible());
  try {
    m.params().tensors("saving a checkpoint");
    FAIL() << "host views of guarded parameters were handed out";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("saving a checkpoint"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("guarded-cpu"), std::string::npos) << e.what();
  }
  EXPECT_THROW(m.params().host_grad("clipping"), Error);
  EXPECT_THROW(m.params().host_ptr("embed.wte", "weight quantisation"), Error);
  m.params().init(3);
  Decoder ref(tiny(Family::GPT2), cpu_backend());
  ref.params().init(3);
  EXPECT_TRUE(loom::test::same_bits(values_of(m), values_of(ref)));
  EXPECT_NE(g.memory_report().find("parameters"), std::string::npos) << g.memory_report();
}

// A tensor-parallel layout assembled by hand without its communication holds its shard's
// parameters (as checkpoint consolidation uses it) but runs no step: a clear error, no fault.
TEST(TensorParallelLayout, WithoutItsCommunicationRefusesToRun) {
  ModelConfig c = tiny(Family::GPT2);
  test::MirrorCommunicator mirror(cpu_backend());
  TensorParallel tp{2, 0, false, &mirror};
  Decoder m(c, cpu_backend(), Recompute::None, DType::F32, tp);
  EXPECT_EQ(m.params().info("embed.wte").shape[0], c.vocab / 2);
  m.params().init(1);
  Data d = test::make_data({4, 4}, c.vocab, 1);
  try {
    m.forward_backward(d.input(), 1.f);
    FAIL() << "a step ran without the layout's communication";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel::tensor_parallel_layout"), std::string::npos)
        << e.what();
  }
}

// The same for expert parallelism: the MoE layers hold this rank's experts, and a step refuses,
// naming the function that brings the exchange.
TEST(ExpertParallelLayout, WithoutItsExchangeRefusesToRun) {
  ModelConfig c = tiny(Family::Llama);
  c.n_experts = 4;
  c.top_k = 2;
  c.validate();
  test::MirrorCommunicator mirror(cpu_backend());
  ExpertParallel ep;
  ep.size = 2;
  ep.comm = &mirror;
  Decoder m(c, cpu_backend(), Recompute::None, DType::F32, {}, ep);
  EXPECT_EQ(m.params().info("blocks.0.moe.experts.w1").shape[0], 2);
  m.params().init(1);
  Data d = test::make_data({4, 4}, c.vocab, 1);
  try {
    m.forward_backward(d.input(), 1.f);
    FAIL() << "a step ran without the layout's expert exchange";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel::expert_parallel_layout"), std::string::npos)
        << e.what();
  }
}

// The same for context parallelism: a layout without its attention core is refused when it is
// set, naming the function that brings the ring attention.
TEST(ContextParallelLayout, WithoutItsAttentionCoreIsRefused) {
  test::MirrorCommunicator mirror(cpu_backend());
  Decoder m(tiny(Family::GPT2), cpu_backend());
  try {
    m.set_context_parallel({2, 0, &mirror});
    FAIL() << "a context-parallel layout without its attention core was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel::context_parallel_layout"), std::string::npos)
        << e.what();
  }
  m.set_context_parallel(parallel::context_parallel_layout(mirror));
  EXPECT_EQ(m.context_parallel().size, 2);
}

// A one-rank group with its communication (what the trainer builds from a one-rank world) is
// the one-process model bit for bit: the sliced vocabulary ops are not used for one slice.
TEST(TensorParallelLayout, OneRankIsTheOneProcessModelBitForBit) {
  ModelConfig c = tiny(Family::Llama);
  auto self = comm::make_self_communicator();
  Decoder a(c, cpu_backend());
  Decoder b(c, cpu_backend(), Recompute::None, DType::F32,
            parallel::with_tensor_parallel_ops({1, 0, false, self.get()}));
  Data d = test::make_data({9, 7}, c.vocab, 3);
  std::vector<float> ga, gb;
  double la = 0, lb = 0;
  for (Decoder* m : {&a, &b}) {
    m->params().init(7);
    m->params().zero_grad();
    (m == &a ? la : lb) = m->forward_backward(d.input(), 0.25f);
    (m == &a ? ga : gb).assign(m->params().grad(), m->params().grad() + m->params().total());
  }
  EXPECT_EQ(la, lb);
  EXPECT_TRUE(loom::test::same_bits(ga, gb));
}
