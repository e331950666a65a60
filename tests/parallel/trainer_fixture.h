// Shared by the trainer-level multi-process tests (trainer_dp/pp/cp/5d): a scratch directory per
// rank and a tiny byte-level run over a generated corpus, which each test then adapts.
#pragma once

#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include "comm/communicator.h"
#include "core/config.h"
#include "core/fs.h"
#include "temp_dir.h"
#include "train/trainer.h"

namespace loom::testing_parallel {

// Names this job's scratch directories, the same on every rank and different for two runs of
// the same test at once (two checkouts running the suite): Open MPI's job id, which every rank
// of an mpirun job shares; a process of its own uses its pid.
inline const std::string& job_tag() {
  static const std::string tag = [] {
    for (const char* var : {"PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid"})
      if (const char* v = std::getenv(var); v && *v) {
        std::string t = v;
        for (char& ch : t)
          if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
        return t;
      }
    return std::to_string(::getpid());
  }();
  return tag;
}

// <TempDir>/loom_<suite>_<name>_<job>_<rank>, emptied, and removed when the test ends (each
// rank removes its own).
inline std::string rank_dir(const std::string& suite, const std::string& name, int rank) {
  std::string d = testing::TempDir() + "/loom_" + suite + "_" + name + "_" + job_tag() + "_" +
                  std::to_string(rank);
  remove_all(d);
  make_dirs(d);
  loom::test::remove_at_test_end(d);
  return d;
}

// Writes dir/corpus.txt (300 lines starting with `line_start`) and returns a config that trains
// an n_layer-deep, 32-wide model on it for `steps` steps of `grad_accum` micro-batches of 2x16,
// with its output in dir/run. The model preset is left to the caller.
inline Config tiny_run_config(const std::string& dir, const std::string& line_start, int n_layer,
                              const std::string& lr, int steps, int grad_accum) {
  std::string text;
  for (int i = 0; i < 300; ++i)
    text += line_start + std::to_string(i * 7 % 13) + " jumps over " + std::to_string(i) +
            " lazy dogs.\n";
  write_file_atomic(dir + "/corpus.txt", text);
  Config c = Config::parse("[model]\nn_layer = " + std::to_string(n_layer) +
                               "\nd_model = 32\nn_head = 2\nmax_seq = 16\n"
                               "[train]\nmicro_batch = 2\nseq_len = 16\nquiet = true\n"
                               "peak_gflops = 100\nkeep_last = 3\nclip_grad = 0.5\n"
                               "[optim]\nlr = " +
                               lr + "\nwarmup_steps = 2\n",
                           "test.toml");
  c.set("train.steps", std::to_string(steps), "test");
  c.set("train.grad_accum", std::to_string(grad_accum), "test");
  c.set("train.out_dir", "\"" + dir + "/run\"", "test");
  c.set("data.paths", "\"" + dir + "/corpus.txt\"", "test");
  c.set("parallel.bucket_mb", "0.01", "test");
  return c;
}

// A run resumed from its checkpoint continues exactly: 6 steps straight through (`straight`)
// against 3 steps, a checkpoint, and 3 more steps in a new trainer (`before`, then `after`:
// one directory, not straight's). `label` starts the failure message.
inline void expect_resume_bit_identical(const Config& straight, const Config& before,
                                        const Config& after, const std::string& label = "") {
  std::vector<double> straight_losses, resumed_losses;
  {
    Trainer t(straight);
    for (int i = 0; i < 6; ++i) straight_losses.push_back(t.train_step().loss);
  }
  {
    Trainer t(before);
    for (int i = 0; i < 3; ++i) resumed_losses.push_back(t.train_step().loss);
    t.save_checkpoint();
  }
  {
    Trainer t(after);
    EXPECT_EQ(t.step(), 3);
    for (int i = 3; i < 6; ++i) resumed_losses.push_back(t.train_step().loss);
  }
  for (int i = 0; i < 6; ++i)
    EXPECT_EQ(straight_losses[i], resumed_losses[i]) << label << "step " << i;
}

inline comm::Communicator& W() {
  return comm::world();
}

// One trainer test file's runs: its scratch directories (named after `suite`) and its corpus
// (lines starting with `line_start`), so that test files running at once do not collide.
struct TrainerRuns {
  std::string suite, line_start;

  // This rank's directory `name`, emptied.
  std::string dir(const std::string& name) const { return rank_dir(suite, name, W().rank()); }

  // A 4-layer run of the model preset `family` at lr 5e-3 (tiny_run_config).
  Config config(const std::string& dir, int steps, int grad_accum,
                const std::string& family) const {
    Config c = tiny_run_config(dir, line_start, 4, "5e-3", steps, grad_accum);
    c.set("model.preset", "\"" + family + "\"", "test");
    return c;
  }
};

}  // namespace loom::testing_parallel
