// ckpt/safetensors: SafetensorsReader over a whole file (header length, JSON header, offsets,
// shard metadata), then every tensor read back through view() and load().
#include <cstdint>
#include <string_view>

#include "ckpt/safetensors.h"
#include "core/error.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto path = loom::fuzz::scratch_dir() / "fuzz.safetensors";
  loom::fuzz::write_bytes(path, bytes);
  try {
    loom::ckpt::SafetensorsReader reader(path.string());
    for (const auto& e : reader.entries()) {
      (void)reader.view(e.name);
      (void)reader.load_named(e.name);
    }
  } catch (const loom::Error&) {
  }
  return 0;
}
