// `loom train` with context parallelism on real MPI ranks: the trainer with parallel.cp (ring
// attention, sequences split with causal load balancing, CP ranks joining DP for the gradient
// reduction), alone and with DP + ZeRO-1, must give the single-process losses and grad norms on
// the same global batch for 10 steps (MoE models too, alone and with EP), and resume
// bit-identically from its checkpoints.
#include <gtest/gtest.h>

#include <string>

#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "core/error.h"
#include "core/fs.h"
#include "mpi_main.h"
#include "parity_util.h"
#include "train/trainer.h"
#include "trainer_fixture.h"

using namespace loom;
using loom::testing_parallel::rel_diff;
using loom::testing_parallel::W;

namespace {

const testing_parallel::TrainerRuns runs{"cp", "a contextual fox "};

void check_trainer_cp(const char* family, int cp, int zero, int tp = 1, bool sp = false, int ep = 1,
                      int pp = 1, int vp = 1) {
  const int D = W().size() / (cp * tp * pp), A = 2 * pp, steps = 10;
  std::string dr = runs.dir("ref");
  auto self = comm::make_self_communicator();
  Trainer ref(runs.config(dr, steps, A * D, family), self.get());  // one process, same global batch
  std::string d = runs.dir("cp");
  Config c = runs.config(d, steps, A, family);
  c.set("parallel.cp", std::to_string(cp), "test");
  c.set("parallel.tp", std::to_string(tp), "test");
  c.set("parallel.sp", sp ? "true" : "false", "test");
  c.set("parallel.zero", std::to_string(zero), "test");
  c.set("parallel.ep", std::to_string(ep), "test");
  c.set("parallel.pp", std::to_string(pp), "test");
  if (vp > 1) {
    c.set("parallel.vp", std::to_string(vp), "test");
    c.set("parallel.pp_schedule", "\"interleaved\"", "test");
  }
  Trainer t(c);
  EXPECT_EQ(t.groups()->cp().size(), cp);
  EXPECT_EQ(t.model().context_parallel().size, cp);
  EXPECT_EQ(t.groups()->pp().size(), pp);
  for (int i = 0; i < steps; ++i) {
    StepResult a = ref.train_step(), b = t.train_step();
    EXPECT_LT(rel_diff(b.loss, a.loss), 1e-5)
        << "cp " << cp << " step " << i << ": " << b.loss << " vs " << a.loss;
    EXPECT_LT(rel_diff(b.grad_norm, a.grad_norm), 1e-5) << "grad norm, step " << i;
    if (a.aux_loss > 0) {  // MoE: the aux loss is the whole micro-batch's on every layout
      EXPECT_LT(rel_diff(b.aux_loss, a.aux_loss), 1e-5) << "aux loss, step " << i;
    }
  }
}

}  // namespace

TEST(TrainerCp, CpWorldGpt2MatchesOneProcess) {
  check_trainer_cp("tiny", W().size(), 0);
}
TEST(TrainerCp, CpWorldLlamaZero1MatchesOneProcess) {
  check_trainer_cp("tiny-llama", W().size(), 1);
}
TEST(TrainerCp, Cp2Dp2Zero1MatchesOneProcess) {
  if (W().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_trainer_cp("tiny-llama", 2, 1);
}

// MoE under CP: the aux loss's statistics summed over the CP group; with EP the experts'
// gradients reduced over edp x cp.
TEST(TrainerCp, CpWorldMoeMatchesOneProcess) {
  check_trainer_cp("tiny-moe", W().size(), 0);
}
TEST(TrainerCp, Cp2Ep2LlamaMoeZero1MatchesOneProcess) {
  if (W().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_trainer_cp("tiny-llama-moe", 2, 1, 1, false, 2);
}

// PP x CP: each stage runs ring attention over its CP group; stages exchange the rank's rows.
TEST(TrainerCp, Pp2Cp2MatchesOneProcess) {
  if (W().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_trainer_cp("tiny-llama", 2, 0, 1, false, 1, 2);  // 1F1B, untied embeddings
}
TEST(TrainerCp, Pp2Cp2InterleavedGpt2Zero1MatchesOneProcess) {
  if (W().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_trainer_cp("tiny", 2, 1, 1, false, 1, 2, 2);  // tied embeddings, virtual stages
}
TEST(TrainerCp, Pp2Cp2MoeMatchesOneProcess) {
  if (W().size() != 4) GTEST_SKIP() << "needs 4 ranks";
  check_trainer_cp("tiny-moe", 2, 1, 1, false, 1, 2);
}

TEST(TrainerCp, ResumeIsBitIdenticalUnderTheSameLayout) {
  std::string d1 = runs.dir("resume_a"), d2 = runs.dir("resume_b");
  auto cfg = [&](const std::string& d) {
    Config c = runs.config(d, 6, 2, "tiny-llama");
    c.set("parallel.cp", "2", "test");
    c.set("parallel.zero", "1", "test");
    return c;
  };
  testing_parallel::expect_resume_bit_identical(cfg(d1), cfg(d2), cfg(d2));
}

TEST(TrainerCp, BadContextParallelSettingsAreClearErrors) {
  std::string d = runs.dir("bad");
  Config c = runs.config(d, 2, 1, "tiny");
  c.set("parallel.cp", std::to_string(W().size()), "test");
  c.set("train.seq_len", "6", "test");  // not divisible by 2*cp
  try {
    Trainer t(c);
    ADD_FAILURE() << "seq_len 6 accepted with cp " << W().size();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("2*cp"), std::string::npos) << e.what();
  }
}

LOOM_MPI_TEST_MAIN()
