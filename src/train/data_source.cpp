#include "train/data_source.h"

#include <sstream>

#include "core/error.h"
#include "data/bpe.h"
#include "train/byte_text_source.h"
#include "train/chat_source.h"
#include "train/preference_source.h"
#include "train/token_file_source.h"
#include "train/train_options.h"

namespace loom {

std::unique_ptr<BatchSource> make_batch_source(const Config& cfg, const TrainOptions& opt,
                                               const ModelConfig& model, const std::string& split,
                                               int dp_rank, int dp_size) {
  const std::string kind = cfg.get_string("data.source", "text");
  const uint64_t seed =
      static_cast<uint64_t>(cfg.get_int("data.seed", static_cast<int64_t>(opt.seed)));
  if (kind == "text") {
    auto paths = cfg.get_string_list("data.paths", {"/usr/share/common-licenses"});
    double valid_fraction = cfg.get_double("data.valid_fraction", 0.05);
    return std::make_unique<ByteTextSource>(paths, opt.micro_batch, opt.seq_len, seed,
                                            valid_fraction, split, dp_rank, dp_size);
  }
  if (kind == "chat") {
    const std::string path = cfg.get_string("data.path", "");
    LOOM_CHECK(!path.empty(), "data.source = \"chat\" needs data.path (a chat JSONL file)");
    auto s = std::make_unique<ChatSource>(
        path, cfg.get_string("data.tokenizer", ""), cfg.get_string("data.chat_template", "chatml"),
        opt.micro_batch, opt.seq_len, cfg.get_bool("data.packed", true), seed,
        cfg.get_double("data.valid_fraction", 0.05), split, dp_rank, dp_size);
    s->limit_example_tokens(model.max_seq);
    return s;
  }
  if (kind == "chat_tokens") {
    // Chat token files (loom tokenize --chat): streamed from PREFIX.{bin,idx} and its loss
    // mask; data.tokenizer, when set, bounds the ids (else model.vocab does).
    const std::string prefix = cfg.get_string("data.prefix", "");
    LOOM_CHECK(!prefix.empty(), "data.source = \"chat_tokens\" needs data.prefix (the PREFIX ",
               "of `loom tokenize --chat --out PREFIX`)");
    const std::string tok = cfg.get_string("data.tokenizer", "");
    const int vocab = tok.empty() ? model.vocab : data::load_tokenizer(tok)->vocab_size();
    auto s = std::make_unique<ChatSource>(
        prefix, vocab, opt.micro_batch, opt.seq_len, cfg.get_bool("data.packed", true), seed,
        cfg.get_double("data.valid_fraction", 0.05), split, dp_rank, dp_size);
    s->limit_example_tokens(model.max_seq);
    return s;
  }
  if (kind == "preference") {
    const std::string path = cfg.get_string("data.path", "");
    LOOM_CHECK(!path.empty(), "data.source = \"preference\" needs data.path (a JSONL file)");
    return std::make_unique<PreferenceSource>(
        path, cfg.get_string("data.tokenizer", ""), cfg.get_string("data.chat_template", "chatml"),
        opt.micro_batch, opt.seq_len, seed, cfg.get_double("data.valid_fraction", 0.05), split,
        dp_rank, dp_size, cfg.get_string("dpo.loss", "sigmoid") == "kto");
  }
  LOOM_CHECK(kind == "tokens",
             "data.source must be 'text', 'tokens', 'chat', 'chat_tokens' or 'preference', ",
             "got '", kind, "'");
  data::LoaderConfig lc;
  lc.prefixes = cfg.get_string_list("data.prefixes", {});
  LOOM_CHECK(!lc.prefixes.empty(), "data.prefixes must name at least one token file prefix");
  for (auto& w : cfg.get_string_list("data.weights", {})) {
    char* end = nullptr;
    double v = std::strtod(w.c_str(), &end);
    LOOM_CHECK(*end == 0 && v > 0, "data.weights: '", w, "' is not a positive number");
    lc.weights.push_back(v);
  }
  LOOM_CHECK(lc.weights.empty() || lc.weights.size() == lc.prefixes.size(), "data.weights has ",
             lc.weights.size(), " entries for ", lc.prefixes.size(), " prefixes");
  lc.seq_len = opt.seq_len;
  lc.micro_batch = opt.micro_batch;
  lc.rank = dp_rank;
  lc.world = dp_size;
  lc.seed = seed;
  lc.split = cfg.get_string("data.split", lc.split);
  lc.which = split == "train" ? data::Split::Train : data::Split::Valid;
  lc.packed = cfg.get_bool("data.packed", false);
  lc.cache_dir = cfg.get_string("data.cache_dir", "");
  lc.log = !opt.quiet;
  // Enough samples for the whole run over every rank; validation draws the same eval batches
  // every time.
  lc.num_samples = split == "train" ? opt.steps * opt.micro_batch * opt.grad_accum * dp_size
                                    : static_cast<int64_t>(opt.eval_batches) * opt.micro_batch;
  int vocab = model.vocab;
  std::string tok = cfg.get_string("data.tokenizer", "");
  if (!tok.empty()) {
    int tv = data::load_tokenizer(tok)->vocab_size();
    LOOM_CHECK(tv <= model.vocab, "data.tokenizer ", tok, " has ", tv,
               " tokens, more than model.vocab = ", model.vocab);
    vocab = tv;
  }
  return std::make_unique<TokenFileSource>(lc, vocab);
}

}  // namespace loom
