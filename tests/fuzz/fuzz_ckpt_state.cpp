// ckpt/checkpoint: opening a checkpoint root (input: latest, separator, state.json, separator,
// model.safetensors, separator, optim.safetensors; the step folder is step_00000001).
#include <cstdint>
#include <string_view>

#include "ckpt/checkpoint.h"
#include "core/error.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto parts = loom::fuzz::split_parts({reinterpret_cast<const char*>(data), size}, 4);
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
