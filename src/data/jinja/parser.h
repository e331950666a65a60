// Parses the tokens of a template (lexer.h) into statements (ast.h). The subset chat templates
// use: if/elif/else, for (with else, an if filter, tuple targets, break/continue), set (names,
// tuples, namespace attributes, blocks), macros, Hugging Face's generation blocks, and the full
// expression grammar of Jinja. Anything else (include, extends, call, filter blocks, recursive
// loops, *args) is refused naming the construct and its line.
#pragma once

#include <string>
#include <vector>

#include "data/jinja/ast.h"
#include "data/jinja/lexer.h"

namespace loom::data::jinja {

// Throws loom::Error "<where>:<line>: ..." on a syntax error or an unsupported construct.
Body parse(const std::vector<Token>& tokens, const std::string& where);

}  // namespace loom::data::jinja
