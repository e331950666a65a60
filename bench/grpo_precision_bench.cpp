// GRPO's learner step with a bf16 policy vs an fp32 one, on this machine: the same groups (one
// rollout batch of the fp32 starting model, trained on as one step old so that importance
// weights and the reference's pass run too), the same starting weights, one thread per run.
// Rounds alternate the two policies so that a change of the machine's load hits both alike; each
// prints the learner's seconds per step (its median over the round's steps) and the fp32 / bf16
// ratio. The bf16 policy multiplies on the CPU's AVX512-BF16 GEMMs (oneDNN) where it has them.
//   bench_grpo_precision [ROUNDS] [STEPS]
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/bench_util.h"
#include "data/bpe.h"
#include "data/chat.h"
#include "kernels/backend.h"
#include "rl/grpo_trainer.h"
#include "rl/rollout.h"

using namespace loom;
using namespace loom::rl;

namespace {

struct LowBytes : Environment {
  std::string name() const override { return "low-bytes"; }
  Task task(uint64_t, uint64_t i) const override {
    return {"bytes " + std::to_string(i % 13), "", {}};
  }
  double reward(const Task&, const std::string& reply) const override {
    if (reply.empty()) return 0;
    double low = 0;
    for (char ch : reply) low += static_cast<unsigned char>(ch) < 128;
    return low / double(reply.size());
  }
};

ModelConfig bench_config() {
  ModelConfig c = model_preset("tiny-llama");
  c.n_layer = 4, c.d_model = 512, c.n_head = 8, c.n_kv_head = 4, c.head_dim = 64, c.d_ff = 1536;
  c.vocab = 260, c.max_seq = 128, c.init_std = 0.02f;
  return c;
}

RlOptions bench_options() {
  RlOptions o;
  o.prompts_per_step = 8;
  o.group_size = 8;
  o.max_tokens = 32;
  o.lr = 1e-4;
  o.grpo.beta = 0.01;
  o.seed = 5;
  return o;
}

// The median learner seconds of `steps` steps of a fresh learner in `precision`.
double learner_seconds(const std::string& precision, const Decoder& start,
                       const std::vector<PromptGroup>& groups, int steps) {
  RlOptions o = bench_options();
  o.precision = precision_from_name(precision);
  Decoder policy(start.config(), cpu_backend(), Recompute::None, o.precision.compute);
  policy.params().copy_values_from(start.params());
  GrpoLearner learner(policy, o);
  std::vector<double> t;
  for (int s = 0; s < steps; ++s) {
    RlStepStats st;
    learner.learn(groups, s + 1, &st);
    t.push_back(st.learner_seconds);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 3;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 5;
  if (rounds < 1 || steps < 1) {
    std::fprintf(stderr, "usage: bench_grpo_precision [ROUNDS >= 1] [STEPS >= 1]\n");
    return 2;
  }
  omp_set_num_threads(1);
  Decoder start(bench_config(), cpu_backend());
  start.params().init(7);
  data::BpeTokenizer tok = data::byte_chatml_tokenizer();
  data::ChatTemplate chat("chatml", tok);
  LowBytes env;
  const RlOptions o = bench_options();
  RolloutWorker w(start, tok, chat, env, o);
  const std::vector<PromptGroup> groups = w.generate(0, 0).groups;
  int64_t tokens = 0;
  for (const PromptGroup& g : groups)
    for (const Rollout& r : g.rollouts) tokens += int64_t(g.prompt.size() + r.response.size());
  std::printf(
      "GRPO learner step, bf16 vs fp32 policy: %zu groups, %lld tokens a step, model "
      "d=%d L=%d, 1 thread, load average %.2f\n",
      groups.size(), static_cast<long long>(tokens), start.config().d_model, start.config().n_layer,
      load_average());
  std::printf("%-6s %12s %12s %8s %8s\n", "round", "fp32 s/step", "bf16 s/step", "ratio", "load");
  std::vector<double> ratios;
  for (int r = 0; r < rounds; ++r) {
    const double f = learner_seconds("fp32", start, groups, steps);
    const double b = learner_seconds("bf16", start, groups, steps);
    ratios.push_back(f / b);
    std::printf("%-6d %12.4f %12.4f %7.2fx %8.2f\n", r, f, b, f / b, load_average());
  }
  std::sort(ratios.begin(), ratios.end());
  std::printf("median ratio fp32/bf16 learner step: %.2fx (range %.2f-%.2f), load average %.2f\n",
              ratios[ratios.size() / 2], ratios.front(), ratios.back(), load_average());
  return 0;
}
