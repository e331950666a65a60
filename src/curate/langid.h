// Language identification (CLD2) over a bounded sample of the document.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace loom::curate {

struct LangResult {
  std::string code;  // ISO 639-1 where CLD2 has one ("en"), "un" for unknown
  double score = 0;  // fraction of the text in that language, halved if CLD2 calls it unreliable
};

// What CLD2 reads of a document: the whole text when it has at most `max_bytes` bytes (or
// max_bytes is 0), otherwise kSampleWindows windows of max_bytes / kSampleWindows bytes spread
// evenly from the first byte to the last, each cut at whitespace where one is near and always
// at UTF-8 character boundaries, joined by newlines. Cost per document is then bounded, as in
// CLD3 (which reads only a document's first 1000 bytes by default), while a language that
// fills the middle or the end of a long document still counts towards the score.
inline constexpr int kSampleWindows = 4;
// The langid stage's default `sample_bytes`: four windows of 256 bytes. On the short web-like
// documents of bench_curate (`--langid-study 1`) it decides as whole documents up to 4096
// bytes do (no document kept or rejected otherwise) at twice the speed.
inline constexpr size_t kDefaultSampleBytes = 1024;
std::string_view language_sample(std::string_view text, size_t max_bytes, std::string& scratch);

LangResult detect_language(std::string_view text, size_t max_bytes = 0);

}  // namespace loom::curate
