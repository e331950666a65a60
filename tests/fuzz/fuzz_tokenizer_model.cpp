// data/spm_tokenizer: a SentencePiece tokenizer.model (input: the file) loaded through
// libsentencepiece, then used on a short text (encode, decode, streaming) and written back out.
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "data/hf_tokenizer.h"
#include "data/spm_tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto dir = loom::fuzz::fresh_dir("tokenizer_model");
  loom::fuzz::write_bytes(dir / "tokenizer.model", bytes);
  try {
    loom::data::BpeTokenizer tok = loom::data::load_spm_tokenizer(dir.string());
    std::vector<int32_t> ids =
        tok.encode("Hello world, <s> 123 \xc3\xa9t\xc3\xa9 \xf0\x9f\x98\x80");
    tok.post_process(ids);
    std::string streamed;
    for (int32_t id : ids) tok.decode_append(id, streamed);
    (void)tok.decode(ids);
    loom::data::save_hf_tokenizer(tok, (dir / "out").string(), "", 128);
  } catch (const loom::Error&) {
  }
  return 0;
}
