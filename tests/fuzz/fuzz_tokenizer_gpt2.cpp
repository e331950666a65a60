// data/bpe_io: a GPT-2 tokenizer folder (input: encoder.json, separator, vocab.bpe) loaded,
// then used on a short text (encode, decode).
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "data/bpe.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parts = loom::fuzz::split_parts({reinterpret_cast<const char*>(data), size}, 2);
  auto dir = loom::fuzz::fresh_dir("gpt2");
  loom::fuzz::write_bytes(dir / "encoder.json", parts[0]);
  loom::fuzz::write_bytes(dir / "vocab.bpe", parts[1]);
  try {
    loom::data::BpeTokenizer tok = loom::data::load_gpt2_tokenizer(dir.string());
    (void)tok.decode(tok.encode("Hello world, <|endoftext|> 123 \xc3\xa9t\xc3\xa9"));
  } catch (const loom::Error&) {
  }
  return 0;
}
