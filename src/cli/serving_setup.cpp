#include "cli/serving_setup.h"

#include "ckpt/checkpoint.h"
#include "core/config.h"
#include "core/error.h"

namespace loom::cli {

std::unique_ptr<data::BpeTokenizer> checkpoint_tokenizer(const std::string& ckpt,
                                                         const std::string& spec_opt,
                                                         const Decoder& model) {
  std::string spec = spec_opt;
  if (spec.empty()) {
    ckpt::Checkpoint c(ckpt);
    spec = Config::parse(c.state().config_text, c.dir() + "/state.json")
               .get_string("data.tokenizer", "");
  }
  if (spec.empty()) {
    LOOM_CHECK(model.config().vocab == 256, "the checkpoint names no data.tokenizer and its ",
               "vocabulary (", model.config().vocab, ") is not byte-level: pass --tokenizer");
    return nullptr;
  }
  auto tok = data::load_tokenizer(spec);
  LOOM_CHECK(tok->vocab_size() <= model.config().vocab, "tokenizer ", spec, " has ",
             tok->vocab_size(), " tokens, more than the model's vocabulary of ",
             model.config().vocab);
  return tok;
}

void set_text_codec(infer::EngineConfig& cfg, const data::BpeTokenizer* tok,
                    const data::ChatTemplate* chat) {
  if (!tok) {
    cfg.detokenize = [](const std::vector<int32_t>& ids) {
      std::string s;
      for (int32_t t : ids)
        if (t >= 0 && t < 256) s.push_back(static_cast<char>(t));
      return s;
    };
    return;
  }
  if (tok->eot_id() >= 0) cfg.eos_ids.push_back(tok->eot_id());
  if (chat) cfg.eos_ids.push_back(chat->end_of_turn());
  cfg.detokenize = [tok](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t t : ids)
      if (t >= 0 && t < tok->vocab_size()) tok->decode_append(t, s);
    return s;
  };
}

}  // namespace loom::cli
