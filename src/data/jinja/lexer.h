// Splits Jinja template source into text and the tokens of its {{ }} and {% %} tags, applying
// whitespace control as Jinja's lexer does: {%- / -%} (and {{- -}}, {#- -#}) strip all whitespace
// on that side, trim_blocks drops the first newline after a block or comment tag,
// lstrip_blocks drops spaces and tabs from the start of a line up to a block or comment tag,
// {%+ / +%} turn those two off for one tag. Comments disappear; {% raw %} text is kept as is.
// Newlines are normalised to \n and one trailing newline is dropped (keep_trailing_newline off).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace loom::data::jinja {

struct Token {
  enum Kind { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };
  Kind kind;
  std::string text;  // Text, Name, String (unescaped), Op
  int line = 1;
  int64_t i = 0;
  double d = 0;
};

struct LexOptions {
  bool trim_blocks = true;  // Hugging Face's settings
  bool lstrip_blocks = true;
};

// Throws loom::Error naming `where` and the line of a malformed tag.
std::vector<Token> lex(const std::string& source, const LexOptions& opt, const std::string& where);

}  // namespace loom::data::jinja
