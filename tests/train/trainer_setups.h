// What the trainer tests set up alike (trainer_test.cpp, the guarded-trainer tests of
// guarded_trainer_run.h, the CUDA trainer tests of tests/cuda): the fox corpus, a read-back of
// weights wherever they live, LoRA over a base pretrained on the CPU, and the tiny Llama trained
// by DPO on the pairs of preference_pairs.h.
#pragma once

#include <string>
#include <vector>

#include "core/config.h"
#include "core/fs.h"
#include "model/params.h"
#include "train/preference_pairs.h"
#include "train/trainer.h"

namespace loom::test {

// A TOML string value. (Not `"\"" + s + "\""`: GCC 12's -Wrestrict misfires on it.)
inline std::string quoted(const std::string& s) {
  return std::string(1, '"').append(s).append(1, '"');
}

// `lines` numbered lines of text in dir/corpus.txt; its path.
inline std::string write_fox_corpus(const std::string& dir, int lines) {
  std::string path = dir + "/corpus.txt";
  std::string text;
  for (int i = 0; i < lines; ++i)
    text += "the quick brown fox " + std::to_string(i) + " jumps over the lazy dog.\n";
  write_file_atomic(path, text);
  return path;
}

// The values of `P`, read through its backend (device memory is not host-readable).
inline std::vector<float> param_values(const ParamSet& P) {
  std::vector<float> v(size_t(P.total()));
  P.read_values(0, P.total(), v.data());
  return v;
}

inline std::vector<float> trainer_weights(Trainer& t) {
  return param_values(t.model().params());
}

// Makes `c` train rank-4 LoRA adapters (alpha 8) over a base: `base` trained first for `steps`
// steps on the CPU into dir/base, whose final checkpoint (weights only) `c` starts from.
inline void lora_over_base(Config& c, Config base, const std::string& dir, int steps) {
  base.set("train.out_dir", quoted(dir + "/base"), "test");
  base.set("train.steps", std::to_string(steps), "test");
  base.set("train.checkpoint_interval", std::to_string(steps), "test");
  {
    Trainer pre(base);
    pre.run();
  }
  c.set("train.pretrained", quoted(dir + "/base/checkpoints"), "test");
  c.set("lora.rank", "4", "test");
  c.set("lora.alpha", "8", "test");
}

// DPO (beta 0.5, no weight decay) of a tiny Llama (GQA, byte vocabulary) on 60 preference
// pairs written under `dir`, a fifth of them for validation; `schedule` is the [train] and
// [optim] TOML (batch sizes, steps, learning rate ...). The run's out_dir is the caller's.
inline Config tiny_dpo_config(const std::string& dir, const std::string& schedule) {
  write_preference_pairs(dir, 60);
  Config c = Config::parse(
      "[model]\npreset = \"tiny-llama\"\nn_layer = 2\nd_model = 32\nn_head = 4\nn_kv_head = 2\n"
      "d_ff = 64\nvocab = 260\nmax_seq = 48\ninit_std = 0.1\n"
      "[data]\nsource = \"preference\"\nvalid_fraction = 0.2\n"
      "[dpo]\nbeta = 0.5\n" +
          schedule,
      "test.toml");
  c.set("train.mode", quoted("dpo"), "test");
  c.set("optim.weight_decay", "0.0", "test");
  c.set("data.path", quoted(dir + "/pairs.jsonl"), "test");
  c.set("data.tokenizer", quoted("loom:" + dir + "/tok"), "test");
  return c;
}

}  // namespace loom::test
