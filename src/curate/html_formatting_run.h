// The longest run of formatting elements that an HTML page opens one inside the other
// (<b id=1><b id=2>...), found by a linear scan before gumbo parses the page.
//
// gumbo's time on such a run grows with the square of its length: each formatting start tag is
// compared, attribute by attribute, with every element of the list of active formatting elements
// back to the last marker (the tree builder's "Noah's Ark" check), and elements whose attributes
// differ never leave that list (7,999 unclosed <b id=k>: 0.5 s a parse, 99% of it in gumbo).
// The tree builder nests each element of the run inside the one before and no later step takes
// them apart (the adoption agency moves only special elements and the children of one; the one
// step that removes nodes, a <frameset> start tag taking out the body, is ruled out by finding
// none in the page), so a run of n elements is a tree deeper than n: a run past max_depth is a
// page that the parse would refuse as too deep, and html_extract refuses it without parsing.
//
// The scan reads tags as the HTML tokenizer does (quoted attribute values, comments, DOCTYPE)
// and stops at the first element that changes how later tags are read or inserted (select,
// raw text and script, template, SVG and MathML) or at markup it does not model (bogus
// comments, "<?", a tag cut off by the end of the page): what comes after is not counted, so
// it never reports a run that the parse would not nest. A property test checks this against
// gumbo's trees of random pages (tests/curate/html_formatting_run_test.cpp).
#pragma once

#include <cstddef>
#include <string_view>

namespace loom::curate {

// Formatting start tags (b, big, code, em, font, i, s, small, strike, strong, tt, u; not
// self-closed) in a row, with only text and comments between them; the scan ends early once
// a run passes stop_after.
size_t longest_formatting_run(std::string_view html, size_t stop_after);

}  // namespace loom::curate
