// curate/html_extract: main-text extraction from any bytes, with and without the main/article
// preference.
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "curate/html_extract.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view html(reinterpret_cast<const char*>(data), size);
  for (bool prefer_main : {true, false}) {
    loom::curate::ExtractOptions opt;
    opt.prefer_main = prefer_main;
    try {
      (void)loom::curate::extract_main_text(html, opt);
    } catch (const loom::Error&) {
    }
  }
  return 0;
}
