// The chat and preference readers: a JSONL file read as chat data (data/chat.h, as
// data.source = "chat" and `loom tokenize --chat` read it) and as preference pairs
// (train/preference_source.h, data.source = "preference"), rendered by the ChatML template of a
// byte tokenizer; every batch of the pairs is drawn. Bad lines must be a loom::Error.
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "data/bpe.h"
#include "data/chat.h"
#include "fuzz_util.h"
#include "train/batch.h"
#include "train/preference_source.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string tok = [] {
    const std::string dir = (loom::fuzz::scratch_dir() / "tok").string();
    loom::data::save_loom_tokenizer(loom::data::byte_chatml_tokenizer(), dir);
    return "loom:" + dir;
  }();
  const auto dir = loom::fuzz::fresh_dir("chat");
  const std::string path = (dir / "data.jsonl").string();
  loom::fuzz::write_bytes(path, std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    auto t = loom::data::byte_chatml_tokenizer();
    loom::data::ChatTemplate chat("chatml", t);
    auto examples = loom::data::load_chat_jsonl(path, chat);
    for (const auto& ex : examples)
      if (ex.ids.size() != ex.mask.size()) __builtin_trap();
  } catch (const loom::Error&) {
  }
  try {
    loom::PreferenceSource pairs(path, tok, "chatml", 2, 16, 1, 0.0, "train");
    loom::Batch b;
    for (int i = 0; i < 3; ++i) pairs.next(b);
  } catch (const loom::Error&) {
  }
  return 0;
}
