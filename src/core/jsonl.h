// JSON Lines files read whole: each non-blank line parsed, errors naming "path:line".
#pragma once

#include <functional>
#include <string>

#include "core/json.h"

namespace loom {

// Calls fn(value, where) for every line of `path` that is not blank (spaces, tabs, a CR), in
// order, `where` being "path:line" (1-based) for fn's own errors. A line that is not JSON
// throws naming its place; a missing file throws naming the path.
void for_each_jsonl(const std::string& path,
                    const std::function<void(const Json&, const std::string&)>& fn);

}  // namespace loom
