// A parsed Jinja template and its rendering: the subset of Jinja 3 that Hugging Face chat
// templates use (see parser.h for the statements, builtins.h for filters, tests and methods).
// Parsing refuses what the subset lacks (an unknown tag, filter or test) naming the construct
// and its line; rendering errors name the line too. Undefined variables print as nothing and
// test false, as Jinja's default Undefined does; using one further (an attribute of it,
// arithmetic) is an error.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "data/jinja/ast.h"
#include "data/jinja/lexer.h"
#include "data/jinja/value.h"

namespace loom::data::jinja {

struct Rendered {
  std::string text;
  // Byte ranges of text written inside {% generation %} blocks (Hugging Face's marker of what
  // an assistant generates), in order.
  std::vector<std::pair<size_t, size_t>> generation;
};

class Template {
 public:
  // `where` names the source in errors ("tokenizer_config.json chat_template").
  Template(const std::string& source, const std::string& where, const LexOptions& opt = {});
  // Renders with `globals` as the template's variables (beside range, namespace and dict).
  Rendered render(const Dict& globals) const;
  bool has_generation_blocks() const { return has_generation_; }

 private:
  std::string where_;
  Body body_;
  bool has_generation_ = false;
};

}  // namespace loom::data::jinja
