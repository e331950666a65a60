// `loom ckpt verify`: every checkpoint of a run checked against its commit record, and for a
// distributed run every global commit record against the ranks' parts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::ckpt {

struct VerifyEntry {
  std::string dir;  // a step directory (or, for a missing part, where it should be)
  int64_t step = -1;
  std::string error;  // empty: verified
  std::string note;   // for a verified part: why resume would still ignore it, if it would
};

// `path`: a run directory (holding checkpoints/), a checkpoints root, a rank's root, or one step
// directory. Entries in path order. Throws when `path` holds no checkpoint at all.
std::vector<VerifyEntry> verify_checkpoints(const std::string& path);

}  // namespace loom::ckpt
