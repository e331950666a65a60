// Unicode NFC and NFKC for tokenizers whose tokenizer.json asks for them (Qwen2's "normalizer":
// NFC).
// Uses utf8proc where the build found it (an optional Debian library, as for curation);
// without it nfc_available() is false and such tokenizers are refused when loaded.
#pragma once

#include <string>
#include <string_view>

namespace loom::data {

bool nfc_available();
// NFC of `text`; bytes that are not valid UTF-8 leave the text as it is (Hugging Face only ever
// sees valid UTF-8; Loom's tokenizers accept any bytes). Pure ASCII is returned untouched.
std::string nfc(std::string_view text);
std::string nfkc(std::string_view text);  // the same rules for NFKC

}  // namespace loom::data
