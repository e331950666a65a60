// One document flowing through the curation pipeline.
#pragma once

#include <cstdint>
#include <string>

#include "core/json.h"

namespace loom::curate {

struct Doc {
  Json record;         // every input field except the text; stages add their fields here
  std::string text;    // the text the stages read and rewrite
  std::string id;      // from the id field, or derived from file and line ("<file>:<line>")
  std::string source;  // "<file>:<line>" (or record number) for messages
  int64_t input_bytes = 0;
};

}  // namespace loom::curate
