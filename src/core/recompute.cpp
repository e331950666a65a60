#include "core/recompute.h"

#include "core/error.h"

namespace loom {

Recompute recompute_from_name(const std::string& s) {
  if (s == "none") return Recompute::None;
  if (s == "selective") return Recompute::Selective;
  if (s == "full") return Recompute::Full;
  fail("unknown recompute '", s, "' (valid: none, selective, full)");
}

const char* recompute_name(Recompute r) {
  return r == Recompute::None ? "none" : r == Recompute::Selective ? "selective" : "full";
}

}  // namespace loom
