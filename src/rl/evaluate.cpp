#include "rl/evaluate.h"

#include <vector>

#include "core/error.h"
#include "infer/engine.h"
#include "infer/model_runner.h"

namespace loom::rl {

uint64_t heldout_seed(uint64_t seed) {
  return seed ^ 0x5eed0f4e1d07ull;
}

double heldout_accuracy(Decoder& model, const data::BpeTokenizer& tok,
                        const data::ChatTemplate& chat, const Environment& env, int tasks,
                        uint64_t seed, int max_tokens, float temperature) {
  LOOM_CHECK(tasks > 0, "held-out evaluation needs at least one task");
  // A held-out list (--env-eval-tasks) is evaluated whole at most, never a task twice.
  if (const int64_t n = env.eval_task_count(); n > 0 && n < tasks) tasks = static_cast<int>(n);
  infer::DecoderRunner runner(model);
  infer::EngineConfig ec;
  ec.eos_ids = {chat.end_of_turn()};
  if (tok.eot_id() >= 0) ec.eos_ids.push_back(tok.eot_id());
  ec.detokenize = [&](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t t : ids)
      if (t < tok.vocab_size()) tok.decode_append(t, s);
    return s;
  };
  infer::LoomEngine engine(runner, ec);
  std::vector<Task> task(static_cast<size_t>(tasks));
  std::vector<std::string> reply(static_cast<size_t>(tasks));
  for (int i = 0; i < tasks; ++i) {
    task[size_t(i)] = env.eval_task(heldout_seed(seed), uint64_t(i));
    infer::SamplingParams sp;
    sp.temperature = temperature;
    sp.seed = heldout_seed(seed) + uint64_t(i);
    sp.max_tokens = max_tokens;
    engine.submit(chat.prompt_ids({{"user", task[size_t(i)].prompt}}), sp,
                  [&, i](const infer::TokenEvent& e) { reply[size_t(i)] += e.text; });
  }
  engine.run_until_idle();
  int correct = 0;
  for (int i = 0; i < tasks; ++i) correct += env.reward(task[size_t(i)], reply[size_t(i)]) >= 1.0;
  return double(correct) / tasks;
}

}  // namespace loom::rl
