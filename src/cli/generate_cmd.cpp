// `loom generate`: samples text from a checkpoint (byte-level models decode bytes directly).
#include <cstdio>

#include "cli/command.h"
#include "cli/options.h"
#include "core/error.h"
#include "infer/generator.h"

namespace loom::cli {

int run_generate(const Args& args) {
  Options o("loom generate --ckpt PATH [--prompt TEXT] [--tokens N] [sampling options]",
            "Samples a continuation of the prompt from a trained checkpoint and prints it.");
  o.value("ckpt", "", "checkpoint: a step directory or a checkpoints root (uses latest)", true)
      .value("prompt", "\n", "prompt text")
      .value("tokens", "200", "number of tokens to generate")
      .value("temperature", "0.8", "softmax temperature; 0 = greedy")
      .value("top-k", "40", "sample among the k most likely tokens; 0 = all")
      .value("top-p", "0.95", "nucleus: smallest set with this much probability; 1 = all")
      .value("seed", "0", "sampling seed");
  if (!o.parse(args)) return 0;
  SamplingOptions s;
  s.temperature = static_cast<float>(o.get_double("temperature"));
  s.top_k = static_cast<int>(o.get_int("top-k"));
  s.top_p = static_cast<float>(o.get_double("top-p"));
  s.seed = static_cast<uint64_t>(o.get_int("seed"));
  validate(s);
  int n = static_cast<int>(o.get_int("tokens"));
  LOOM_CHECK(n >= 0, "--tokens must be >= 0");
  auto model = load_model_from_checkpoint(o.get("ckpt"));
  LOOM_CHECK(model->config().vocab == 256,
             "this checkpoint's vocabulary has ", model->config().vocab,
             " tokens; only byte-level models (vocab 256) can be prompted with text so far");
  std::string prompt = o.get("prompt");
  LOOM_CHECK(!prompt.empty(), "--prompt must not be empty");
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  for (auto& t : tokens) t = static_cast<unsigned char>(t);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  generate(*model, tokens, n, s, [](int32_t t) {
    std::fputc(t, stdout);
    std::fflush(stdout);
  });
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace loom::cli
