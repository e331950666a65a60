// data/hf_tokenizer: a Hugging Face tokenizer.json (input: the file) loaded, then used on a
// short text (encode, decode) and written back out.
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "data/hf_tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto dir = loom::fuzz::fresh_dir("tokenizer_hf");
  loom::fuzz::write_bytes(dir / "tokenizer.json", text);
  try {
    loom::data::BpeTokenizer tok = loom::data::load_hf_tokenizer(dir.string());
    (void)tok.decode(tok.encode("Hello world, <|endoftext|> 123 \xc3\xa9t\xc3\xa9"));
    (void)loom::data::hf_tokenizer_json(tok).dump();
  } catch (const loom::Error&) {
  }
  return 0;
}
