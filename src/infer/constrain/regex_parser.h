// Regular expressions (the common syntax of Python's re, JavaScript and vLLM's guided_regex)
// parsed into a byte regex: literals, '.' (any character but \n \r U+2028 U+2029, as in
// ECMAScript, the dialect of JSON Schema's patterns), classes with ranges and negation, \d \w \s
// and their negations, \xHH and \uHHHH escapes, groups ((...), (?:...), named), alternation, and
// the quantifiers * + ? {n} {n,} {n,m} (a lazy '?' suffix only changes which match a search
// prefers, so it is accepted). '^' and '$' are taken at the ends of the pattern only. Features
// a finite automaton cannot express (backreferences, lookaround, word boundaries, possessive
// quantifiers) are refused naming the feature and its offset.
#pragma once

#include <functional>
#include <string_view>

#include "infer/constrain/byte_regex.h"

namespace loom::infer::constrain {

// How a character set is written as bytes: UTF-8 (rx_utf8) for raw text, or escaped as a JSON
// string's content (json_schema.h).
using CharEncoder = std::function<Rx(const CpRanges&)>;

struct ParsedRegex {
  Rx rx;
  bool anchored_start = false, anchored_end = false;  // the pattern began with ^ / ended with $
};

// Throws loom::Error "regex: <what> at offset N".
ParsedRegex parse_regex(std::string_view pattern, const CharEncoder& encode = rx_utf8);

}  // namespace loom::infer::constrain
