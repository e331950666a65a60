// Helpers shared by the tokenizer file readers and writers (bpe_io.cpp, hf_tokenizer.cpp).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace loom::data {

// GPT-2's byte-level alphabet (Hugging Face's ByteLevel): every byte is written as one
// printable code point, printable Latin-1 bytes as themselves, the other 68 as U+0100.. in byte
// order, so a vocabulary of arbitrary bytes fits in JSON strings and merge lines.
uint32_t byte_level_codepoint(uint8_t b);
// Bytes of a byte-level token string (UTF-8 of alphabet code points); false when `s` holds
// anything else.
bool byte_level_decode(std::string_view s, std::string* out);
std::string byte_level_encode(std::string_view bytes);

// Token ids index a vector, so a file's largest id sets its memory: a few lines claiming id
// 999999999 must not allocate gigabytes. Ids may leave holes (special tokens' slots) but at
// most kMaxIdHoles, far more than any real vocabulary has. Throws naming `where`.
inline constexpr size_t kMaxIdHoles = size_t(1) << 16;
void check_id_bound(size_t max_id, size_t n_entries, const std::string& where);

}  // namespace loom::data
