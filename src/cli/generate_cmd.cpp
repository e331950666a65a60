// `loom generate`: samples text from a checkpoint, encoding the prompt and decoding the output
// with the tokenizer the run was trained with (byte-level models use raw bytes).
#include <cstdio>

#include "ckpt/checkpoint.h"
#include "cli/command.h"
#include "cli/options.h"
#include "core/config.h"
#include "core/error.h"
#include "data/bpe.h"
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
      .value("seed", "0", "sampling seed")
      .value("tokenizer", "", "tokenizer spec (default: the run's data.tokenizer, else bytes)");
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
  std::string prompt = o.get("prompt");
  LOOM_CHECK(!prompt.empty(), "--prompt must not be empty");
  // Models trained on token files name their tokenizer in the run's config; byte-level
  // models (vocab 256) read and write raw bytes.
  ckpt::Checkpoint c(o.get("ckpt"));
  std::string spec = o.get("tokenizer");
  if (spec.empty())
    spec = Config::parse(c.state().config_text, c.dir() + "/state.json")
               .get_string("data.tokenizer", "");
  std::unique_ptr<data::BpeTokenizer> tok;
  std::vector<int32_t> tokens;
  if (!spec.empty()) {
    tok = data::load_tokenizer(spec);
    LOOM_CHECK(tok->vocab_size() <= model->config().vocab, "tokenizer ", spec, " has ",
               tok->vocab_size(), " tokens, more than the model's vocabulary of ",
               model->config().vocab);
    tok->encode(prompt, tokens);
  } else {
    LOOM_CHECK(model->config().vocab == 256, "the checkpoint names no data.tokenizer and its ",
               "vocabulary (", model->config().vocab, ") is not byte-level");
    for (unsigned char ch : prompt) tokens.push_back(ch);
  }
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  generate(*model, tokens, n, s, [&](int32_t t) {
    std::string piece;
    if (tok)
      tok->decode_append(t, piece);
    else
      piece.push_back(static_cast<char>(t));
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
  });
  std::fputc('\n', stdout);
  return 0;
}

}  // namespace loom::cli
