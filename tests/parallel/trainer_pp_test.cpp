// `loom train` with pipeline parallelism on real MPI ranks: the trainer with parallel.pp (and
// virtual stages, schedules, first/last stage sizes, DP with ZeRO-1 or ZeRO-3 beside it) must give
// the single-process losses and grad norms on the same global batch, report a per-rank idle
// fraction (the measured bubble), evaluate forward-only through the stages with the
// single-process validation loss, resume bit-identically from its per-rank checkpoints (under
// ZeRO-3 too), and refuse what it cannot do with clear errors.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "mpi_main.h"
#include "parity_util.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

using namespace loom;
using loom::testing_parallel::rel_diff;
using loom::testing_parallel::W;

namespace {

const testing_parallel::TrainerRuns runs{"pp", "a pipelined fox "};

struct PpCase {
  const char* family;
  int pp, vp;
  const char* schedule;
  int zero = 0;
  int first = -1, last = -1;  // stage layer counts (-1 = even)
};

void check_trainer_pp(const PpCase& k) {
  const int D = W().size() / k.pp, A = 4, steps = 10;
  std::string dr = runs.dir("ref");
  auto self = comm::make_self_communicator();
  Trainer ref(runs.config(dr, steps, A * D, k.family),
              self.get());  // one process, same global batch
  std::string d = runs.dir("pp");
  Config c = runs.config(d, steps, A, k.family);
  c.set("parallel.pp", std::to_string(k.pp), "test");
  c.set("parallel.vp", std::to_string(k.vp), "test");
  c.set("parallel.pp_schedule", std::string("\"") + k.schedule + "\"", "test");
  c.set("parallel.zero", std::to_string(k.zero), "test");
  if (k.first >= 0) c.set("parallel.pp_first_stage_layers", std::to_string(k.first), "test");
  if (k.last >= 0) c.set("parallel.pp_last_stage_layers", std::to_string(k.last), "test");
  Trainer t(c);
  ASSERT_NE(t.pipeline(), nullptr);
  EXPECT_EQ(t.groups()->pp().size(), k.pp);
  EXPECT_EQ(t.groups()->dp().size(), D);
  // The rank holds only its own layers' parameters.
  const auto& stage = t.model().pipeline_stage();
  int held = 0;
  for (auto [b, e] : stage.chunks) held += e - b;
  for (int l = 0; l < 4; ++l)
    EXPECT_EQ(t.model().params().has("blocks." + std::to_string(l) + ".norm1.weight"),
              t.model().holds_layer(l));
  EXPECT_LT(held, 4);
  for (int i = 0; i < steps; ++i) {
    StepResult a = ref.train_step(), b = t.train_step();
    EXPECT_LT(rel_diff(b.loss, a.loss), 1e-5)
        << k.schedule << " step " << i << ": " << b.loss << " vs " << a.loss;
    EXPECT_LT(rel_diff(b.grad_norm, a.grad_norm), 1e-5) << "grad norm, step " << i;
    ASSERT_EQ(b.pp_idle.size(), size_t(k.pp));
    for (double f : b.pp_idle) {
      EXPECT_GE(f, 0.0);
      EXPECT_LE(f, 1.0);
    }
  }
  // Activation buffers exist only for the stage's own layers (and logits on the last stage).
  EXPECT_LT(t.model().activation_bytes(), ref.model().activation_bytes());
}

// Evaluation under the pipeline: every `eval_every` steps the validation loss (forward passes
// through the stages) matches one process on the same validation batches on every rank, and
// the training losses and grad norms are bit-identical to the same pipelined run without
// evaluation (evaluating touches no gradient or optimizer state). `eval_batches` = 3 with 2
// micro-batches per step runs the evaluation in two windows (2 + 1). `tp` (with SP) and `cp` put
// tensor and context parallelism beside the pipeline.
void check_pp_eval(const PpCase& k, int eval_batches = 3, int tp = 1, int cp = 1) {
  const int D = W().size() / (k.pp * tp * cp), A = 2, steps = 4, eval_every = 2;
  auto with_eval = [&](Config c) {
    c.set("train.eval_interval", std::to_string(eval_every), "test");
    c.set("train.eval_batches", std::to_string(eval_batches), "test");
    return c;
  };
  auto pipelined = [&](Config c) {
    c.set("parallel.pp", std::to_string(k.pp), "test");
    c.set("parallel.vp", std::to_string(k.vp), "test");
    c.set("parallel.pp_schedule", std::string("\"") + k.schedule + "\"", "test");
    c.set("parallel.zero", std::to_string(k.zero), "test");
    c.set("parallel.tp", std::to_string(tp), "test");
    c.set("parallel.sp", tp > 1 ? "true" : "false", "test");
    c.set("parallel.cp", std::to_string(cp), "test");
    return c;
  };
  auto self = comm::make_self_communicator();
  Trainer ref(with_eval(runs.config(runs.dir("eval_ref"), steps, A * D, k.family)), self.get());
  Trainer t(pipelined(with_eval(runs.config(runs.dir("eval_pp"), steps, A, k.family))));
  Trainer plain(pipelined(runs.config(runs.dir("eval_plain"), steps, A, k.family)));
  ASSERT_NE(t.pipeline(), nullptr);
  for (int i = 0; i < steps; ++i) {
    StepResult a = ref.train_step(), b = t.train_step(), c = plain.train_step();
    EXPECT_EQ(b.loss, c.loss) << k.schedule << " step " << i << ": evaluation changed training";
    EXPECT_EQ(b.grad_norm, c.grad_norm) << "grad norm, step " << i;
    EXPECT_LT(rel_diff(b.loss, a.loss), 1e-5) << k.schedule << " step " << i;
    if ((i + 1) % eval_every != 0) continue;
    const double vr = ref.evaluate(), v = t.evaluate();
    EXPECT_LT(rel_diff(v, vr), 1e-5)
        << k.schedule << " validation after step " << i + 1 << ": " << v << " vs " << vr;
    EXPECT_EQ(W().all_reduce_scalar(v, comm::ReduceOp::Max),
              -W().all_reduce_scalar(-v, comm::ReduceOp::Max))
        << "ranks disagree on the validation loss";
  }
}

}  // namespace

TEST(TrainerPp, EvaluationMatchesOneProcessAndLeavesTrainingUnchanged) {
  check_pp_eval({"tiny", W().size(), 1, "1f1b"});  // tied embedding, pp = world
  check_pp_eval({"tiny-moe", 2, 1, "gpipe"});      // MoE aux losses in the validation loss
  if (W().size() == 2) {
    check_pp_eval({"tiny-llama", 2, 2, "interleaved"}, 4);
    check_pp_eval({"tiny", 1, 2, "interleaved"});  // virtual stages on one pipeline rank, DP2
  }
  if (W().size() == 4) {
    check_pp_eval({"tiny", 2, 1, "1f1b", 1});                 // PP2 x DP2 + ZeRO-1
    check_pp_eval({"tiny", 2, 1, "gpipe"}, 3, 2);             // PP2 x TP2 + SP
    check_pp_eval({"tiny-llama", 2, 1, "1f1b", 1}, 3, 1, 2);  // PP2 x CP2 + ZeRO-1
    check_pp_eval({"tiny", 2, 1, "gpipe", 3});                // PP2 x DP2 + ZeRO-3
  }
}

// Through run(): the validation losses in metrics.jsonl are the one-process run's.
TEST(TrainerPp, RunLogsTheOneProcessValidationLoss) {
  const int steps = 4;
  auto valid_losses = [](const std::string& dir) {
    std::vector<double> v;
    std::istringstream log(read_file(dir + "/run/metrics.jsonl"));
    for (std::string line; std::getline(log, line);) {
      Json j = Json::parse(line);
      if (j.contains("valid_loss")) v.push_back(j.at("valid_loss").as_double());
    }
    return v;
  };
  std::string dr = runs.dir("run_eval_ref"), d = runs.dir("run_eval_pp");
  Config rc = runs.config(dr, steps, 2 * (W().size() / 2), "tiny");
  Config c = runs.config(d, steps, 2, "tiny");
  c.set("parallel.pp", "2", "test");
  for (Config* x : {&rc, &c}) x->set("train.eval_interval", "2", "test");
  auto self = comm::make_self_communicator();
  Trainer(rc, self.get()).run();
  Trainer(c).run();
  if (W().rank() != 0) return;  // rank 0 writes the metrics
  std::vector<double> ref = valid_losses(dr), got = valid_losses(d);
  ASSERT_EQ(ref.size(), 2u);
  ASSERT_EQ(got.size(), ref.size());
  for (size_t i = 0; i < ref.size(); ++i) EXPECT_LT(rel_diff(got[i], ref[i]), 1e-5) << i;
}

TEST(TrainerPp, OneFOneBGpt2TiedMatchesOneProcess) {
  check_trainer_pp({"tiny", W().size(), 1, "1f1b"});
}
TEST(TrainerPp, GpipeLlamaMatchesOneProcess) {
  check_trainer_pp({"tiny-llama", W().size(), 1, "gpipe"});
}
TEST(TrainerPp, InterleavedV2UnevenStagesMatchesOneProcess) {
  if (W().size() != 2) GTEST_SKIP() << "needs 2 ranks";
  // 4 layers over 4 virtual stages; then 1F1B with a 1-layer first and 3-layer last stage.
  check_trainer_pp({"tiny", 2, 2, "interleaved"});
  check_trainer_pp({"tiny-llama", 2, 1, "1f1b", 0, 1, 3});
}
TEST(TrainerPp, Pp2Dp2Zero1MatchesOneProcess) {
  if (W().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_trainer_pp({"tiny", 2, 1, "1f1b", 1});
}

// ZeRO-3 under the pipeline: each DP rank of a stage keeps a shard of the stage's blocks,
// gathered around each use (tied embeddings on the first and last stage, Llama untied; 1F1B,
// GPipe, interleaved v=2).
TEST(TrainerPp, Pp2Dp2Zero3MatchesOneProcess) {
  if (W().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_trainer_pp({"tiny", 2, 1, "1f1b", 3});
  check_trainer_pp({"tiny-llama", 2, 1, "gpipe", 3});
  check_trainer_pp({"tiny", 2, 2, "interleaved", 3});
}

TEST(TrainerPp, Zero3ResumeIsBitIdentical) {
  std::string d1 = runs.dir("resume_z3_a"), d2 = runs.dir("resume_z3_b");
  auto cfg = [&](const std::string& d, const char* schedule) {
    Config c = runs.config(d, 6, 2, "tiny");
    c.set("parallel.pp", "2", "test");
    c.set("parallel.zero", "3", "test");
    c.set("parallel.pp_schedule", std::string("\"") + schedule + "\"", "test");
    return c;
  };
  testing_parallel::expect_resume_bit_identical(cfg(d1, "1f1b"), cfg(d2, "1f1b"), cfg(d2, "gpipe"),
                                                "ZeRO-3 ");
}

TEST(TrainerPp, ResumeIsBitIdenticalUnderTheSameLayout) {
  const int p = W().size() >= 4 ? 2 : W().size(), zero = W().size() >= 4 ? 1 : 0;
  std::string d1 = runs.dir("resume_a"), d2 = runs.dir("resume_b");
  auto cfg = [&](const std::string& d, const char* schedule) {
    Config c = runs.config(d, 6, 2, "tiny");
    c.set("parallel.pp", std::to_string(p), "test");
    c.set("parallel.zero", std::to_string(zero), "test");
    c.set("parallel.pp_schedule", std::string("\"") + schedule + "\"", "test");
    return c;
  };
  // The schedule is not part of the state: 1F1B's checkpoint resumes under GPipe.
  testing_parallel::expect_resume_bit_identical(cfg(d1, "1f1b"), cfg(d2, "1f1b"), cfg(d2, "gpipe"));
  // Another stage split is another layout: refused, naming both.
  if (p == 2) {
    Config c = cfg(d2, "1f1b");
    c.set("parallel.pp_first_stage_layers", "1", "test");
    c.set("parallel.pp_last_stage_layers", "3", "test");
    try {
      Trainer t(c);
      ADD_FAILURE() << "resumed under another stage split";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("layout"), std::string::npos) << e.what();
    }
  }
}

TEST(TrainerPp, BadPipelineSettingsAreClearErrors) {
  std::string d = runs.dir("bad");
  auto expect_error = [&](Config c, const std::string& what) {
    try {
      Trainer t(c);
      ADD_FAILURE() << "accepted; expected an error mentioning '" << what << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  Config c = runs.config(d, 2, 3, "tiny");
  c.set("parallel.pp", std::to_string(W().size()), "test");
  c.set("model.n_layer", "3", "test");
  expect_error(c, "do not split evenly");  // 3 layers over 2 or 4 stages
  Config v = runs.config(d, 2, 3, "tiny");
  v.set("parallel.pp", "2", "test");
  v.set("parallel.vp", "2", "test");
  v.set("parallel.pp_schedule", "\"1f1b\"", "test");
  expect_error(v, "interleaved");
  Config m = runs.config(d, 2, 3, "tiny");  // 3 micro-batches do not fit interleaved p=2
  m.set("parallel.pp", "2", "test");
  m.set("parallel.vp", "2", "test");
  if (W().size() == 2) expect_error(m, "3");
}

LOOM_MPI_TEST_MAIN()
