// HTML to text: main-content extraction with gumbo. Scripts, styles, navigation, menus,
// headers and footers, forms and elements whose class/id/role names boilerplate are dropped;
// the main/article element is preferred when present; blocks that are mostly link text are
// dropped; paragraphs, headings and list items are kept as text (blank line between blocks,
// "- " before list items).
#pragma once

#include <string>
#include <string_view>

namespace loom::curate {

struct ExtractOptions {
  double max_link_density = 0.5;  // blocks whose link text exceeds this fraction are dropped
  bool prefer_main = true;        // restrict to <main>/<article> when the page has one
};

struct Extracted {
  std::string text, title;
  int blocks_kept = 0, blocks_dropped_links = 0, elements_dropped = 0;
};

Extracted extract_main_text(std::string_view html, const ExtractOptions& opt);

}  // namespace loom::curate
