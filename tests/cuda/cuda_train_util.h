// What the CUDA trainer tests share: the tiny trainer config they all start from (2 layers of 64
// wide, byte vocabulary, two micro-batches of 4 x 32 per step, clipping on, validation batches
// for evaluate(); eval_interval past the run: only when a test calls it) over a fox corpus of
// kFoxLines lines; the corpus and the read-back of the trainer's weights are
// tests/train/trainer_setups.h's.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"
#include "train/trainer_setups.h"

namespace loom::test {

// The corpus the CUDA trainer tests read.
constexpr int kFoxLines = 400;

// `preset` cut to the sizes above, `steps` steps, a checkpoint every `ckpt` steps (0: none);
// `extra` is more TOML appended (sections the base does not open, e.g. [precision]).
inline Config tiny_train_config(const std::string& dir, const std::string& preset, int steps,
                                int ckpt, const std::string& extra = "") {
  Config c = Config::parse(
      "[model]\nn_layer = 2\nd_model = 64\nn_head = 4\nmax_seq = 64\n"
      "[train]\nmicro_batch = 4\nseq_len = 32\ngrad_accum = 2\nquiet = true\n"
      "peak_gflops = 100\nclip_grad = 1.0\ntensorboard = false\n"
      "eval_interval = 1000\neval_batches = 2\n"
      "[optim]\nlr = 3e-3\nwarmup_steps = 5\n" +
          extra,
      "test.toml");
  c.set("model.preset", quoted(preset), "test");
  c.set("train.steps", std::to_string(steps), "test");
  c.set("train.checkpoint_interval", std::to_string(ckpt), "test");
  c.set("train.out_dir", quoted(dir + "/run"), "test");
  c.set("data.paths", quoted(write_fox_corpus(dir, kFoxLines)), "test");
  return c;
}

}  // namespace loom::test
