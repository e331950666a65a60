// core/config: Config::parse(text, where), the run configuration reader, and the typed
// getters over whatever keys it produced.
#include <cstdint>
#include <string>

#include "core/config.h"
#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    loom::Config cfg = loom::Config::parse(text, "fuzz.toml");
    for (const std::string& key : cfg.keys()) {
      // Each getter either converts the value or throws loom::Error naming the key.
      try {
        (void)cfg.get_string(key, "");
      } catch (const loom::Error&) {
      }
      try {
        (void)cfg.get_int(key, 0);
      } catch (const loom::Error&) {
      }
      try {
        (void)cfg.get_double(key, 0);
      } catch (const loom::Error&) {
      }
      try {
        (void)cfg.get_bool(key, false);
      } catch (const loom::Error&) {
      }
    }
    (void)cfg.dump();
  } catch (const loom::Error&) {
  }
  return 0;
}
