// The trainer on N real MPI ranks: `loom train`'s code path with [parallel] settings must give
// the single-process losses (same global batch), resume bit-identically from its per-rank
// checkpoints, and reject layouts that do not fit the world.
#include <gtest/gtest.h>

#include <cstring>
#include <tuple>

#include "ckpt/checkpoint.h"
#include "ckpt/consolidate.h"
#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "core/error.h"
#include "core/fs.h"
#include "data/indexed_dataset.h"
#include "mpi_main.h"
#include "parallel/data_parallel.h"
#include "parity_util.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

using namespace loom;
using loom::testing_parallel::job_tag;
using loom::testing_parallel::rel_diff;
using loom::testing_parallel::W;

namespace {

const testing_parallel::TrainerRuns runs{"dp", "a distributed fox "};

// A 2-layer GPT-2 at lr 1e-2: the runs here are for data parallelism, not the model.
Config config(const std::string& dir, int steps, int grad_accum, int zero) {
  Config c = testing_parallel::tiny_run_config(dir, runs.line_start, 2, "1e-2", steps, grad_accum);
  c.set("model.preset", "\"tiny\"", "test");
  c.set("parallel.zero", std::to_string(zero), "test");
  return c;
}

std::vector<double> reference_losses(int steps, int grad_accum) {
  std::string d = runs.dir("ref");
  auto self = comm::make_self_communicator();
  Config c = config(d, steps, grad_accum, 0);
  Trainer t(c, self.get());
  std::vector<double> out;
  for (int i = 0; i < steps; ++i) out.push_back(t.train_step().loss);
  return out;
}

void check_trainer_parity(int zero, int tp = 1, bool sp = false) {
  const int D = W().size() / tp, A = 2, steps = 10;
  auto ref = reference_losses(steps, A * D);  // one process, the same global batch
  std::string d = runs.dir("z" + std::to_string(zero));
  Config c = config(d, steps, A, zero);
  c.set("parallel.tp", std::to_string(tp), "test");
  c.set("parallel.sp", sp ? "true" : "false", "test");
  Trainer t(c);
  ASSERT_TRUE(t.distributed());
  EXPECT_EQ(t.groups()->dp().size(), D);
  for (int i = 0; i < steps; ++i) {
    double loss = t.train_step().loss;
    EXPECT_LT(rel_diff(loss, ref[i]), 1e-5) << "step " << i << ": " << loss << " vs " << ref[i];
  }
  EXPECT_LT(ref.back(), ref.front());
}

// A MoE model (4 experts, top-2, dropless) with its experts split over parallel.ep ranks.
// With tp > 1, the dense part is tensor-parallel and the experts are split over etp ranks of
// each TP group (parallel.etp; 1 = replicated).
void moe(Config& c) {
  c.set("model.n_experts", "4", "test");
  c.set("model.aux_loss_coeff", "0.02", "test");
}

void check_trainer_moe(int ep, int zero, int tp = 1, int etp = 1) {
  const int D = W().size() / tp, A = 2, steps = 10;
  std::string dr = runs.dir("moe_ref");
  auto self = comm::make_self_communicator();
  Config rc = config(dr, steps, A * D, 0);
  moe(rc);
  Trainer ref(rc, self.get());
  std::string d = runs.dir("moe_ep" + std::to_string(ep));
  Config c = config(d, steps, A, zero);
  moe(c);
  c.set("parallel.ep", std::to_string(ep), "test");
  c.set("parallel.tp", std::to_string(tp), "test");
  c.set("parallel.etp", std::to_string(etp), "test");
  Trainer t(c);
  EXPECT_EQ(t.groups()->ep().size(), ep);
  EXPECT_EQ(t.model().expert_parallel().size, ep);
  EXPECT_EQ(t.model().expert_parallel().tp_size, etp);
  for (int i = 0; i < steps; ++i) {
    StepResult a = ref.train_step(), b = t.train_step();
    EXPECT_LT(rel_diff(b.loss, a.loss), 1e-5) << "step " << i << ": " << b.loss << " vs " << a.loss;
    EXPECT_LT(rel_diff(b.aux_loss, a.aux_loss), 1e-5) << "aux loss, step " << i;
    EXPECT_LT(rel_diff(b.grad_norm, a.grad_norm), 1e-5) << "grad norm, step " << i;
  }
}

// `loom ckpt consolidate`: a distributed run's per-rank checkpoints, placed into one one-process
// checkpoint, hold exactly the weights the ranks hold, and a one-process trainer resumed from it
// continues with the distributed run's losses (its global batch: grad_accum * dp).
struct ConsolidateCase {
  int zero, pp, ep;
  std::string precision;
  int cp = 1, tp = 1;
  bool sp = false;
};

std::string case_label(const ConsolidateCase& k) {
  return cat("zero=", k.zero, " pp=", k.pp, " ep=", k.ep, " cp=", k.cp, " tp=", k.tp, " sp=", k.sp,
             " ", k.precision, ": ");
}

// Where element `i` of a rank's local parameter sits in the whole tensor, from the shard's
// ParamInfo as the model describes it: a row shard (TP rows, or EP experts) puts local row r at
// global row global_index[r]; a column shard puts its columns from global_index[0].
int64_t global_position(const ParamInfo& p, int64_t i) {
  if (!p.sharded()) return i;
  const int64_t cols = p.numel / p.shape[0], row = i / cols, col = i % cols;
  if (p.shard_dim == 0) return p.global_index[row] * cols + col;
  return row * p.global_shape[1] + p.global_index[0] + col;
}

// The consolidated tensor `name` (model, or optimizer state) holds t's bits where `param`'s local
// elements [offset, offset + t.numel()) go.
bool same_bits(const ckpt::SafetensorsReader& f, const std::string& name, const ParamInfo& param,
               int64_t offset, const Tensor& t) {
  if (!f.contains(name)) return false;
  Tensor whole = f.view(name);
  if (whole.numel() != (param.sharded() ? numel_of(param.global_shape) : param.numel)) return false;
  for (int64_t i = 0; i < t.numel(); ++i)
    if (std::memcmp(whole.data<float>() + global_position(param, offset + i), t.data<float>() + i,
                    sizeof(float)) != 0)
      return false;
  return true;
}

// This rank's weights against the consolidated checkpoint, bit for bit: its authoritative slices
// (fp32 master slices where the policy keeps master weights) and, below ZeRO-3, the whole
// (all-gathered) parameters its model computes with.
void expect_rank_weights_in(Trainer& t, const ckpt::Checkpoint& one, const std::string& label) {
  const ParamSet& params = t.model().params();
  const bool master = t.precision().compute != DType::F32 && t.data_parallel()->zero() >= 1;
  for (const auto& sl : t.data_parallel()->param_slices())
    EXPECT_TRUE(same_bits(master ? one.optim() : one.model(), (master ? "master." : "") + sl.name,
                          params.info(sl.name), sl.offset, sl.tensor))
        << label << "slice of " << sl.name << " at " << sl.offset << " on rank " << W().rank();
  if (t.data_parallel()->zero() == 3) return;  // the parameters are released between steps
  // (host_values: the bf16 policy's 2-byte weights are widened from their bf16 copy.)
  for (const auto& [name, w] : t.model().params().host_values())
    EXPECT_TRUE(same_bits(one.model(), name, params.info(name), 0, w))
        << label << name << " on rank " << W().rank();
}

// The directory every rank shares: emptied by rank 0 first, and removed by rank 0 once every
// rank is done with it, whether the checks passed or not.
struct SharedScratch {
  std::string path;
  explicit SharedScratch(const std::string& name)
      : path(testing::TempDir() + "/loom_" + name + "_" + job_tag()) {
    if (W().rank() == 0) remove_all(path);
    W().barrier();
  }
  ~SharedScratch() {
    W().barrier();
    if (W().rank() == 0) remove_all(path);
  }
};

void check_consolidate(const ConsolidateCase& k) {
  const int A = 2, half = 3, steps = 6, D = W().size() / (k.pp * k.cp * k.tp);
  const std::string label = case_label(k);
  SharedScratch scratch("dp_consolidate");
  const std::string& shared = scratch.path;
  auto adapt = [&](Config& c) {
    c.set("precision.policy", "\"" + k.precision + "\"", "test");
    if (k.ep > 1) moe(c);
  };
  Config c = config(runs.dir("consolidate"), steps, A, k.zero);
  adapt(c);
  c.set("parallel.pp", std::to_string(k.pp), "test");
  c.set("parallel.ep", std::to_string(k.ep), "test");
  c.set("parallel.cp", std::to_string(k.cp), "test");
  c.set("parallel.tp", std::to_string(k.tp), "test");
  c.set("parallel.sp", k.sp ? "true" : "false", "test");
  c.set("train.out_dir", "\"" + shared + "/run\"", "test");
  Trainer t(c);
  for (int i = 0; i < half; ++i) t.train_step();
  t.save_checkpoint();
  int64_t ok = 1;
  if (W().rank() == 0) {
    try {
      ckpt::ConsolidateResult r = ckpt::consolidate({shared + "/run", shared + "/one"});
      EXPECT_EQ(r.step, half) << label;
      EXPECT_EQ(r.ranks, W().size()) << label;
      EXPECT_EQ(r.replica_mismatches, 0) << label;
    } catch (const Error& e) {
      ADD_FAILURE() << label << e.what();
      ok = 0;
    }
  }
  if (W().all_reduce_scalar(-ok, comm::ReduceOp::Max) == 0) return;  // some rank failed
  expect_rank_weights_in(t, ckpt::Checkpoint(shared + "/one"), label);
  std::vector<double> distributed;
  for (int i = half; i < steps; ++i) distributed.push_back(t.train_step().loss);
  if (W().rank() == 0) {
    auto self = comm::make_self_communicator();
    Config oc = config(runs.dir("consolidate_one"), steps, A * D, 0);
    adapt(oc);
    Trainer one(oc, self.get());
    EXPECT_TRUE(one.resume_from(shared + "/one")) << label;
    EXPECT_EQ(one.step(), half) << label;
    // The parity tolerance of each policy against one process (MatchesOneProcess tests).
    const double tol = k.precision == "fp32" ? 1e-5 : 1e-2;
    for (int i = half; i < steps; ++i) {
      double loss = one.train_step().loss, want = distributed[i - half];
      EXPECT_LT(rel_diff(loss, want), tol)
          << label << "step " << i << ": " << loss << " vs " << want;
    }
  }
  W().barrier();
}

// train.init_from: a run of layout B started from the one-process checkpoint consolidated from
// layout A's run holds the consolidated tensors bit for bit and continues with A's losses (the
// same global batch: B's grad_accum is A's times A's dp over B's).
struct Layout {
  int zero, tp = 1, pp = 1;
  bool sp = false;
  int dp() const { return W().size() / (tp * pp); }
};

std::string layout_label(const Layout& l) {
  return cat("zero=", l.zero, " tp=", l.tp, " pp=", l.pp, " sp=", l.sp, " dp=", l.dp());
}

Config layout_config(const std::string& dir, const Layout& l, int grad_accum,
                     const std::string& precision, const std::string& out) {
  Config c = config(dir, 6, grad_accum, l.zero);
  c.set("precision.policy", "\"" + precision + "\"", "test");
  c.set("parallel.tp", std::to_string(l.tp), "test");
  c.set("parallel.pp", std::to_string(l.pp), "test");
  c.set("parallel.sp", l.sp ? "true" : "false", "test");
  c.set("train.out_dir", "\"" + out + "\"", "test");
  return c;
}

void check_init_from(const Layout& a, const Layout& b, const std::string& precision = "fp32") {
  const int A = 2, half = 3, steps = 6;
  const std::string label = cat(layout_label(a), " -> ", layout_label(b), " ", precision, ": ");
  SharedScratch scratch("dp_init_from");
  const std::string& shared = scratch.path;
  std::vector<double> continued;  // A's losses after the checkpoint
  {
    Trainer ta(layout_config(runs.dir("init_from_a"), a, A, precision, shared + "/a"));
    for (int i = 0; i < half; ++i) ta.train_step();
    ta.save_checkpoint();
    int64_t ok = 1;
    if (W().rank() == 0) {
      try {
        ckpt::consolidate({shared + "/a", shared + "/one"});
      } catch (const Error& e) {
        ADD_FAILURE() << label << e.what();
        ok = 0;
      }
    }
    if (W().all_reduce_scalar(-ok, comm::ReduceOp::Max) == 0) return;
    for (int i = half; i < steps; ++i) continued.push_back(ta.train_step().loss);
  }
  ASSERT_EQ(A * a.dp() % b.dp(), 0) << label;
  Config cb =
      layout_config(runs.dir("init_from_b"), b, A * a.dp() / b.dp(), precision, shared + "/b");
  cb.set("train.init_from", "\"" + shared + "/one\"", "test");
  Trainer tb(cb);
  EXPECT_EQ(tb.step(), half) << label;
  EXPECT_EQ(tb.data_parallel()->steps_taken(), half) << label;
  expect_rank_weights_in(tb, ckpt::Checkpoint(shared + "/one"), label);
  const double tol = precision == "fp32" ? 1e-5 : 1e-2;
  for (int i = half; i < steps; ++i) {
    const double loss = tb.train_step().loss, want = continued[i - half];
    EXPECT_LT(rel_diff(loss, want), tol) << label << "step " << i << ": " << loss << " vs " << want;
  }
  W().barrier();
}

}  // namespace

TEST(TrainerDp, ConsolidatedCheckpointHoldsTheRunsWeightsAndContinuesInOneProcess) {
  const int world = W().size();
  for (const ConsolidateCase& k : std::vector<ConsolidateCase>{{0, 1, 1, "bf16"},
                                                               {1, 1, 1, "fp32"},
                                                               {3, 1, 1, "fp32"},
                                                               {1, 1, 1, "bf16"},
                                                               {3, 1, 1, "bf16"},
                                                               {1, 2, 1, "fp32"},
                                                               {3, 2, 1, "fp32"},
                                                               {1, 1, world, "fp32"},
                                                               {3, 1, world, "fp32"},
                                                               {1, 1, 1, "fp32", 2},
                                                               // Tensor parallelism (with
                                                               // sequence parallelism, ZeRO
                                                               // over the DP ranks of 4).
                                                               {0, 1, 1, "fp32", 1, 2},
                                                               {1, 1, 1, "fp32", 1, 2, true},
                                                               {3, 1, 1, "fp32", 1, 2},
                                                               {1, 1, 1, "bf16", 1, 2, true}})
    check_consolidate(k);
  if (world == 4) {
    check_consolidate({1, 2, 1, "fp32", 1, 2, true});  // TP2 x PP2
    check_consolidate({1, 1, 2, "fp32", 1, 2});        // TP2 x EP2, experts replicated over TP
  }
}

TEST(TrainerDp, InitFromConsolidatedCheckpointContinuesUnderAnotherLayout) {
  if (W().size() == 2) {
    check_init_from({1}, {0, 2});                   // DP2 ZeRO-1 -> TP2
    check_init_from({0, 2, 1, true}, {3});          // TP2 with SP -> DP2 ZeRO-3
    check_init_from({3}, {1, 1, 2});                // DP2 ZeRO-3 -> PP2
    check_init_from({1}, {0, 2, 1, true}, "bf16");  // master weights -> TP2 with SP
  } else if (W().size() == 4) {
    check_init_from({1, 2}, {3});           // TP2 x DP2 -> DP4 ZeRO-3
    check_init_from({2}, {1, 2, 2, true});  // DP4 ZeRO-2 -> TP2 x PP2 with SP
  }
}

TEST(TrainerDp, InitFromRefusesAnotherGlobalBatch) {
  SharedScratch scratch("dp_init_from_batch");
  const std::string& shared = scratch.path;
  const Layout dp{1};
  {
    Trainer ta(layout_config(runs.dir("init_batch_a"), dp, 1, "fp32", shared + "/a"));
    ta.train_step();
    ta.save_checkpoint();
    if (W().rank() == 0) ckpt::consolidate({shared + "/a", shared + "/one"});
    W().barrier();
  }
  Config cb = layout_config(runs.dir("init_batch_b"), dp, 2, "fp32", shared + "/b");
  cb.set("train.init_from", "\"" + shared + "/one\"", "test");
  try {
    Trainer tb(cb);
    ADD_FAILURE() << "started from a checkpoint of another global batch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("global batch"), std::string::npos) << e.what();
  }
  W().barrier();
}

TEST(TrainerDp, ConsolidateRefusesExpertTensorParallelCheckpoints) {
  SharedScratch scratch("dp_consolidate_etp");
  const std::string& shared = scratch.path;
  Config c = config(runs.dir("consolidate_etp"), 2, 1, 1);
  moe(c);
  c.set("parallel.tp", "2", "test");
  c.set("parallel.etp", "2", "test");
  c.set("train.out_dir", "\"" + shared + "/run\"", "test");
  {
    Trainer t(c);
    t.train_step();
    t.save_checkpoint();
  }
  if (W().rank() == 0) {
    try {
      ckpt::consolidate({shared + "/run", shared + "/one"});
      ADD_FAILURE() << "consolidated an expert-tensor-parallel checkpoint";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("expert tensor parallelism"), std::string::npos)
          << e.what();
    }
    EXPECT_FALSE(file_exists(shared + "/one")) << "a refused consolidation wrote output";
  }
  W().barrier();
}

TEST(TrainerDp, MoeExpertParallelMatchesOneProcess) {
  check_trainer_moe(W().size(), 0);
}
TEST(TrainerDp, MoeExpertParallelHalfZero1MatchesOneProcess) {
  if (W().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_trainer_moe(2, 1);  // EP2 x DP2: experts reduced over the expert-data-parallel pairs
}

TEST(TrainerDp, MoeTensorParallelExpertTensorParallelMatchesOneProcess) {
  // TP2 with the experts split over the TP pair (etp = 2); on 4 ranks also EP2 over the DP pair.
  check_trainer_moe(W().size() / 2, 0, 2, 2);
}
TEST(TrainerDp, MoeTensorParallelReplicatedExpertsMatchesOneProcess) {
  check_trainer_moe(1, 1, 2, 1);  // etp = 1: every TP rank computes the experts whole
}

// ZeRO-3 of a MoE model: the experts gathered with their block, sharded over DP (ep = 1) or
// over the expert-data-parallel group (ep > 1); the engine draws the initial weights.
TEST(TrainerDp, MoeZero3MatchesOneProcess) {
  check_trainer_moe(1, 3);
  check_trainer_moe(2, 3);  // on 4 ranks EP2 x DP2: the experts sharded over the edp pairs
}

TEST(TrainerDp, MoeZero3ResumeIsBitIdentical) {
  for (int ep : {1, 2}) {
    std::string d1 = runs.dir("moe_resume_a"), d2 = runs.dir("moe_resume_b");
    auto cfg = [&](const std::string& d) {
      Config c = config(d, 6, 2, 3);
      moe(c);
      c.set("parallel.ep", std::to_string(ep), "test");
      return c;
    };
    testing_parallel::expect_resume_bit_identical(cfg(d1), cfg(d2), cfg(d2),
                                                  "MoE zero 3, ep " + std::to_string(ep) + " ");
  }
}

// Token files (data.source = "tokens"): each DP rank's loader reads only its own rows, and the
// run sees the data of the one-process run with D times the accumulation.
TEST(TrainerDp, TokenFilesMatchOneProcess) {
  const int D = W().size(), A = 2, steps = 8;
  auto tokens_config = [&](const std::string& d, int grad_accum) {
    Config c = config(d, steps, grad_accum, 1);
    // The corpus as byte tokens, one document per line.
    data::IndexedDatasetWriter w(d + "/tok", data::TokenDType::Int32);
    std::vector<int32_t> doc;
    for (char ch : read_file(c.get_string("data.paths", ""))) {  // the text source's key: read here
      doc.push_back(static_cast<unsigned char>(ch));
      if (ch == '\n') {
        w.add_document(doc);
        doc.clear();
      }
    }
    w.finalize();
    c.set("data.source", "\"tokens\"", "test");
    c.set("data.prefixes", "\"" + d + "/tok\"", "test");
    return c;
  };
  auto self = comm::make_self_communicator();
  std::string dr = runs.dir("tok_ref"), d = runs.dir("tok");
  Trainer ref(tokens_config(dr, A * D), self.get());
  Trainer t(tokens_config(d, A));
  for (int i = 0; i < steps; ++i) {
    double a = ref.train_step().loss, b = t.train_step().loss;
    EXPECT_LT(rel_diff(b, a), 1e-5) << "step " << i << ": " << b << " vs " << a;
  }
}

TEST(TrainerDp, Zero0MatchesOneProcess) {
  check_trainer_parity(0);
}
TEST(TrainerDp, Zero1MatchesOneProcess) {
  check_trainer_parity(1);
}
TEST(TrainerDp, Zero2MatchesOneProcess) {
  check_trainer_parity(2);
}
TEST(TrainerDp, Zero3MatchesOneProcess) {
  check_trainer_parity(3);
}
TEST(TrainerDp, Tp2MatchesOneProcess) {
  check_trainer_parity(0, 2);
}
TEST(TrainerDp, Tp2SequenceParallelZero1MatchesOneProcess) {
  check_trainer_parity(1, 2, true);
}

// train.freeze under data (and tensor) parallelism: the same losses as one process with the
// same parameters frozen, and the frozen parameters never move (under ZeRO-3 checked on the
// slices this rank keeps).
void check_freeze(int zero, int tp = 1) {
  const int D = W().size() / tp, A = 2, steps = 6;
  const std::string frozen = "\"embed., blocks.0.attn\"";
  auto self = comm::make_self_communicator();
  Config rc = config(runs.dir("freeze_ref"), steps, A * D, 0);
  rc.set("train.freeze", frozen, "test");
  // The reference first, whole: interleaved with the ranks' collectives, oversubscribed ranks
  // would poll while others compute it.
  std::vector<double> ref;
  {
    Trainer one(rc, self.get());
    for (int i = 0; i < steps; ++i) ref.push_back(one.train_step().loss);
  }
  Config c = config(runs.dir("freeze_z" + std::to_string(zero)), steps, A, zero);
  c.set("parallel.tp", std::to_string(tp), "test");
  c.set("train.freeze", frozen, "test");
  Trainer t(c);
  ASSERT_EQ(t.groups()->dp().size(), D);
  // This rank's slices of the frozen parameters, and of the others.
  auto values = [](Trainer& tr, bool frozen_ones) {
    std::vector<std::pair<std::string, std::vector<float>>> out;
    for (const StateSlice& s : tr.data_parallel()->param_slices()) {
      const bool f = s.name.rfind("embed.", 0) == 0 || s.name.rfind("blocks.0.attn", 0) == 0;
      if (f == frozen_ones)
        out.push_back({s.name, std::vector<float>(s.tensor.data<float>(),
                                                  s.tensor.data<float>() + s.tensor.numel())});
    }
    return out;
  };
  const auto frozen_before = values(t, true), others_before = values(t, false);
  for (int i = 0; i < steps; ++i) {
    const double b = t.train_step().loss;
    EXPECT_LT(rel_diff(b, ref[size_t(i)]), 1e-5)
        << "zero " << zero << " tp " << tp << " step " << i;
  }
  EXPECT_EQ(values(t, true), frozen_before) << "zero " << zero << " tp " << tp;
  // The trained parameters moved (where this rank keeps any).
  if (!others_before.empty()) {
    EXPECT_NE(values(t, false), others_before);
  }
}

TEST(TrainerDp, FreezeMatchesOneProcess) {
  if (W().size() == 2) {
    check_freeze(0);
    check_freeze(1);
    check_freeze(3);
  } else {  // (4 ranks oversubscribed are slow: one TP x DP layout)
    check_freeze(1, 2);
  }
}

// Reduced precision: bf16 weights re-rounded from a sharded fp32 master (ZeRO-1), and fp16
// with dynamic loss scaling (the overflow decision is global). A gradient summed in another
// order can flip a bf16/fp16 rounding, so the tolerance is the format's, not fp32's.
TEST(TrainerDp, ReducedPrecisionPoliciesMatchOneProcess) {
  for (const char* policy : {"bf16", "fp16"}) {
    const int D = W().size(), A = 2, steps = 6;
    std::string dr = runs.dir("prec_ref"), dd = runs.dir("prec_dp");
    auto self = comm::make_self_communicator();
    Config rc = config(dr, steps, A * D, 0);
    rc.set("precision.policy", std::string("\"") + policy + "\"", "test");
    Trainer ref(rc, self.get());
    Config c = config(dd, steps, A, 1);
    c.set("precision.policy", std::string("\"") + policy + "\"", "test");
    Trainer t(c);
    for (int i = 0; i < steps; ++i) {
      double a = ref.train_step().loss, b = t.train_step().loss;
      EXPECT_LT(rel_diff(a, b), 1e-2) << policy << " step " << i << ": " << b << " vs " << a;
    }
  }
}

// ZeRO-1/2 under the bf16 policy's 2-byte weights gather the bf16 copy: 2 bytes per element on
// the wire (DataParallel::param_gather_wire_bytes; 4 if the gather went back to fp32), and the
// losses, gradient norms, bf16 weights and their widened values equal ZeRO-0's bit for bit
// (ZeRO-0 all-gathers nothing). Two ranks and one micro-batch per step: a two-term gradient
// sum has one value whichever collective takes it (ZeRO-2 reduces each micro-batch, so with
// accumulation its sums would group the terms differently).
TEST(TrainerDp, Bf16GatherOfZero12EqualsZero0BitForBit) {
  if (W().size() != 2) GTEST_SKIP() << "bit identity with ZeRO-0 needs a two-rank sum";
  const int steps = 3;
  std::vector<StepResult> ref;
  std::vector<uint16_t> ref_bits;
  std::vector<float> ref_values;
  for (int zero : {0, 1, 2}) {
    Config c = config(runs.dir("bf16_gather_z" + std::to_string(zero)), steps, 1, zero);
    c.set("precision.policy", "\"bf16\"", "test");
    Trainer t(c);
    const ParamSet& P = t.model().params();
    if (!P.any_fp32_dropped()) GTEST_SKIP() << "no AVX512-BF16 here: no 2-byte weights";
    parallel::DataParallel& dp = *t.data_parallel();
    const int64_t before = dp.param_gather_wire_bytes();
    std::vector<StepResult> got;
    for (int s = 0; s < steps; ++s) got.push_back(t.train_step());
    const int64_t bytes = dp.param_gather_wire_bytes() - before;
    const std::vector<uint16_t> bits(P.bf16_data(), P.bf16_data() + P.total());
    std::vector<float> values(size_t(P.total()));
    P.read_values(0, P.total(), values.data());
    if (zero == 0) {
      EXPECT_EQ(bytes, 0);
      ref = got;
      ref_bits = bits;
      ref_values = values;
      continue;
    }
    // One gather of the whole buffer per step; this rank sends the elements it does not own.
    const int64_t others = P.total() - (dp.shard_end() - dp.shard_begin());
    ASSERT_GT(others, 0);
    EXPECT_EQ(bytes, int64_t(steps) * 2 * others) << "ZeRO-" << zero;
    for (int s = 0; s < steps; ++s) {
      EXPECT_EQ(got[s].loss, ref[s].loss) << "ZeRO-" << zero << " step " << s;
      EXPECT_EQ(got[s].grad_norm, ref[s].grad_norm) << "ZeRO-" << zero << " step " << s;
    }
    EXPECT_EQ(0, std::memcmp(bits.data(), ref_bits.data(), 2 * bits.size())) << "ZeRO-" << zero;
    EXPECT_EQ(0, std::memcmp(values.data(), ref_values.data(), 4 * values.size())) << zero;
  }
}

TEST(TrainerDp, ResumeIsBitIdenticalUnderTheSameLayout) {
  // (zero, tp, sp): DP layouts, and tensor + sequence parallel with ZeRO-1.
  for (auto [zero, tp, sp] :
       {std::tuple{0, 1, false}, {1, 1, false}, {3, 1, false}, {1, 2, true}}) {
    std::string d1 = runs.dir("resume_a"), d2 = runs.dir("resume_b");
    auto cfg = [&](const std::string& d, int z) {
      Config c = config(d, 6, 2, z);
      c.set("parallel.tp", std::to_string(tp), "test");
      c.set("parallel.sp", sp ? "true" : "false", "test");
      return c;
    };
    testing_parallel::expect_resume_bit_identical(cfg(d1, zero), cfg(d2, zero), cfg(d2, zero),
                                                  "zero " + std::to_string(zero) + " ");
    // Another layout's checkpoint is refused with a message naming both layouts.
    if (zero == 1 && tp == 1) {
      try {
        Trainer t(cfg(d2, 2));
        ADD_FAILURE() << "resumed a ZeRO-1 checkpoint under ZeRO-2";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("layout"), std::string::npos) << e.what();
      }
    }
  }
}

TEST(TrainerDp, LayoutsThatDoNotFitTheWorldAreClearErrors) {
  std::string d = runs.dir("bad");
  Config c = config(d, 2, 1, 0);
  c.set("parallel.tp", "3", "test");
  try {
    Trainer t(c);
    ADD_FAILURE() << "tp=3 accepted on " << W().size() << " ranks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not divisible by tp*cp*pp"), std::string::npos)
        << e.what();
  }
  Config z = config(d, 2, 1, 0);
  z.set("parallel.zero", "4", "test");
  EXPECT_THROW(Trainer t(z), Error);
}

LOOM_MPI_TEST_MAIN()
