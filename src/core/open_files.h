// The process's limit on open descriptors: a server or load client holding thousands of
// connections needs one each, past the soft limit many systems start with (1024).
#pragma once

namespace loom {

// Raises the soft limit on open descriptors to the hard one (best effort: failing, connections
// past it are refused as before).
void raise_open_file_limit();

}  // namespace loom
