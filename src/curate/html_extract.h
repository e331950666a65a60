// HTML to text: main-content extraction with gumbo. Scripts, styles, navigation, menus,
// headers and footers, forms and elements whose class/id/role names boilerplate are dropped;
// the main/article element is preferred when present; blocks that are mostly link text are
// dropped; paragraphs, headings and list items are kept as text (blank line between blocks,
// "- " before list items).
//
// One document's cost is bounded: gumbo allocates through a counting allocator that abandons
// the parse past `max_parse_bytes` (reason too_large), and the tree is walked with an explicit
// stack that gives up past `max_depth` nested elements (reason too_deep), so neither a deep
// nor a quadratically expanding page can exhaust the stack or the memory of a worker.
#pragma once

#include <string>
#include <string_view>

namespace loom::curate {

struct ExtractOptions {
  double max_link_density = 0.5;        // blocks whose link text exceeds this fraction are dropped
  bool prefer_main = true;              // restrict to <main>/<article> when the page has one
  size_t max_parse_bytes = 256u << 20;  // gumbo's live memory for one page
  size_t max_depth = 1000;              // nested elements in the parsed tree
};

struct Extracted {
  std::string text, title;
  int blocks_kept = 0, blocks_dropped_links = 0, elements_dropped = 0;
  // Non-empty when a limit stopped the extraction ("too_large" or "too_deep"); `limit` then
  // says which limit and its value, and text/title are empty.
  std::string rejected, limit;
};

Extracted extract_main_text(std::string_view html, const ExtractOptions& opt);

}  // namespace loom::curate
