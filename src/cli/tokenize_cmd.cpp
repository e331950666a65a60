// `loom tokenize`: JSONL -> Megatron-compatible PREFIX.bin / PREFIX.idx token files.
#include <algorithm>
#include <cstdio>
#include <thread>

#include "cli/command.h"
#include "cli/options.h"
#include "core/error.h"
#include "data/bpe.h"
#include "data/chat.h"
#include "data/chat_tokens.h"
#include "data/tokenize_job.h"

namespace loom::cli {

int run_tokenize(const Args& args) {
  Options o(
      "loom tokenize --input FILE.jsonl [--input ...] --tokenizer SPEC --out PREFIX",
      "Tokenizes the text field of every JSONL line into PREFIX.bin + PREFIX.idx (Megatron-LM\n"
      "indexed format; uint16 ids when the vocabulary fits, else int32), one document per\n"
      "line. Streaming and multi-threaded; outputs appear only when the run succeeds.\n"
      "With --chat: chat JSONL ({\"messages\": [...]} or {\"prompt\", \"completion\"}) rendered\n"
      "by --chat-template, one sequence per example, plus PREFIX.mask.bin/.idx (uint8, 1 where\n"
      "the loss trains) for data.source = \"chat_tokens\" (docs/finetuning.md).");
  o.multi("input", "JSONL file (repeatable; read in the order given)")
      .value("tokenizer", "", kTokenizerSpecHelp, true)
      .value("out", "", "output prefix: writes PREFIX.bin and PREFIX.idx", true)
      .value("field", "text", "JSON field holding each document's text")
      .flag("append-eod", "append <|endoftext|> to every document")
      .value("workers", "0", "encoding threads (0: all cores)")
      .flag("chat",
            "chat JSONL -> token files + loss-mask files (one thread; errors name the line)")
      .value("chat-template", "chatml", "with --chat: chatml, llama3 or hf:PATH")
      .value("on-error", "skip",
             "malformed lines (bad JSON, missing field, invalid UTF-8): skip "
             "(count and report) or fail");
  if (!o.parse(args)) return 0;
  LOOM_CHECK(!o.all("input").empty(), "missing required option --input (see --help)");
  std::string on_error = o.get("on-error");
  LOOM_CHECK(on_error == "skip" || on_error == "fail", "--on-error must be skip or fail, got '",
             on_error, "'");
  const int workers = o.get_int32("workers", 0, kMaxThreads);  // before any file is read
  auto tok = data::load_tokenizer(o.get("tokenizer"));
  if (o.has("chat")) {
    LOOM_CHECK(o.get("field") == "text" && !o.has("append-eod"),
               "--chat renders whole conversations: --field and --append-eod do not apply");
    const data::ChatTemplate t(o.get("chat-template"), *tok);
    const data::ChatTokenStats st =
        data::write_chat_token_files(o.all("input"), t, tok->vocab_size(), o.get("out"));
    std::printf("%lld examples, %lld tokens (%lld trained) -> %s.bin/.idx + %s.bin/.idx\n",
                (long long)st.examples, (long long)st.tokens, (long long)st.trained_tokens,
                o.get("out").c_str(), data::chat_mask_prefix(o.get("out")).c_str());
    return 0;
  }
  data::TokenizeOptions opt;
  opt.inputs = o.all("input");
  opt.field = o.get("field");
  opt.output_prefix = o.get("out");
  opt.append_eod = o.has("append-eod");
  opt.workers = workers > 0 ? workers : int(std::max(1u, std::thread::hardware_concurrency()));
  opt.skip_errors = on_error == "skip";
  data::TokenizeStats st = data::tokenize_jsonl(*tok, opt);
  std::printf(
      "%lld documents, %llu tokens, %lld lines skipped, %.1f MB in %.1f s (%.1f MB/s) -> "
      "%s.bin/.idx\n",
      (long long)st.documents, (unsigned long long)st.tokens, (long long)st.skipped,
      double(st.input_bytes) / 1e6, st.seconds,
      double(st.input_bytes) / 1e6 / std::max(st.seconds, 1e-9), opt.output_prefix.c_str());
  return 0;
}

}  // namespace loom::cli
