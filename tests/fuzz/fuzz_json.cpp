// core/json: the strict parser, and dump() as its inverse (a parsed document dumps to text
// that parses back to the same dump).
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "core/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  loom::Json doc;
  try {
    doc = loom::Json::parse(text, "fuzz.json");
  } catch (const loom::Error&) {
    return 0;
  }
  // dump() writes valid JSON that reads back to itself. The first trip may normalise (floats
  // keep 9 significant digits, -0 reads back as the integer 0), so the fixed point is checked
  // from the second dump on.
  for (int indent : {0, 2}) {
    std::string once = loom::Json::parse(doc.dump(indent), "dump").dump(indent);
    std::string twice = loom::Json::parse(once, "dump").dump(indent);
    if (once != twice) __builtin_trap();
  }
  return 0;
}
