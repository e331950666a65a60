// What the GRPO tests share: a byte-level tokenizer with the chat template's tokens, a tiny
// random Llama-style model, and a task a tiny model learns within a few steps.
#pragma once

#include <string>
#include <vector>

#include "data/bpe.h"
#include "data/chat.h"
#include "kernels/backend.h"
#include "model/decoder.h"
#include "rl/env.h"
#include "rl/grpo_trainer.h"

namespace loom::rl::rltest {

// Rewards replies made of the letter 'a'.
struct LetterA : Environment {
  std::string name() const override { return "letter-a"; }
  Task task(uint64_t, uint64_t i) const override {
    return {"say a " + std::to_string(i % 7), "", {}};
  }
  double reward(const Task&, const std::string& reply) const override {
    if (reply.empty()) return 0;
    double a = 0;
    for (char ch : reply) a += ch == 'a';
    return a / double(reply.size());
  }
};

// Rewards the share of reply bytes below 128: a random byte-level model gets varied rewards
// from the first step, so every group carries a gradient.
struct LowBytes : Environment {
  std::string name() const override { return "low-bytes"; }
  Task task(uint64_t, uint64_t i) const override {
    return {"bytes " + std::to_string(i % 5), "", {}};
  }
  double reward(const Task&, const std::string& reply) const override {
    if (reply.empty()) return 0;
    double low = 0;
    for (char ch : reply) low += static_cast<unsigned char>(ch) < 128;
    return low / double(reply.size());
  }
};

inline ModelConfig tiny_config() {
  ModelConfig c = model_preset("tiny-llama");
  c.n_layer = 2, c.d_model = 32, c.n_head = 4, c.n_kv_head = 2, c.head_dim = 8, c.d_ff = 64;
  c.vocab = 260, c.max_seq = 64, c.init_std = 0.02f;
  return c;
}

// Small GRPO settings: 3 prompts x 4 samples of at most 5 tokens per step.
inline RlOptions small_options() {
  RlOptions o;
  o.prompts_per_step = 3;
  o.group_size = 4;
  o.max_tokens = 5;
  o.lr = 1e-2;
  o.grpo.beta = 0.01;
  return o;
}

// tiny_config with every MLP a mixture of 4 experts (top 2, dropless).
inline ModelConfig tiny_moe_config() {
  ModelConfig c = tiny_config();
  c.n_experts = 4, c.top_k = 2;
  c.validate();
  return c;
}

// A tiny policy (tiny_config unless given; computing in `compute`, its weights drawn in fp32
// either way), a byte tokenizer with ChatML, and the LowBytes environment.
struct Fixture {
  Decoder model;
  data::BpeTokenizer tok = data::byte_chatml_tokenizer();
  data::ChatTemplate chat{"chatml", tok};
  LowBytes env;
  explicit Fixture(const ModelConfig& c = tiny_config(), DType compute = DType::F32)
      : model(c, cpu_backend(), Recompute::None, compute) {
    model.params().init(3);
  }
};

}  // namespace loom::rl::rltest
