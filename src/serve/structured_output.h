// Structured outputs for `loom serve`: a request's constraint (structured_request.h) compiled
// to a token automaton over the served tokenizer's vocabulary (infer/constrain/), cached by
// what it constrains to. A call that tool_choice forces is constrained to the template's call
// format (data/chat_tools.h) with each tool's parameters as the arguments' schema.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "data/bpe.h"
#include "infer/constrain/constraint_cache.h"
#include "serve/structured_request.h"

namespace loom::serve {

class StructuredOutputs {
 public:
  // tok null: a byte-level model (token t < 256 is byte t).
  explicit StructuredOutputs(const data::BpeTokenizer* tok);
  // The request's constraint, or null when it has none. Every tool's parameters are compiled
  // (checked) whether or not a call is forced. Throws ApiError (400) naming the field and the
  // schema keyword or regex feature refused.
  std::shared_ptr<const infer::constrain::TokenConstraint> constraint(
      const StructuredRequest& s, const std::string& template_name);

 private:
  infer::constrain::ConstraintCache cache_;
};

}  // namespace loom::serve
