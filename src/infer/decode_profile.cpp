#include "infer/decode_profile.h"

namespace loom::infer {
namespace {

std::atomic<DecodeProfile*> g_profile{nullptr};

}  // namespace

DecodeProfile* decode_profile() {
  return g_profile.load(std::memory_order_relaxed);
}

void set_decode_profile(DecodeProfile* p) {
  g_profile.store(p, std::memory_order_relaxed);
}

}  // namespace loom::infer
