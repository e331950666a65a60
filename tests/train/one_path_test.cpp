// One training path: a one-process run is the data-parallel engine over a world of one rank.
// It takes the same optimizer steps as the engine at another ZeRO level (parallel.zero = 1: the
// engine's shard is the whole parameter set), with the same AdamW on the same elements and the
// same gradient-norm summation, so weights, losses and norms agree bit for bit, clipping on.
// Its checkpoints keep the one-process layout, which every tool reads and which a checkpoint
// written by the plain writer (ckpt::save_checkpoint, as before the engine) resumes from.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "ckpt/checkpoint.h"
#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "core/fs.h"
#include "temp_dir.h"
#include "train/trainer.h"

using namespace loom;

namespace {

Config config(const std::string& dir, const std::string& precision, int steps = 4) {
  std::string text;
  for (int i = 0; i < 100; ++i) text += "one path, " + std::to_string(i) + " steps along it.\n";
  write_file_atomic(dir + "/corpus.txt", text);
  // clip_grad small enough that every step clips: the norm enters the update.
  Config c = Config::parse(
      "[model]\npreset = \"tiny\"\nn_layer = 2\nd_model = 32\nn_head = 2\nmax_seq = 32\n"
      "[train]\nmicro_batch = 2\nseq_len = 16\ngrad_accum = 2\nquiet = true\n"
      "peak_gflops = 100\nclip_grad = 0.05\ntensorboard = false\n"
      "[optim]\nlr = 3e-3\nwarmup_steps = 2\n",
      "test.toml");
  c.set("train.steps", std::to_string(steps), "test");
  c.set("train.out_dir", "\"" + dir + "/run\"", "test");
  c.set("data.paths", "\"" + dir + "/corpus.txt\"", "test");
  c.set("precision.policy", "\"" + precision + "\"", "test");
  return c;
}

std::vector<float> weights_of(Trainer& t) {
  const ParamSet& P = t.model().params();
  // (read_values: the bf16 policy's 2-byte weights keep no fp32 values; widened from bf16.)
  std::vector<float> v(size_t(P.total()));
  P.read_values(0, P.total(), v.data());
  return v;
}

}  // namespace

TEST(OnePath, OneRankEngineTrainsLikeOneProcess) {
  for (const char* precision : {"fp32", "bf16"}) {
    const std::string d1 = test::scoped_dir("onepath_process");
    const std::string d2 = test::scoped_dir("onepath_engine");
    Config c2 = config(d2, precision);
    c2.set("parallel.zero", "1", "test");
    auto self = comm::make_self_communicator();
    Trainer process(config(d1, precision)), engine(c2, self.get());
    // The one-process run is the engine too: ZeRO-0 over a world of one rank.
    ASSERT_NE(process.data_parallel(), nullptr);
    EXPECT_EQ(process.data_parallel()->zero(), 0);
    EXPECT_EQ(process.groups()->world().size(), 1);
    ASSERT_FALSE(process.distributed());  // its checkpoints: the one-process layout
    ASSERT_TRUE(engine.distributed());
    EXPECT_EQ(engine.data_parallel()->zero(), 1);
    const ParamSet& G = process.model().params();
    for (int s = 0; s < 4; ++s) {
      const StepResult a = process.train_step(), b = engine.train_step();
      EXPECT_EQ(a.loss, b.loss) << precision << " step " << s;
      EXPECT_EQ(a.grad_norm, b.grad_norm) << precision << " step " << s;
      EXPECT_GT(a.grad_norm, 0.05) << precision << " (the step must clip)";
      // The norm is the one sum over the whole gradient buffer that one process took before
      // the engine (the reduced gradients stay there at ZeRO-0), bit for bit.
      EXPECT_EQ(a.grad_norm, std::sqrt(cpu_backend().sum_squares(G.grad(), G.total())))
          << precision << " step " << s;
    }
    const std::vector<float> p = weights_of(process), q = weights_of(engine);
    ASSERT_EQ(p.size(), q.size());
    EXPECT_EQ(0, std::memcmp(p.data(), q.data(), sizeof(float) * p.size())) << precision;
    // Both moved away from the same start.
    Trainer fresh(config(test::scoped_dir("onepath_fresh"), precision));
    const std::vector<float> f = weights_of(fresh);
    EXPECT_NE(0, std::memcmp(p.data(), f.data(), sizeof(float) * p.size()));
  }
}

// A one-process checkpoint holds whole tensors named and shaped like the parameters (optimizer
// state "exp_avg.<param>" and the like), no shard placement and no layout, under
// <out_dir>/checkpoints; and the one-process layout written by the plain writer from those
// tensors (as the trainer wrote it before the engine, and as loom rl still does) resumes bit
// for bit.
TEST(OnePath, OneProcessCheckpointsKeepTheirLayoutAndResume) {
  const std::string d1 = test::scoped_dir("onepath_straight");
  const std::string d2 = test::scoped_dir("onepath_saved");
  const std::string d3 = test::scoped_dir("onepath_legacy");
  Trainer straight(config(d1, "bf16", 6));
  straight.run();
  {
    Trainer t(config(d2, "bf16", 6));
    for (int i = 0; i < 3; ++i) t.train_step();
    t.save_checkpoint();
  }
  const std::string dir = d2 + "/run/checkpoints/" + ckpt::step_dir_name(3);
  const ckpt::Checkpoint saved(dir);
  EXPECT_FALSE(saved.state().extra.contains("layout"));
  EXPECT_FALSE(saved.state().extra.contains("rank"));
  EXPECT_EQ(saved.state().extra.at("optimizer_steps").as_int(), 3);
  const ParamSet& P = straight.model().params();
  std::set<std::string> model_names, optim_names;
  for (const auto& e : saved.model().entries()) {
    model_names.insert(e.name);
    ASSERT_TRUE(P.has(e.name)) << e.name;
    EXPECT_EQ(e.shape, P.info(e.name).shape) << e.name;
    EXPECT_TRUE(e.shard.is_default()) << e.name;
  }
  for (const auto& e : saved.optim().entries()) {
    optim_names.insert(e.name);
    const std::string param = e.name.substr(e.name.find('.') + 1);
    ASSERT_TRUE(P.has(param)) << e.name;
    EXPECT_EQ(e.shape, P.info(param).shape) << e.name;
    EXPECT_TRUE(e.shard.is_default()) << e.name;
  }
  EXPECT_EQ(model_names.size(), P.infos().size());
  EXPECT_EQ(optim_names.size(), 3 * P.infos().size());  // exp_avg, exp_avg_sq, bf16's master
  for (const ParamInfo& p : P.infos())
    for (const char* prefix : {"exp_avg.", "exp_avg_sq.", "master."})
      EXPECT_TRUE(optim_names.count(prefix + p.name)) << prefix << p.name;

  // The same tensors and state through the plain one-process writer into another run's root.
  ckpt::TrainerState st = saved.state();
  st.config_text = config(d3, "bf16", 6).dump();
  ckpt::save_checkpoint(d3 + "/run/checkpoints", st, saved.model().load_all(),
                        saved.optim().load_all());
  Trainer resumed(config(d3, "bf16", 6));
  EXPECT_EQ(resumed.step(), 3);
  resumed.run();
  const std::vector<float> a = weights_of(straight), b = weights_of(resumed);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), sizeof(float) * a.size()));
}
