// One training path: a one-process run and the data-parallel engine over a one-rank
// communicator (parallel.zero = 1: the engine's shard is the whole parameter set) take the same
// optimizer steps, with the same AdamW on the same elements. With clipping off, the global
// norm (the engine sums it per parameter, one process over the whole buffer: the last bits may
// differ) does not enter the update, so weights and losses must agree bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/fs.h"
#include "temp_dir.h"
#include "train/trainer.h"

using namespace loom;

namespace {

Config config(const std::string& dir, const std::string& precision) {
  std::string text;
  for (int i = 0; i < 100; ++i) text += "one path, " + std::to_string(i) + " steps along it.\n";
  write_file_atomic(dir + "/corpus.txt", text);
  Config c = Config::parse(
      "[model]\npreset = \"tiny\"\nn_layer = 2\nd_model = 32\nn_head = 2\nmax_seq = 32\n"
      "[train]\nmicro_batch = 2\nseq_len = 16\ngrad_accum = 2\nquiet = true\n"
      "peak_gflops = 100\nclip_grad = 0\ntensorboard = false\n"
      "[optim]\nlr = 3e-3\nwarmup_steps = 2\n",
      "test.toml");
  c.set("train.steps", "4", "test");
  c.set("train.out_dir", "\"" + dir + "/run\"", "test");
  c.set("data.paths", "\"" + dir + "/corpus.txt\"", "test");
  c.set("precision.policy", "\"" + precision + "\"", "test");
  return c;
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
    ASSERT_FALSE(process.distributed());
    ASSERT_TRUE(engine.distributed());
    for (int s = 0; s < 4; ++s) {
      const StepResult a = process.train_step(), b = engine.train_step();
      EXPECT_EQ(a.loss, b.loss) << precision << " step " << s;
      EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-12 * a.grad_norm) << precision << " step " << s;
      EXPECT_GT(a.grad_norm, 0) << precision;
    }
    const ParamSet& P = process.model().params();
    const ParamSet& Q = engine.model().params();
    ASSERT_EQ(P.total(), Q.total());
    EXPECT_EQ(0, std::memcmp(P.data(), Q.data(), sizeof(float) * P.total())) << precision;
    // Both moved away from the same start.
    Trainer fresh(config(test::scoped_dir("onepath_fresh"), precision));
    EXPECT_NE(0, std::memcmp(P.data(), fresh.model().params().data(), sizeof(float) * P.total()));
  }
}
