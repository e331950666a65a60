// Language identification (CLD2).
#pragma once

#include <string>
#include <string_view>

namespace loom::curate {

struct LangResult {
  std::string code;  // ISO 639-1 where CLD2 has one ("en"), "un" for unknown
  double score = 0;  // fraction of the text in that language, halved if CLD2 calls it unreliable
};

LangResult detect_language(std::string_view text);

}  // namespace loom::curate
