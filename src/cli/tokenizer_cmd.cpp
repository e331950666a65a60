// `loom tokenizer`: train a byte-level BPE vocabulary, encode and decode with any supported
// vocabulary (GPT-2 encoder.json + vocab.bpe folder, .tiktoken file, Loom-trained folder).
#include <algorithm>
#include <climits>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>
#include <thread>

#include "cli/command.h"
#include "cli/options.h"
#include "core/error.h"
#include "core/json.h"
#include "core/log.h"
#include "data/bpe.h"
#include "data/bpe_train.h"
#include "data/chat.h"
#include "data/hf_pipeline.h"
#include "data/hf_tokenizer.h"
#include "data/indexed_dataset.h"

namespace loom::cli {

namespace {

std::string read_stdin() {
  std::string s{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
  LOOM_CHECK(!std::cin.bad(), "error reading standard input");
  return s;
}

int tokenizer_train(const Args& args) {
  Options o("loom tokenizer train --input FILE [--input FILE ...] --vocab-size N --out DIR",
            "Trains a byte-level BPE vocabulary (GPT-2 pre-tokenisation) on .jsonl files (text in\n"
            "--field) or plain-text files, and saves DIR/tokenizer.tiktoken + tokenizer.json.\n"
            "Deterministic: the same inputs and options give the same vocabulary.");
  o.multi("input", "training text: .jsonl (one object per line) or any plain-text file")
      .value("vocab-size", "8192", "total vocabulary size: 256 bytes + merges + special tokens")
      .multi("special", "special token (default: <|endoftext|>), ids after the merges")
      .value("out", "", "output folder", true)
      .value("field", "text", "JSONL field holding the text")
      .value("threads", "0", "counting threads (0: all cores)")
      .value("pretokenizer", "gpt2", "pre-tokenisation rules: gpt2, cl100k or qwen2");
  if (!o.parse(args)) return 0;
  LOOM_CHECK(!o.all("input").empty(), "missing required option --input (see --help)");
  data::BpeTrainOptions opt;
  opt.vocab_size = o.get_int32("vocab-size", 1);
  if (!o.all("special").empty()) opt.specials = o.all("special");
  opt.text_field = o.get("field");
  opt.pretokenizer = data::parse_pretokenizer(o.get("pretokenizer"));
  int threads = o.get_int32("threads", 0, kMaxThreads);
  opt.threads = threads > 0 ? threads : int(std::max(1u, std::thread::hardware_concurrency()));
  double t0 = now_seconds();
  data::BpeTokenizer tok = data::train_bpe(o.all("input"), opt);
  data::save_loom_tokenizer(tok, o.get("out"));
  std::printf("trained %d tokens (%zu special) in %.1f s -> %s (use --tokenizer loom:%s)\n",
              tok.vocab_size(), tok.specials().size(), now_seconds() - t0, o.get("out").c_str(),
              o.get("out").c_str());
  return 0;
}

int tokenizer_encode(const Args& args) {
  Options o("loom tokenizer encode --vocab PATH < text",
            "Reads UTF-8 text on stdin and prints its token ids as one JSON array. Special-token\n"
            "strings in the text become their ids unless --no-special is given.");
  o.value("vocab", "", kTokenizerSpecHelp, true)
      .flag("no-special", "encode special-token strings as ordinary text")
      .flag("add-special-tokens",
            "add the tokenizer.json post-processor's tokens (Llama 2's <s>), as Hugging Face's "
            "add_special_tokens");
  if (!o.parse(args)) return 0;
  auto tok = data::load_tokenizer(o.get("vocab"));
  std::vector<int32_t> ids = tok->encode(read_stdin(), !o.has("no-special"));
  if (o.has("add-special-tokens")) tok->post_process(ids);
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(ids[i]);
  }
  out += "]\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

int tokenizer_decode(const Args& args) {
  Options o("loom tokenizer decode --vocab PATH < ids.json",
            "Reads a JSON array of token ids on stdin and writes the decoded bytes to stdout.");
  o.value("vocab", "", kTokenizerSpecHelp, true);
  if (!o.parse(args)) return 0;
  auto tok = data::load_tokenizer(o.get("vocab"));
  Json j = Json::parse(read_stdin(), "stdin");
  LOOM_CHECK(j.is_array(), "stdin: expected a JSON array of token ids");
  std::vector<int32_t> ids;
  const auto& arr = j.as_array();
  for (size_t i = 0; i < arr.size(); ++i) {
    // Checked in 64 bits before narrowing: 4294967297 is not token 1.
    try {
      ids.push_back(static_cast<int32_t>(arr[i].as_int(0, int64_t(tok->vocab_size()) - 1)));
    } catch (const Error& e) {
      fail("stdin: token id [", i, "]: ", e.what(), " (vocabulary of ", tok->vocab_size(), ")");
    }
  }
  std::string text = tok->decode(ids);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

int tokenizer_info(const Args& args) {
  Options o("loom tokenizer info --vocab PATH", "Prints a vocabulary's size and special tokens.");
  o.value("vocab", "", kTokenizerSpecHelp, true);
  if (!o.parse(args)) return 0;
  auto tok = data::load_tokenizer(o.get("vocab"));
  Json info = Json::object();
  info["vocab_size"] = int64_t(tok->vocab_size());
  const data::HfPipeline* hf = tok->hf_pipeline();
  // A tokenizer.json whose steps Loom's scanners do not run has no scanner name.
  info["pretokenizer"] = tok->backend()          ? "tokenizer.model"
                         : hf && hf->runs_encode ? "tokenizer.json"
                                                 : data::pretokenizer_name(tok->pretokenizer());
  info["model"] = tok->backend() ? "SentencePiece" : tok->unigram() ? "Unigram" : "BPE";
  info["byte_level"] = tok->byte_level();
  if (hf) {
    Json pre = Json::array(), post = Json::array();
    for (int32_t id : hf->prefix) pre.push_back(int64_t(id));
    for (int32_t id : hf->suffix) post.push_back(int64_t(id));
    info["add_special_tokens"]["before"] = std::move(pre);
    info["add_special_tokens"]["after"] = std::move(post);
  }
  info["token_dtype"] = data::dtype_name(data::dtype_for_vocab(tok->vocab_size()));
  Json sp = Json::object();
  for (auto& [text, id] : tok->specials()) sp[text] = int64_t(id);
  info["special_tokens"] = sp;
  std::printf("%s\n", info.dump(2).c_str());
  return 0;
}

int tokenizer_export(const Args& args) {
  Options o("loom tokenizer export --vocab SPEC --out DIR [--chat-template chatml|llama3|hf:PATH]",
            "Writes a vocabulary as Hugging Face tokenizer.json + tokenizer_config.json.");
  o.value("vocab", "", kTokenizerSpecHelp, true)
      .value("out", "", "output folder", true)
      .value("chat-template", "", "chat template written into tokenizer_config.json")
      .value("max-length", "1024", "model_max_length in tokenizer_config.json");
  if (!o.parse(args)) return 0;
  auto tok = data::load_tokenizer(o.get("vocab"));
  const std::string chat = o.get("chat-template");
  if (!chat.empty()) data::ChatTemplate check(chat, *tok);  // its markers must be tokens
  data::save_hf_tokenizer(*tok, o.get("out"), chat, o.get_int("max-length", 1, INT32_MAX));
  std::printf("wrote %s/tokenizer.json and tokenizer_config.json\n", o.get("out").c_str());
  return 0;
}

}  // namespace

int run_tokenizer(const Args& args) {
  const char* usage =
      "usage: loom tokenizer <train|encode|decode|info|export> [options]  (--help on each)\n";
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::fputs(usage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  Args rest(args.begin() + 1, args.end());
  if (args[0] == "train") return tokenizer_train(rest);
  if (args[0] == "encode") return tokenizer_encode(rest);
  if (args[0] == "decode") return tokenizer_decode(rest);
  if (args[0] == "info") return tokenizer_info(rest);
  if (args[0] == "export") return tokenizer_export(rest);
  fail("unknown subcommand 'tokenizer ", args[0], "' (train, encode, decode, info, export)");
}

}  // namespace loom::cli
