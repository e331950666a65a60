// Environments for RL: a task hands out prompts and scores completions. Built-in verifiable
// tasks are generated on the fly from the counter-based RNG (the same index gives the same
// task) and rewarded by exact checks, never by format alone (a format reward is what models learn
// to game first):
//   arithmetic  "What is 37 + 48?"            reward 1 when the first number in the reply is it
//   reverse     "Reverse the words: a b c"    reward 1 when the trimmed reply is "c b a"
//   countdown   "Use 3, 5, 7 to make 22."     reward 1 when the reply is an expression using each
//                                             number at most once (+ - * and parentheses) equal
//                                             to the target
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom::rl {

struct Task {
  std::string prompt;
  std::string answer;        // the expected reply (arithmetic, reverse) or target (countdown)
  std::vector<int> numbers;  // countdown's numbers
};

class Environment {
 public:
  virtual ~Environment() = default;
  virtual std::string name() const = 0;
  virtual Task task(uint64_t seed, uint64_t index) const = 0;
  // Held-out task `index` for evaluation (heldout_accuracy passes heldout_seed of the run's
  // seed): by default task(seed, index), which a generator never draws in training; an
  // environment whose training tasks are a fixed list gives its own held-out list, or throws
  // when it has none.
  virtual Task eval_task(uint64_t seed, uint64_t index) const { return task(seed, index); }
  // How many distinct held-out tasks eval_task gives (-1: unbounded).
  virtual int64_t eval_task_count() const { return -1; }
  // In [0, 1]. Never throws on any reply (garbage scores 0).
  virtual double reward(const Task& t, const std::string& reply) const = 0;
};

// "arithmetic", "reverse" or "countdown"; throws on another name.
std::unique_ptr<Environment> make_environment(const std::string& name);

// The value of an integer expression of + - * and parentheses over the allowed numbers (each
// used at most once), or false when the text is not such an expression.
bool eval_countdown(const std::string& expr, const std::vector<int>& allowed, long long* value);

}  // namespace loom::rl
