// Tensor-parallel serving as a real 2-rank MPI job: rank 0's engine over its shard (the batch
// broadcast each step, the vocabulary slices of the logits all-gathered) gives the same greedy
// tokens as the one-process engine over the whole model, and log-probabilities within 1e-4, for
// GPT-2 and Llama (GQA), on the BLAS path and with every --weights recipe (fp32, bf16, int8,
// fp8); rank 1 follows the steps with its own KV cache until told to stop.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "comm/process_groups.h"
#include "core/rng.h"
#include "infer/engine.h"
#include "infer/model_runner.h"
#include "infer/tp_serving.h"
#include "infer/weight_quant.h"
#include "model/decoder.h"
#include "mpi_main.h"
#include "parallel/tensor_parallel.h"

#include "infer_test_util.h"

using namespace loom;
using namespace loom::infer;
using loom::infer::test::prompt;
using loom::infer::test::tiny;

namespace {

struct Output {
  std::map<int64_t, std::vector<int32_t>> tokens;
  std::map<int64_t, std::vector<float>> logprobs;
};

EngineConfig engine_config() {
  EngineConfig ec;
  ec.scheduler.max_batched_tokens = 8;  // chunked prefill mixed with decodes
  ec.scheduler.max_num_seqs = 4;
  ec.num_blocks = 40;
  return ec;
}

// Every prompt at once through an engine over `runner`, greedy, 10 tokens each.
Output serve(ModelRunner& runner, const std::vector<std::vector<int32_t>>& prompts) {
  LoomEngine engine(runner, engine_config());
  Output out;
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = 10;
  sp.ignore_eos = true;
  sp.logprobs = 0;
  for (size_t i = 0; i < prompts.size(); ++i)
    engine.submit(prompts[i], sp, [&out, i](const TokenEvent& e) {
      auto& t = out.tokens[int64_t(i)];
      t.insert(t.end(), e.tokens.begin(), e.tokens.end());
      auto& l = out.logprobs[int64_t(i)];
      l.insert(l.end(), e.logprobs.begin(), e.logprobs.end());
    });
  engine.run_until_idle();
  return out;
}

// `weights`: none (the BLAS path), or the weight-only recipes of --weights fp32 (the GEMV on
// the model's own weights), bf16 (rounded copies), int8 or fp8 (per-channel scales), attached on
// both sides.
void check_tp_equals_one_rank(std::optional<WeightType> weights) {
  comm::ParallelDims dims;
  dims.tp = comm::world().size();
  comm::ProcessGroups pg(comm::world(), dims);
  ASSERT_EQ(pg.tp().size(), 2);
  for (Family f : {Family::GPT2, Family::Llama}) {
    const auto shared = prompt(20, 9);
    const std::vector<std::vector<int32_t>> prompts = {prompt(7, 1), prompt(5, 2, shared),
                                                       prompt(9, 3, shared), prompt(33, 4)};
    Decoder tp_model(tiny(f), cpu_backend(), Recompute::None, DType::F32,
                     parallel::tensor_parallel_layout(pg, false));
    tp_model.params().init(5);  // the same weights as the whole model's at their global places
    std::unique_ptr<QuantizedWeights> tp_quant;
    if (weights) tp_quant = std::make_unique<QuantizedWeights>(tp_model, *weights);
    if (pg.tp().rank() != 0) {
      run_tp_worker(tp_model, pg.tp(), engine_config().block_size, engine_config().num_blocks, 30);
      continue;
    }
    Decoder whole(tiny(f), cpu_backend());
    whole.params().init(5);
    std::unique_ptr<QuantizedWeights> quant;
    if (weights) quant = std::make_unique<QuantizedWeights>(whole, *weights);
    DecoderRunner one(whole);
    const Output want = serve(one, prompts);
    TpLeaderRunner leader(tp_model, pg.tp(), 30);
    const Output got = serve(leader, prompts);
    leader.stop();
    const std::string what =
        cat("family ", int(f), ", weights ", weights ? weight_type_name(*weights) : "BLAS");
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int64_t id = int64_t(i);
      ASSERT_EQ(want.tokens.at(id).size(), 10u);
      EXPECT_EQ(got.tokens.at(id), want.tokens.at(id)) << what << ", prompt " << i;
      ASSERT_EQ(got.logprobs.at(id).size(), want.logprobs.at(id).size());
      for (size_t k = 0; k < want.logprobs.at(id).size(); ++k)
        EXPECT_NEAR(got.logprobs.at(id)[k], want.logprobs.at(id)[k], 1e-4) << what;
    }
  }
}

}  // namespace

TEST(TpServing, GreedyOverTwoRanksEqualsOneRank) {
  check_tp_equals_one_rank(std::nullopt);
}

TEST(TpServing, WeightOnlyFp32AndBf16OverTwoRanksEqualOneRank) {
  check_tp_equals_one_rank(WeightType::F32);
  check_tp_equals_one_rank(WeightType::BF16);
}

// Each rank quantises its own shard; a row-parallel shard (attention and MLP output projections)
// takes its per-channel scales from the whole row (the maximum over the ranks): with the shard's
// own maximum the weights, and the logprobs, would differ from one process's.
TEST(TpServing, WeightOnlyInt8AndFp8OverTwoRanksEqualOneRank) {
  check_tp_equals_one_rank(WeightType::INT8);
  check_tp_equals_one_rank(WeightType::FP8);
}

// A NaN weight in one rank's shard is refused on every rank, naming the layer, and no rank is
// left waiting in a collective: in a row-parallel layer (its maximum reaches every rank) and in
// the last, column-parallel one (the head: only rank 1 holds the row).
TEST(TpServing, NanWeightInOneShardIsRefusedOnEveryRank) {
  comm::ParallelDims dims;
  dims.tp = comm::world().size();
  comm::ProcessGroups pg(comm::world(), dims);
  for (const std::string layer : {"blocks.0.attn.proj", "head"})
    for (WeightType t : {WeightType::INT8, WeightType::FP8}) {
      Decoder tp_model(tiny(Family::Llama), cpu_backend(), Recompute::None, DType::F32,
                       parallel::tensor_parallel_layout(pg, false));
      tp_model.params().init(5);
      ParamSet& p = tp_model.params();
      const std::string w = layer == "head" ? (p.has("head.weight") ? "head.weight" : "embed.wte")
                                            : layer + ".weight";
      if (pg.tp().rank() == 1) p.ptr(w)[3] = std::nanf("");
      try {
        QuantizedWeights q(tp_model, t);
        ADD_FAILURE() << weight_type_name(t) << " accepted a NaN in " << layer << " on rank "
                      << pg.tp().rank();
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("linear layer " + layer + ": a weight row holds NaN"),
                  std::string::npos)
            << e.what();
      }
    }
}

// Rank 0 starting up (loading and quantising its shard, reading the tokenizer) for longer than
// the per-step timeout is not a timeout: rank 1 waits for rank 0's ready message under the
// start-up timeout, and the step clock starts only then.
TEST(TpServing, SlowStartOnRankZeroIsNotAStepTimeout) {
  comm::ParallelDims dims;
  dims.tp = comm::world().size();
  comm::ProcessGroups pg(comm::world(), dims);
  Decoder tp_model(tiny(Family::GPT2), cpu_backend(), Recompute::None, DType::F32,
                   parallel::tensor_parallel_layout(pg, false));
  tp_model.params().init(5);
  constexpr double kStepTimeout = 2, kStartupTimeout = 30;
  if (pg.tp().rank() != 0) {
    EXPECT_NO_THROW(run_tp_worker(tp_model, pg.tp(), engine_config().block_size,
                                  engine_config().num_blocks, kStepTimeout, kStartupTimeout));
    return;
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(kStepTimeout + 1.5));
  TpLeaderRunner leader(tp_model, pg.tp(), kStepTimeout, kStartupTimeout);
  const Output got = serve(leader, {prompt(7, 1)});
  leader.stop();
  EXPECT_EQ(got.tokens.at(0).size(), 10u);
}

LOOM_MPI_TEST_MAIN()
