// data/bpe_io: a tiktoken rank file (input: ranks, separator, optional tokenizer.json-style
// sidecar with pretokenizer and special tokens) loaded, then used on a short text.
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "data/bpe.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parts = loom::fuzz::split_parts({reinterpret_cast<const char*>(data), size}, 2);
  auto dir = loom::fuzz::fresh_dir("tiktoken");
  auto path = dir / "vocab.tiktoken";
  loom::fuzz::write_bytes(path, parts[0]);
  if (!parts[1].empty()) loom::fuzz::write_bytes(dir / "vocab.tiktoken.json", parts[1]);
  try {
    loom::data::BpeTokenizer tok = loom::data::load_tiktoken(path.string());
    (void)tok.decode(tok.encode("Hello world, <|endoftext|> 123 \xc3\xa9t\xc3\xa9"));
  } catch (const loom::Error&) {
  }
  return 0;
}
