// Config integers for settings held in an int. Kept out of config.h, which nearly every file
// includes, so that adding a getter does not rebuild the project.
#pragma once

#include <cstdint>
#include <string>

#include "core/config.h"

namespace loom {

// As Config::get_int with bounds, at most int32's range: a value past them fails naming the key
// and where it was set, so model.n_layer = 4294967298 is an error, never 2 layers (what
// static_cast<int> of the int64 made of it).
inline int get_int32(const Config& cfg, const std::string& key, int def, int lo = INT32_MIN,
                     int hi = INT32_MAX) {
  return static_cast<int>(cfg.get_int(key, def, lo, hi));
}

}  // namespace loom
