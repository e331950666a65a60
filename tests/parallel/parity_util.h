// Shared pieces of the multi-process parity tests: a tiny model, a deterministic global batch,
// and the single-process reference run that every layout must reproduce.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/rng.h"
#include "model/decoder.h"
#include "optim/adamw.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline.h"

namespace loom::testing_parallel {

// The global batch of every parity test: kSteps optimizer steps, each of kMicros micro-batches
// per data-parallel rank of kRows sequences of kT tokens.
constexpr int kSteps = 10, kRows = 2, kT = 16, kMicros = 2;

inline ModelConfig tiny_model(Family f, int d_model, int n_head, int n_kv_head, int head_dim,
                              int vocab = 61) {
  ModelConfig c = model_preset(f == Family::GPT2 ? "tiny" : "tiny-llama");
  c.n_layer = 2;
  c.d_model = d_model;
  c.n_head = n_head;
  c.n_kv_head = f == Family::GPT2 ? n_head : n_kv_head;
  c.head_dim = head_dim;
  c.d_ff = f == Family::GPT2 ? 4 * d_model : 48;
  c.vocab = vocab;  // odd: with an odd width, no tensor divides evenly by the DP size
  c.max_seq = 16;
  c.init_std = 0.1f;
  return c;
}

// A MoE variant: 4 experts, top-2, dropless, with an auxiliary loss (its statistics span the
// whole micro-batch: under CP they are summed over the CP group).
inline ModelConfig tiny_moe_model(Family f, int vocab = 61) {
  ModelConfig c = tiny_model(f, 32, 4, 2, 8, vocab);
  c.n_experts = 4;
  c.top_k = 2;
  c.aux_loss_coeff = 0.05;
  return c;
}

inline int world_size() {
  return comm::world().size();
}

// `rows` sequences of T tokens; sequence s of step k is the same in every layout.
struct MicroBatch {
  std::vector<int32_t> tokens, targets, positions, cu;
  int64_t valid = 0;
  ModelInput input() const {
    return {tokens.data(),
            targets.data(),
            positions.data(),
            cu.data(),
            static_cast<int>(tokens.size()),
            static_cast<int>(cu.size()) - 1};
  }
};

// Re-cuts a micro-batch's rows into documents of the given lengths (positions restart at each
// document): a packed batch. The lengths must sum to the token count.
inline void pack_docs(MicroBatch& m, const std::vector<int>& lens) {
  m.cu.assign(1, 0);
  m.positions.clear();
  for (int L : lens) {
    for (int t = 0; t < L; ++t) m.positions.push_back(t);
    m.cu.push_back(m.cu.back() + L);
  }
  EXPECT_EQ(size_t(m.cu.back()), m.tokens.size());
}

// With `doc_lens` the micro-batch is packed (pack_docs); without, one document a row.
inline MicroBatch make_micro(int step, int first_seq, int rows, int T, int vocab,
                             const std::vector<int>& doc_lens = {}) {
  MicroBatch m;
  m.cu.push_back(0);
  for (int s = first_seq; s < first_seq + rows; ++s) {
    for (int t = 0; t < T; ++t) {
      uint64_t i = (uint64_t(step) * 1000 + s) * 64 + t;
      // A learnable pattern (next = current + 1 mostly) plus noise, so the loss moves.
      int32_t tok = static_cast<int32_t>(uniform_at(7, 1, i) * vocab);
      m.tokens.push_back(tok);
      bool masked = uniform_at(7, 3, i) < 0.1;  // some positions carry no loss
      int32_t tgt = uniform_at(7, 2, i) < 0.7 ? (tok + 1) % vocab
                                              : static_cast<int32_t>(uniform_at(7, 4, i) * vocab);
      m.targets.push_back(masked ? -1 : tgt);
      m.valid += masked ? 0 : 1;
      m.positions.push_back(t);
    }
    m.cu.push_back(static_cast<int32_t>(m.tokens.size()));
  }
  if (!doc_lens.empty()) pack_docs(m, doc_lens);
  return m;
}

// Data-parallel rank `dp_rank` of `dp_size`'s micro-batches of step k: its micro-batch j is the
// single process's micro-batch j * dp_size + dp_rank.
inline std::vector<MicroBatch> rank_micros(int step, int micros, int dp_size, int dp_rank,
                                           int vocab, const std::vector<int>& doc_lens = {}) {
  std::vector<MicroBatch> mb;
  for (int j = 0; j < micros; ++j)
    mb.push_back(make_micro(step, (j * dp_size + dp_rank) * kRows, kRows, kT, vocab, doc_lens));
  return mb;
}

// The loss-carrying tokens of the whole step: every data-parallel rank's micro-batches.
inline int64_t global_valid(const std::vector<MicroBatch>& mb, comm::Communicator& dp) {
  int64_t valid = 0;
  for (const MicroBatch& m : mb) valid += m.valid;
  return dp.all_reduce_scalar(valid, comm::ReduceOp::Sum);
}

struct StepLog {
  std::vector<double> losses, norms;
  std::vector<float> first_grads;  // reduced gradients of step 0 (before clipping)
  std::vector<float> final_params;
};

constexpr double kClip = 0.5;

// The optimizer of every run here, single-process or split.
inline AdamWConfig parity_adamw() {
  AdamWConfig ac;
  ac.weight_decay = 0.1;
  return ac;
}

// One process, `micros` micro-batches of `rows` sequences per step, global-norm clipping.
inline StepLog reference_run(const ModelConfig& cfg, int steps, int micros, int rows, int T,
                             uint64_t seed = 5, const std::vector<int>& doc_lens = {}) {
  Decoder m(cfg, cpu_backend());
  m.params().init(seed);
  AdamW opt(m.params(), parity_adamw(), DType::F32, cpu_backend());
  StepLog log;
  ParamSet& P = m.params();
  for (int k = 0; k < steps; ++k) {
    std::vector<MicroBatch> mb;
    int64_t valid = 0;
    for (int j = 0; j < micros; ++j) {
      mb.push_back(make_micro(k, j * rows, rows, T, cfg.vocab, doc_lens));
      valid += mb.back().valid;
    }
    P.zero_grad();
    double loss = 0;
    for (auto& b : mb) loss += m.forward_backward(b.input(), 1.f / valid);
    double norm = std::sqrt(cpu_backend().sum_squares(P.grad(), P.total()));
    if (k == 0) log.first_grads.assign(P.grad(), P.grad() + P.total());
    float gs = norm > kClip ? static_cast<float>(kClip / norm) : 1.f;
    opt.step(1e-2, gs);
    log.losses.push_back(loss / valid);
    log.norms.push_back(norm);
  }
  log.final_params.assign(P.data(), P.data() + P.total());
  return log;
}

inline double rel_diff(double a, double b) {
  return std::fabs(a - b) / std::max(1e-30, std::max(std::fabs(a), std::fabs(b)));
}

// A split layout's mapping: the flat index, in the single-process ParamSet (where `ref` is the
// parameter's info), of element e of this rank's parameter `local`.
using GlobalIndex = int64_t (*)(const ParamInfo& local, const ParamInfo& ref, int64_t e);

// Asserts that every local parameter element equals, bit for bit, the single-process element it
// stands for (both initialised with the same seed).
inline void expect_params_match_reference(const ParamSet& P, const ParamSet& ref,
                                          GlobalIndex global_index) {
  for (const ParamInfo& p : P.infos()) {
    const ParamInfo& rp = ref.info(p.name);
    for (int64_t e = 0; e < p.numel; ++e)
      ASSERT_EQ(P.data()[p.offset + e], ref.data()[global_index(p, rp, e)])
          << p.name << " element " << e;
  }
}

// Asserts that this rank's gradients equal the single-process ones (`ref_grads`, laid out as
// `ref`'s parameters) at their global positions, within 1e-5 of the largest reference gradient.
inline void expect_grads_match_reference(const ParamSet& P, const ParamSet& ref,
                                         const std::vector<float>& ref_grads,
                                         GlobalIndex global_index) {
  float gmax = 0;
  for (float g : ref_grads) gmax = std::max(gmax, std::fabs(g));
  for (const ParamInfo& p : P.infos()) {
    const ParamInfo& rp = ref.info(p.name);
    for (int64_t e = 0; e < p.numel; ++e)
      ASSERT_NEAR(P.grad()[p.offset + e], ref_grads[global_index(p, rp, e)], 1e-5 * gmax)
          << p.name << " element " << e;
  }
}

// The data-parallel wrapper of every split run here (small buckets: several per model).
inline parallel::DataParallel parity_ddp(Decoder& m, comm::Communicator& dp, int zero,
                                         comm::Communicator* expert_dp = nullptr) {
  parallel::DataParallelOptions o;
  o.zero = zero;
  o.bucket_elems = 2000;
  return parallel::DataParallel(m, dp, o, parity_adamw(), DType::F32, cpu_backend(), expert_dp);
}

inline std::vector<ModelInput> inputs(const std::vector<MicroBatch>& mb) {
  std::vector<ModelInput> in;
  for (const MicroBatch& m : mb) in.push_back(m.input());
  return in;
}

// One step's forwards and backwards without a pipeline: one micro-batch after another, `ddp`
// reducing the gradients once they are complete. Returns this rank's loss sum.
inline double accumulate_micros(Decoder& m, parallel::DataParallel& ddp,
                                const std::vector<ModelInput>& in, float dloss) {
  ddp.start_step(static_cast<int>(in.size()));
  double loss = 0;
  for (size_t j = 0; j < in.size(); ++j) {
    ddp.start_micro(static_cast<int>(j));
    loss += m.forward_backward(in[j], dloss);
    ddp.finish_micro();
  }
  return loss;
}

// One step's forwards and backwards through a pipeline: the runner accumulates every
// micro-batch, then `ddp` reduces once. Returns the loss summed over the pipeline's stages.
inline double pipeline_step(parallel::PipelineRunner& runner, parallel::DataParallel& ddp,
                            const std::vector<ModelInput>& in, float dloss,
                            comm::Communicator& pp) {
  ddp.start_step(1);
  ddp.start_micro(0);
  const double loss = runner.run(in, dloss);
  ddp.finish_micro();
  return pp.all_reduce_scalar(loss, comm::ReduceOp::Sum);
}

// This rank's part of a step: its loss sum (over the micro-batches it ran) and the step's
// loss-carrying token count over the whole job.
struct RankStep {
  double loss;
  int64_t valid;
};

// Where a layout sums what each rank computed: the loss over `loss_group`, the squared gradient
// norm (each element weighted by `norm_weights` so that it counts once; empty: all 1) over
// `norm_group`.
struct StepSums {
  comm::Communicator& loss_group;
  comm::Communicator& norm_group;
  std::vector<double> norm_weights;
};

// Trains a layout for as many steps as `ref` holds, run_step(k) running step k's forwards and
// backwards, and expects each step's loss and gradient norm within 1e-5 relative of the single
// process's (`label` starts the failure message). check_first_grads, when given, runs after the
// first backward, before the optimizer changes anything.
template <typename RunStep>
void expect_steps_match_reference(const StepLog& ref, parallel::DataParallel& ddp,
                                  const StepSums& sums, RunStep run_step,
                                  const std::string& label = "",
                                  const std::function<void()>& check_first_grads = {}) {
  for (size_t k = 0; k < ref.losses.size(); ++k) {
    RankStep step = run_step(static_cast<int>(k));
    const double loss = sums.loss_group.all_reduce_scalar(step.loss, comm::ReduceOp::Sum);
    const double norm = std::sqrt(sums.norm_group.all_reduce_scalar(
        ddp.grad_sq_local(sums.norm_weights), comm::ReduceOp::Sum));
    if (k == 0 && check_first_grads) {
      ASSERT_NO_FATAL_FAILURE(check_first_grads());
    }
    EXPECT_LT(rel_diff(loss / step.valid, ref.losses[k]), 1e-5)
        << label << "step " << k << ": " << loss / step.valid << " vs " << ref.losses[k];
    EXPECT_LT(rel_diff(norm, ref.norms[k]), 1e-5) << "grad norm, step " << k;
    ddp.step(1e-2, norm > kClip ? static_cast<float>(kClip / norm) : 1.f);
  }
}

// The single process a split layout must reproduce: its run over the global batch of `dp_size`
// data-parallel ranks, and its initial model (the parameters the split ones map to).
struct Reference {
  StepLog log;
  Decoder model;
  Reference(const ModelConfig& cfg, int dp_size)
      : log(reference_run(cfg, kSteps, kMicros * dp_size, kRows, kT)), model(cfg, cpu_backend()) {
    model.params().init(5);
  }
};

// How a split model (TP, EP, ETP) trains under data parallelism.
struct DpTraining {
  comm::Communicator& dp;
  int zero = 0;
  comm::Communicator* expert_dp = nullptr;  // EP: the ranks holding the same experts
  StepSums sums;
};

// The TP, EP and ETP parity check of `m` (split by the layout, initialised with seed 5): its
// initial weights are the single-process ones at their global positions, and trained kSteps
// steps under data parallelism it gives the single-process losses and grad norms, and without
// ZeRO (whose ranks keep only a shard of the reduced gradients) the first step's gradients.
inline void expect_trains_like_reference(const Reference& ref, Decoder& m, const DpTraining& how,
                                         GlobalIndex global_index) {
  ParamSet& P = m.params();
  ASSERT_NO_FATAL_FAILURE(expect_params_match_reference(P, ref.model.params(), global_index));
  parallel::DataParallel ddp = parity_ddp(m, how.dp, how.zero, how.expert_dp);
  std::function<void()> check_first_grads;
  if (how.zero == 0)
    check_first_grads = [&] {
      expect_grads_match_reference(P, ref.model.params(), ref.log.first_grads, global_index);
    };
  const int D = how.dp.size(), dr = how.dp.rank();
  auto run_step = [&](int k) {
    std::vector<MicroBatch> mb = rank_micros(k, kMicros, D, dr, m.config().vocab);
    const int64_t valid = global_valid(mb, how.dp);
    return RankStep{accumulate_micros(m, ddp, inputs(mb), 1.f / valid), valid};
  };
  expect_steps_match_reference(ref.log, ddp, how.sums, run_step, "", check_first_grads);
}

}  // namespace loom::testing_parallel
