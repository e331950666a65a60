// ckpt/checkpoint: opening a checkpoint root (input: latest, separator, state.json, separator,
// model.safetensors, separator, optim.safetensors; the step folder is step_00000001).
#include <cstdint>
#include <string_view>

#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parts = loom::fuzz::split_parts({reinterpret_cast<const char*>(data), size}, 4);
  if (loom::fuzz::json_text_hits_as_int_defect(parts[1])) return 0;  // see fuzz_util.h
  for (int i : {2, 3}) {
    if (parts[i].size() < 8) continue;
    uint64_t n = 0;
    for (int b = 7; b >= 0; --b) n = (n << 8) | uint8_t(parts[i][b]);
    if (n <= parts[i].size() - 8 && loom::fuzz::json_text_hits_as_int_defect(parts[i].substr(8, n)))
      return 0;
  }
  auto root = loom::fuzz::fresh_dir("ckpt");
  auto step = root / "step_00000001";
  std::filesystem::create_directories(step);
  loom::fuzz::write_bytes(root / "latest", parts[0]);
  loom::fuzz::write_bytes(step / "state.json", parts[1]);
  loom::fuzz::write_bytes(step / "model.safetensors", parts[2]);
  loom::fuzz::write_bytes(step / "optim.safetensors", parts[3]);
  try {
    loom::ckpt::Checkpoint ckpt(root.string());
    (void)ckpt.state();
  } catch (const loom::Error&) {
  }
  return 0;
}
