#include "curate/html_formatting_run.h"

#include <algorithm>
#include <initializer_list>

namespace loom::curate {
namespace {

constexpr size_t kNotFound = std::string_view::npos;

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f';
}
bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}
char lower(char c) {
  return c >= 'A' && c <= 'Z' ? char(c + 32) : c;
}

// Whether a tag name (as written) is one of `names` (lower case), ignoring ASCII case.
bool name_is_one_of(std::string_view name, std::initializer_list<std::string_view> names) {
  return std::any_of(names.begin(), names.end(), [&](std::string_view n) {
    return n.size() == name.size() && std::equal(n.begin(), n.end(), name.begin(),
                                                 [](char a, char b) { return a == lower(b); });
  });
}
// Formatting elements that the tree builder always nests (<a> and <nobr> close an open one).
bool nests_as_formatting(std::string_view name) {
  return name_is_one_of(
      name, {"b", "big", "code", "em", "font", "i", "s", "small", "strike", "strong", "tt", "u"});
}
// Start tags after which tags are read as text, ignored, or inserted by other rules.
bool changes_parsing(std::string_view name) {
  return name_is_one_of(
      name, {"select", "plaintext", "xmp", "iframe", "noembed", "noframes", "noscript", "script",
             "style", "textarea", "title", "template", "svg", "math"});
}

// The end of a tag whose name ends at `i`: its attributes read as the tokenizer reads them (a
// quoted value may hold '>'). Returns the index after the closing '>' (kNotFound when the page
// ends inside the tag, which the tokenizer then drops) and whether the tag ended in "/>".
size_t tag_end(std::string_view h, size_t i, bool* self_closing) {
  enum {
    kBeforeName,
    kName,
    kAfterName,
    kBeforeValue,
    kUnquoted,
    kAfterQuoted
  } state = kBeforeName;
  *self_closing = false;
  while (i < h.size()) {
    const char c = h[i];
    if (c == '>') return i + 1;  // in every state here (a missing value, too)
    if (c == '/' &&
        (state == kBeforeName || state == kName || state == kAfterName || state == kAfterQuoted)) {
      // "/>" closes the tag; a '/' before anything else is dropped.
      if (i + 1 < h.size() && h[i + 1] == '>') {
        *self_closing = true;
        return i + 2;
      }
      state = kBeforeName;
      ++i;
      continue;
    }
    switch (state) {
      case kBeforeName:
        if (!is_space(c)) state = kName;  // '=' here starts a name
        break;
      case kName:
        if (is_space(c)) state = kAfterName;
        if (c == '=') state = kBeforeValue;
        break;
      case kAfterName:
        if (c == '=')
          state = kBeforeValue;
        else if (!is_space(c))
          state = kName;
        break;
      case kBeforeValue:
        if (c == '"' || c == '\'') {
          i = h.find(c, i + 1);
          if (i == kNotFound) return kNotFound;
          state = kAfterQuoted;
        } else if (!is_space(c)) {
          state = kUnquoted;
        }
        break;
      case kUnquoted:
        if (is_space(c)) state = kBeforeName;
        break;
      case kAfterQuoted:
        state = kBeforeName;
        if (!is_space(c)) continue;  // read again as the start of a name
        break;
    }
    ++i;
  }
  return kNotFound;
}

// The end of a comment that starts at `i` ("<!--"), or kNotFound.
size_t comment_end(std::string_view h, size_t i) {
  const std::string_view rest = h.substr(i + 4);
  if (rest.starts_with(">")) return i + 5;   // "<!-->"
  if (rest.starts_with("->")) return i + 6;  // "<!--->"
  for (size_t d = rest.find("--"); d != kNotFound; d = rest.find("--", d + 1)) {
    if (rest.substr(d + 2).starts_with(">")) return i + 4 + d + 3;
    if (rest.substr(d + 2).starts_with("!>")) return i + 4 + d + 4;
  }
  return kNotFound;
}

}  // namespace

size_t longest_formatting_run(std::string_view h, size_t stop_after) {
  // A <frameset> start tag in the body removes the body from the tree while nothing but
  // whitespace, formatting elements and a few others have been seen (the frameset-ok flag): a
  // page that has one anywhere is left to the parse.
  for (size_t i = h.find('<'); i != kNotFound; i = h.find('<', i + 1))
    if (h.size() - i >= 9 && name_is_one_of(h.substr(i + 1, 8), {"frameset"})) return 0;
  size_t run = 0, longest = 0;
  for (size_t i = h.find('<'); i != kNotFound && i + 1 < h.size(); i = h.find('<', i)) {
    const char c = h[i + 1];
    if (c == '!') {  // a comment or a DOCTYPE: nothing is opened or closed
      size_t end = kNotFound;
      if (h.substr(i).starts_with("<!--")) {
        end = comment_end(h, i);
      } else if (h.size() - i >= 9 && name_is_one_of(h.substr(i + 2, 7), {"doctype"})) {
        end = h.find('>', i);
        if (end != kNotFound) ++end;
      }
      if (end == kNotFound) return longest;  // a bogus comment or the end of the page
      i = end;
      continue;
    }
    const bool end_tag = c == '/';
    const size_t name_at = i + 1 + (end_tag ? 1 : 0);
    if (name_at >= h.size() || !is_alpha(h[name_at])) {
      if (end_tag || c == '?') return longest;  // "</>", a bogus comment
      ++i;                                      // '<' as text
      continue;
    }
    size_t name_end = name_at;
    while (name_end < h.size() && !is_space(h[name_end]) && h[name_end] != '/' &&
           h[name_end] != '>')
      ++name_end;
    const std::string_view name = h.substr(name_at, name_end - name_at);
    bool self_closing = false;
    const size_t after = tag_end(h, name_end, &self_closing);
    if (after == kNotFound || (!end_tag && changes_parsing(name))) return longest;
    if (!end_tag && !self_closing && nests_as_formatting(name)) {
      longest = std::max(longest, ++run);
      if (longest > stop_after) return longest;
    } else {
      run = 0;
    }
    i = after;
  }
  return longest;
}

}  // namespace loom::curate
