// The pre-parse scan for runs of nested formatting elements (curate/html_formatting_run.h): what
// it counts, where it stops, and that gumbo's tree is always deeper than the run it reports.
#include <gtest/gtest.h>
#include <gumbo.h>

#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "curate/html_extract.h"
#include "curate/html_formatting_run.h"

using namespace loom::curate;

namespace {

constexpr size_t kAll = 1000000;  // no early stop

std::string distinct_b(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += "<b id=" + std::to_string(i) + ">";
  return s;
}

// The longest chain of formatting elements in gumbo's tree, each the parent of the next.
size_t gumbo_formatting_chain(const std::string& html) {
  const auto formatting = [](const GumboNode* n) {
    if (n->type != GUMBO_NODE_ELEMENT || n->v.element.tag_namespace != GUMBO_NAMESPACE_HTML)
      return false;
    switch (n->v.element.tag) {
      case GUMBO_TAG_B:
      case GUMBO_TAG_BIG:
      case GUMBO_TAG_CODE:
      case GUMBO_TAG_EM:
      case GUMBO_TAG_FONT:
      case GUMBO_TAG_I:
      case GUMBO_TAG_S:
      case GUMBO_TAG_SMALL:
      case GUMBO_TAG_STRIKE:
      case GUMBO_TAG_STRONG:
      case GUMBO_TAG_TT:
      case GUMBO_TAG_U:
        return true;
      default:
        return false;
    }
  };
  GumboOutput* g = gumbo_parse_with_options(&kGumboDefaultOptions, html.data(), html.size());
  size_t longest = 0;
  std::vector<std::pair<const GumboNode*, size_t>> todo = {{g->root, 0}};  // chain above
  while (!todo.empty()) {
    const auto [n, above] = todo.back();
    todo.pop_back();
    if (n->type != GUMBO_NODE_ELEMENT && n->type != GUMBO_NODE_TEMPLATE) continue;
    const size_t chain = formatting(n) ? above + 1 : 0;
    longest = std::max(longest, chain);
    const GumboVector& c = n->v.element.children;
    for (unsigned i = 0; i < c.length; ++i)
      todo.push_back({static_cast<const GumboNode*>(c.data[i]), chain});
  }
  gumbo_destroy_output(&kGumboDefaultOptions, g);
  return longest;
}

}  // namespace

TEST(HtmlFormattingRun, CountsFormattingStartTagsInARowWithTextAndCommentsBetween) {
  EXPECT_EQ(longest_formatting_run("<html><body>" + distinct_b(50), kAll), 50u);
  EXPECT_EQ(longest_formatting_run("<!DOCTYPE html><B>a<I class='x>y'>b<!-- c --><em>", kAll), 3u);
  EXPECT_EQ(longest_formatting_run("<b>a < b<font size=2>", kAll), 2u);  // '<' as text
  EXPECT_EQ(longest_formatting_run("<!--><b><!---><i>", kAll), 2u);      // empty comments
  // An end tag, another element or a self-closed tag ends a run.
  EXPECT_EQ(longest_formatting_run("<b><i></i><u><s>", kAll), 2u);
  EXPECT_EQ(longest_formatting_run("<b><i><br><u>", kAll), 2u);
  EXPECT_EQ(longest_formatting_run("<b><i/><u>", kAll), 1u);
  // <a> and <nobr> close an open one; other names only look alike.
  EXPECT_EQ(longest_formatting_run("<a><a><a><nobr><nobr><b-x><bb><b\x01>", kAll), 0u);
  EXPECT_EQ(longest_formatting_run(distinct_b(5000), 100), 101u);  // stops past stop_after
}

TEST(HtmlFormattingRun, StopsWhereTagsAreNotReadOrInsertedAsInTheBody) {
  // Tags inside an attribute value, a comment, raw text or a select are not elements; after a
  // bogus comment, "<?" or a cut-off tag the scan does not model the tokenizer.
  EXPECT_EQ(longest_formatting_run("<span title=\"<b><b><b>\">", kAll), 0u);
  // After a quoted value, "<b" is the span's next attribute name.
  EXPECT_EQ(longest_formatting_run("<span title='>'<b><b>", kAll), 1u);
  // A <frameset> anywhere may remove the body, with every run in it.
  EXPECT_EQ(longest_formatting_run("<b><b><!x><FrameSet>", kAll), 0u);
  EXPECT_EQ(longest_formatting_run("<!-- <b><b> --!><i>", kAll), 1u);
  for (const char* stop : {"<select>", "<xmp>", "<title>", "<textarea>", "<script>", "<style>",
                           "<plaintext>", "<iframe>", "<noscript>", "<template>", "<svg>", "<math>",
                           "<!x>", "<?x>", "</ x>", "<span title=\"x"}) {
    EXPECT_EQ(longest_formatting_run("<b><b>" + std::string(stop) + "<b><b><b>", kAll), 2u) << stop;
  }
}

TEST(HtmlFormattingRun, GumboNestsEveryRunItReports) {
  // Random pages of formatting elements among tags that close them, move them (the adoption
  // agency, foster parenting in tables), and, rarely, change how tags are read or inserted:
  // gumbo's tree always holds the longest run as a chain of nested elements.
  const std::vector<std::string> formatting = {
      "<b id=1>",        "<b id=2>", "<i>",        "<font color=red>", "<s>",
      "<u class='a>b'>", "<em>",     "<strong>",   "<code>",           "<tt>",
      "<B ID=3>",        "text",     "<!-- c -->", "<a href=x>",       "<nobr>"};
  const std::vector<std::string> other = {
      "</b>",     "</i>",     "</em>",      "text",       " ",      "<p>",       "</p>",
      "<div>",    "</div>",   "<a href=x>", "</a>",       "<nobr>", "<table>",   "<tr>",
      "<td>",     "</td>",    "</table>",   "<caption>",  "<li>",   "<h1>",      "</h1>",
      "<button>", "<object>", "</object>",  "<br>",       "<b/>",   "</body>",   "</html>",
      "<body>",   "<head>",   "<col>",      "<colgroup>", "<form>", "<marquee>", "<applet>",
      "<option>", "<span>",   "</span>",    "<x-b>",      "<hr>",   "<pre>",     "<ul>"};
  const std::vector<std::string> rare = {
      "<select>",    "</select>",      "<svg>",    "</svg>",     "<math>",    "<template>",
      "</template>", "<frameset>",     "<xmp>",    "<title>",    "</title>",  "<!--",
      "-->",         "<span title=\"", "\">",      "<!x>",       "<![CDATA[", "]]>",
      "<textarea>",  "<plaintext>",    "<iframe>", "<noscript>", "<?x>"};
  std::mt19937 rng(17);
  const auto pick = [&](const std::vector<std::string>& v) { return v[rng() % v.size()]; };
  int with_runs = 0;
  for (int page = 0; page < 20000; ++page) {
    std::string html;
    const int n = 10 + int(rng() % 120);
    for (int k = 0; k < n; ++k) {
      const unsigned r = rng() % 100;
      html += r < 45 ? pick(formatting) : r < 97 ? pick(other) : pick(rare);
    }
    const size_t run = longest_formatting_run(html, kAll);
    if (run == 0) continue;
    with_runs += run >= 3;
    ASSERT_GE(gumbo_formatting_chain(html), run) << html;
  }
  std::printf("%d of 20000 pages with a run of 3 or more\n", with_runs);
  EXPECT_GT(with_runs, 5000) << "too few pages with runs to mean anything";
}

TEST(HtmlFormattingRun, LongRunIsRefusedAsTheParseWouldWithoutParsing) {
  // 100,000 unclosed <b id=k> under a max_depth that lets them past the tag-count pre-scan:
  // gumbo would take minutes. A parse memory limit of one byte shows that nothing is parsed
  // (a parse would end as too_large).
  ExtractOptions opt;
  opt.max_depth = 99999;
  opt.max_parse_bytes = 1;
  Extracted e = extract_main_text("<html><body>" + distinct_b(100000), opt);
  EXPECT_EQ(e.rejected, "too_deep");
  // The same outcome as the parse gives where the scan stops early (after <title>).
  opt.max_depth = 1000;
  opt.max_parse_bytes = 256u << 20;
  const std::string page = "<html><body>" + distinct_b(1500);
  const Extracted scanned = extract_main_text(page, opt);
  const Extracted parsed = extract_main_text("<title>t</title>" + page, opt);
  EXPECT_EQ(parsed.rejected, "too_deep");
  EXPECT_EQ(scanned.rejected, parsed.rejected);
  EXPECT_EQ(scanned.limit, parsed.limit);
}
