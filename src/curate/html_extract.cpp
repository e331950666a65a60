#include "curate/html_extract.h"

#include <gumbo.h>

#include <algorithm>
#include <cctype>
#include <csetjmp>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "curate/clean.h"
#include "curate/html_formatting_run.h"
#include "curate/stages.h"
#include "curate/text.h"

namespace loom::curate {
namespace {

bool is_dropped_tag(GumboTag t) {
  switch (t) {
    case GUMBO_TAG_SCRIPT:
    case GUMBO_TAG_STYLE:
    case GUMBO_TAG_NOSCRIPT:
    case GUMBO_TAG_NAV:
    case GUMBO_TAG_FOOTER:
    case GUMBO_TAG_ASIDE:
    case GUMBO_TAG_FORM:
    case GUMBO_TAG_IFRAME:
    case GUMBO_TAG_SVG:
    case GUMBO_TAG_BUTTON:
    case GUMBO_TAG_SELECT:
    case GUMBO_TAG_TEMPLATE:
    case GUMBO_TAG_HEAD:
    case GUMBO_TAG_INPUT:
    case GUMBO_TAG_TEXTAREA:
    case GUMBO_TAG_MENU:
    case GUMBO_TAG_OBJECT:
    case GUMBO_TAG_EMBED:
    case GUMBO_TAG_CANVAS:
    case GUMBO_TAG_MATH:
    case GUMBO_TAG_AUDIO:
    case GUMBO_TAG_VIDEO:
    case GUMBO_TAG_MAP:
      return true;
    default:
      return false;
  }
}

bool is_block_tag(GumboTag t) {
  switch (t) {
    case GUMBO_TAG_P:
    case GUMBO_TAG_DIV:
    case GUMBO_TAG_H1:
    case GUMBO_TAG_H2:
    case GUMBO_TAG_H3:
    case GUMBO_TAG_H4:
    case GUMBO_TAG_H5:
    case GUMBO_TAG_H6:
    case GUMBO_TAG_LI:
    case GUMBO_TAG_UL:
    case GUMBO_TAG_OL:
    case GUMBO_TAG_PRE:
    case GUMBO_TAG_BLOCKQUOTE:
    case GUMBO_TAG_TABLE:
    case GUMBO_TAG_TR:
    case GUMBO_TAG_TD:
    case GUMBO_TAG_TH:
    case GUMBO_TAG_SECTION:
    case GUMBO_TAG_ARTICLE:
    case GUMBO_TAG_MAIN:
    case GUMBO_TAG_DL:
    case GUMBO_TAG_DT:
    case GUMBO_TAG_DD:
    case GUMBO_TAG_FIGCAPTION:
    case GUMBO_TAG_HR:
    case GUMBO_TAG_BODY:
    case GUMBO_TAG_HEADER:
    case GUMBO_TAG_FIGURE:
    case GUMBO_TAG_ADDRESS:
    case GUMBO_TAG_CAPTION:
      return true;
    default:
      return false;
  }
}

bool is_heading(GumboTag t) {
  return t >= GUMBO_TAG_H1 && t <= GUMBO_TAG_H6;
}

// Class/id tokens that name page furniture rather than content.
bool boilerplate_name(const char* value) {
  static const char* kWords[] = {
      "nav",           "navbar", "navigation", "menu",    "footer",    "sidebar",   "breadcrumb",
      "breadcrumbs",   "cookie", "cookies",    "banner",  "ad",        "ads",       "advert",
      "advertisement", "social", "share",      "sharing", "related",   "subscribe", "newsletter",
      "popup",         "modal",  "skip",       "widget",  "sponsored", "toolbar",   "pagination"};
  std::string v = ascii_lower(value);
  size_t i = 0;
  while (i < v.size()) {
    while (i < v.size() && !isalnum(static_cast<unsigned char>(v[i]))) ++i;
    size_t b = i;
    while (i < v.size() && isalnum(static_cast<unsigned char>(v[i]))) ++i;
    if (i == b) break;
    std::string_view tok(v.data() + b, i - b);
    for (const char* w : kWords)
      if (tok == w) return true;
  }
  return false;
}

const char* attr(const GumboElement& e, const char* name) {
  GumboAttribute* a = gumbo_get_attribute(&e.attributes, name);
  return a ? a->value : nullptr;
}

bool dropped_element(const GumboElement& e) {
  if (is_dropped_tag(e.tag)) return true;
  if (attr(e, "hidden")) return true;
  if (const char* h = attr(e, "aria-hidden"); h && std::strcmp(h, "true") == 0) return true;
  if (const char* s = attr(e, "style")) {
    std::string st = ascii_lower(s);
    st.erase(std::remove(st.begin(), st.end(), ' '), st.end());
    if (st.find("display:none") != std::string::npos) return true;
  }
  if (const char* r = attr(e, "role")) {
    std::string role = ascii_lower(r);
    if (role == "navigation" || role == "banner" || role == "contentinfo" ||
        role == "complementary" || role == "search" || role == "menu" || role == "menubar")
      return true;
  }
  for (const char* name : {"class", "id"})
    if (const char* v = attr(e, name); v && boilerplate_name(v)) return true;
  return false;
}

struct Block {
  std::string text;
  size_t link_chars = 0;
  bool heading = false, item = false, pre = false;
};

// Children of an element or template node (others have none).
const GumboVector* children_of(const GumboNode* n) {
  if (n->type != GUMBO_NODE_ELEMENT && n->type != GUMBO_NODE_TEMPLATE) return nullptr;
  return &n->v.element.children;
}

// Calls visit(node) in document order with an explicit stack (a page can nest elements far
// deeper than a thread's stack allows recursion). visit returns kDescend, kSkip (not its
// children) or kStop.
enum Visit { kDescend, kSkip, kStop };
template <class F>
void preorder(const GumboNode* root, F&& visit) {
  std::vector<std::pair<const GumboNode*, unsigned>> stack;
  auto enter = [&](const GumboNode* n) {
    Visit v = visit(n);
    if (v == kDescend && children_of(n)) stack.push_back({n, 0});
    return v != kStop;
  };
  if (!enter(root)) return;
  while (!stack.empty()) {
    auto& [n, next] = stack.back();
    const GumboVector* c = children_of(n);
    if (next == c->length) {
      stack.pop_back();
      continue;
    }
    if (!enter(static_cast<const GumboNode*>(c->data[next++]))) return;
  }
}

// Deepest element nesting under root, counting stops once it passes `limit`.
size_t tree_depth(const GumboNode* root, size_t limit) {
  std::vector<std::pair<const GumboNode*, unsigned>> stack;
  size_t deepest = 0;
  if (children_of(root)) stack.push_back({root, 0});
  while (!stack.empty()) {
    deepest = std::max(deepest, stack.size());
    if (deepest > limit) break;
    auto& [n, next] = stack.back();
    const GumboVector* c = children_of(n);
    if (next == c->length) {
      stack.pop_back();
      continue;
    }
    auto* child = static_cast<const GumboNode*>(c->data[next++]);
    if (children_of(child)) stack.push_back({child, 0});
  }
  return deepest;
}

class Walker {
 public:
  explicit Walker(Extracted& out) : out_(out) {}
  std::vector<Block> blocks;

  // Depth-first over the tree with an explicit stack: each frame holds an element whose
  // children are being walked and what its descendants inherit (inside a link, inside <pre>,
  // whether a <header> is still boilerplate).
  void walk(const GumboNode* root, bool drop_header) {
    enter(root, false, false, drop_header);
    while (!stack_.empty()) {
      Frame& f = stack_.back();
      const GumboElement& e = f.node->v.element;
      if (f.next < e.children.length) {
        const Frame parent = f;  // enter() may grow the stack and move f
        ++f.next;
        enter(static_cast<const GumboNode*>(e.children.data[parent.next]), parent.link, parent.pre,
              parent.drop_header);
        continue;
      }
      if (f.block) flush();
      if (e.tag == GUMBO_TAG_TD || e.tag == GUMBO_TAG_TH) cur_.text += ' ';
      stack_.pop_back();
    }
  }

  void flush() {
    std::string_view t = trim_view(cur_.text);
    if (!t.empty()) {
      Block b = cur_;
      b.text = std::string(t);
      blocks.push_back(std::move(b));
    }
    cur_ = Block();
  }

 private:
  struct Frame {
    const GumboNode* node;
    unsigned next;
    bool link, pre, drop_header, block;
  };

  void enter(const GumboNode* n, bool in_link, bool in_pre, bool drop_header) {
    if (n->type == GUMBO_NODE_TEXT || n->type == GUMBO_NODE_WHITESPACE ||
        n->type == GUMBO_NODE_CDATA) {
      add_text(n->v.text.text, in_link, in_pre);
      return;
    }
    if (n->type != GUMBO_NODE_ELEMENT && n->type != GUMBO_NODE_TEMPLATE) return;
    const GumboElement& e = n->v.element;
    if (dropped_element(e) || (drop_header && e.tag == GUMBO_TAG_HEADER)) {
      ++out_.elements_dropped;
      return;
    }
    if (e.tag == GUMBO_TAG_BR) {
      cur_.text += '\n';
      return;
    }
    bool block = is_block_tag(e.tag);
    if (block) flush();
    if (is_heading(e.tag)) cur_.heading = true;
    if (e.tag == GUMBO_TAG_LI || e.tag == GUMBO_TAG_DT || e.tag == GUMBO_TAG_DD) cur_.item = true;
    bool pre = in_pre || e.tag == GUMBO_TAG_PRE;
    if (pre) cur_.pre = true;
    bool link = in_link || e.tag == GUMBO_TAG_A;
    // Inside <article>/<main>, a <header> holds the title: keep it.
    bool dh = drop_header && e.tag != GUMBO_TAG_ARTICLE && e.tag != GUMBO_TAG_MAIN;
    stack_.push_back({n, 0, link, pre, dh, block});
  }

  void add_text(const char* s, bool in_link, bool in_pre) {
    size_t before = cur_.text.size();
    if (in_pre) {
      cur_.text += s;
    } else {
      for (const char* p = s; *p; ++p) {
        char c = *p;
        bool ws = c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f';
        if (ws) {
          if (!cur_.text.empty() && cur_.text.back() != ' ' && cur_.text.back() != '\n')
            cur_.text += ' ';
        } else {
          cur_.text += c;
        }
      }
    }
    if (in_link) cur_.link_chars += cur_.text.size() - before;
  }
  Extracted& out_;
  Block cur_;
  std::vector<Frame> stack_;
};

const GumboNode* find_tag(const GumboNode* root, GumboTag tag, bool skip_dropped = true) {
  const GumboNode* found = nullptr;
  preorder(root, [&](const GumboNode* n) {
    if (n->type != GUMBO_NODE_ELEMENT) return kSkip;
    if (n->v.element.tag == tag) {
      found = n;
      return kStop;
    }
    if (skip_dropped && dropped_element(n->v.element)) return kSkip;
    return kDescend;
  });
  return found;
}

std::string node_text(const GumboNode* root) {
  std::string s;
  preorder(root, [&](const GumboNode* n) {
    if (n->type == GUMBO_NODE_TEXT) s += n->v.text.text;
    return n->type == GUMBO_NODE_ELEMENT ? kDescend : kSkip;
  });
  return s;
}

// Gumbo's memory for one parse. Each allocation carries a header linking it into a list, so
// the bytes live are counted against the limit and a parse abandoned at the limit (gumbo has
// no way to fail an allocation) frees everything it had allocated. Freeing the list at the end
// also replaces gumbo_destroy_output, which recurses once per level of nesting.
class ParseMemory {
 public:
  explicit ParseMemory(size_t limit) : limit_(limit) {}
  ~ParseMemory() {
    for (Header* h = head_.next; h != &head_;) {
      Header* next = h->next;
      std::free(h);
      h = next;
    }
  }
  ParseMemory(const ParseMemory&) = delete;
  ParseMemory& operator=(const ParseMemory&) = delete;

  // The parse, or nullptr when it passed the limit. setjmp sits in this frame, which holds no
  // object with a destructor: the longjmp from allocate() crosses only gumbo's C frames.
  GumboOutput* parse(const std::string& html) {
    GumboOptions o = kGumboDefaultOptions;
    o.allocator = &allocate;
    o.deallocator = &deallocate;
    o.userdata = this;
    o.max_errors = 0;  // parse errors are not used: do not spend memory recording them
    if (setjmp(over_) != 0) return nullptr;
    return gumbo_parse_with_options(&o, html.data(), html.size());
  }

 private:
  struct alignas(16) Header {
    Header *prev, *next;
    size_t size;
  };
  static void* allocate(void* self, size_t n) {
    auto* m = static_cast<ParseMemory*>(self);
    if (n > m->limit_ - m->live_) std::longjmp(m->over_, 1);
    auto* h = static_cast<Header*>(std::malloc(sizeof(Header) + n));
    if (!h) std::longjmp(m->over_, 1);
    h->size = n;
    h->prev = &m->head_;
    h->next = m->head_.next;
    m->head_.next->prev = h;
    m->head_.next = h;
    m->live_ += n;
    return h + 1;
  }
  static void deallocate(void* self, void* p) {
    if (!p) return;
    auto* m = static_cast<ParseMemory*>(self);
    Header* h = static_cast<Header*>(p) - 1;
    h->prev->next = h->next;
    h->next->prev = h->prev;
    m->live_ -= h->size;
    std::free(h);
  }
  Header head_{&head_, &head_, 0};
  size_t limit_, live_ = 0;
  std::jmp_buf over_;
};

// How deep the tags of a page nest, estimated from its text before gumbo sees it: gumbo's
// time grows with the square of the depth (100,000 nested <div>: 9 s), so a page past
// kPrescanFactor * max_depth is refused without parsing. Start tags count +1 and end tags -1;
// void elements, self-closing tags, comments, <script>/<style> contents and the tags HTML
// closes implicitly (p, li, td, ...) are not counted, so ordinary sloppy markup stays far
// below the bound; the parsed tree's depth is still checked against max_depth exactly.
constexpr size_t kPrescanFactor = 8;

// A lower-cased tag name of up to 8 characters packed into an integer (0: longer, or not a
// name), so the pre-scan compares integers instead of strings.
constexpr uint64_t tag_key(std::string_view name) {
  if (name.empty() || name.size() > 8) return 0;
  uint64_t k = 0;
  for (char c : name) k = (k << 8) | static_cast<uint8_t>(c >= 'A' && c <= 'Z' ? c + 32 : c);
  return k;
}

bool uncounted_tag(uint64_t key) {
  static constexpr uint64_t kKeys[] = {
      tag_key("area"),    tag_key("base"),   tag_key("br"),       tag_key("col"),
      tag_key("embed"),   tag_key("hr"),     tag_key("img"),      tag_key("input"),
      tag_key("link"),    tag_key("meta"),   tag_key("param"),    tag_key("source"),
      tag_key("track"),   tag_key("wbr"),    tag_key("p"),        tag_key("li"),
      tag_key("dt"),      tag_key("dd"),     tag_key("tr"),       tag_key("td"),
      tag_key("th"),      tag_key("option"), tag_key("optgroup"), tag_key("thead"),
      tag_key("tbody"),   tag_key("tfoot"),  tag_key("colgroup"), tag_key("rb"),
      tag_key("rt"),      tag_key("rp"),     tag_key("html"),     tag_key("head"),
      tag_key("body"),    tag_key("frame"),  tag_key("keygen"),   tag_key("basefont"),
      tag_key("bgsound"), tag_key("image"),  tag_key("isindex")};
  for (uint64_t k : kKeys)
    if (k == key) return true;
  return false;
}

size_t estimated_depth(std::string_view h, size_t stop_after) {
  // Nesting past stop_after needs more tags than that: most pages have far fewer, and
  // counting '<' (vectorised) costs little next to scanning the tags.
  if (static_cast<size_t>(std::count(h.begin(), h.end(), '<')) <= stop_after) return 0;
  static constexpr uint64_t kScript = tag_key("script"), kStyle = tag_key("style"),
                            kTextarea = tag_key("textarea"), kTitle = tag_key("title");
  size_t depth = 0, deepest = 0;
  for (size_t i = h.find('<'); i != std::string_view::npos && i + 1 < h.size();
       i = h.find('<', i + 1)) {
    if (h[i + 1] == '!' && h.compare(i, 4, "<!--") == 0) {
      size_t end = h.find("-->", i + 4);
      if (end == std::string_view::npos) break;
      i = end + 2;
      continue;
    }
    bool closing = h[i + 1] == '/';
    size_t b = i + 1 + (closing ? 1 : 0), e = b;
    while (e < h.size() && std::isalnum(static_cast<unsigned char>(h[e]))) ++e;
    if (e == b) continue;  // not a tag: text such as "a < b"
    size_t gt = h.find('>', e);
    if (gt == std::string_view::npos) break;
    const std::string_view name = h.substr(b, e - b);
    const uint64_t key = tag_key(name);
    if (closing) {
      if (!uncounted_tag(key) && depth > 0) --depth;
    } else if (key != 0 && (key == kScript || key == kStyle || key == kTextarea || key == kTitle)) {
      // Raw text: markup inside is not markup. Skip to this element's end tag.
      size_t end = gt;
      for (;;) {
        end = h.find("</", end);
        if (end == std::string_view::npos) break;
        size_t n = end + 2;
        while (n < h.size() && std::isalnum(static_cast<unsigned char>(h[n]))) ++n;
        if (tag_key(h.substr(end + 2, n - end - 2)) == key) break;
        end += 2;
      }
      if (end == std::string_view::npos) break;
      gt = end;
    } else if (!uncounted_tag(key) && h[gt - 1] != '/') {
      deepest = std::max(deepest, ++depth);
      if (deepest > stop_after) break;
    }
    i = gt;
  }
  return deepest;
}

// The outcome for a page whose elements nest deeper than max_depth.
Extracted too_deep_tree(size_t max_depth) {
  Extracted out;
  out.rejected = "too_deep";
  out.limit = cat("elements nested deeper than max_depth = ", max_depth);
  return out;
}

}  // namespace

Extracted extract_main_text(std::string_view html_in, const ExtractOptions& opt) {
  Extracted out;
  const size_t prescan_limit = opt.max_depth * kPrescanFactor;
  if (estimated_depth(html_in, prescan_limit) > prescan_limit) {
    out.rejected = "too_deep";
    out.limit = cat("more than ", prescan_limit, " nested start tags (", kPrescanFactor,
                    " x max_depth = ", opt.max_depth, "), refused before parsing");
    return out;
  }
  std::string html = repair_utf8(html_in, true);
  // A run of nested formatting elements past max_depth is a tree past max_depth, which gumbo
  // would take quadratic time to build (html_formatting_run.h): the parse's outcome, unparsed.
  if (longest_formatting_run(html, opt.max_depth) > opt.max_depth)
    return too_deep_tree(opt.max_depth);
  ParseMemory memory(opt.max_parse_bytes);
  GumboOutput* g = memory.parse(html);
  if (!g) {
    out.rejected = "too_large";
    out.limit = cat("parsing needs more than max_parse_bytes = ", opt.max_parse_bytes);
    return out;
  }
  if (tree_depth(g->root, opt.max_depth) > opt.max_depth) return too_deep_tree(opt.max_depth);
  const GumboNode* root = g->root;
  if (const GumboNode* t = find_tag(g->root, GUMBO_TAG_TITLE, false)) {
    out.title = std::string(trim_view(node_text(t)));
  }
  bool drop_header = true;
  if (opt.prefer_main) {
    const GumboNode* m = find_tag(g->root, GUMBO_TAG_MAIN);
    if (!m) m = find_tag(g->root, GUMBO_TAG_ARTICLE);
    if (m) {
      root = m;
      drop_header = false;
    }
  }
  Walker w(out);
  w.walk(root, drop_header);
  w.flush();

  std::string text;
  bool prev_item = false;
  for (auto& b : w.blocks) {
    double density =
        static_cast<double>(b.link_chars) / static_cast<double>(std::max<size_t>(1, b.text.size()));
    if (density > opt.max_link_density) {
      ++out.blocks_dropped_links;
      continue;
    }
    ++out.blocks_kept;
    if (!text.empty()) text += (b.item && prev_item) ? "\n" : "\n\n";
    if (b.item) text += "- ";
    text += b.text;
    prev_item = b.item;
  }
  out.text = std::move(text);
  return out;
}

namespace {
class HtmlExtractStage : public Stage {
 public:
  explicit HtmlExtractStage(const StageParams& p) {
    opt_.max_link_density = p.get_double("max_link_density", 0.5, 0, 1e9);
    opt_.prefer_main = p.get_bool("prefer_main", true);
    only_html_ = p.get_bool("only_html_content_type", true);
    opt_.max_parse_bytes = static_cast<size_t>(p.get_int("max_parse_mb", 256, 1, int64_t{1} << 20))
                           << 20;
    const int64_t depth = p.get_int("max_depth", 1000, 1, 1000000);
    opt_.max_depth = static_cast<size_t>(depth);
  }
  std::string process(Doc& doc, StageContext& ctx) const override {
    if (only_html_ && doc.record.contains("content_type")) {
      const Json& ct = doc.record.at("content_type");
      if (ct.is_string() && ct.as_string().find("html") == std::string::npos) return "";
    }
    size_t html_bytes = doc.text.size();
    Extracted e = extract_main_text(doc.text, opt_);
    if (!e.rejected.empty()) {
      doc.record["rejected_limit"] = "html_extract: " + e.limit;
      return e.rejected;
    }
    ctx.count("blocks_dropped_link_density", e.blocks_dropped_links);
    ctx.count("elements_dropped_boilerplate", e.elements_dropped);
    ctx.score(
        "extracted_fraction",
        static_cast<double>(e.text.size()) / static_cast<double>(std::max<size_t>(1, html_bytes)),
        0, 1);
    if (!e.title.empty()) doc.record["title"] = e.title;
    doc.text = std::move(e.text);
    if (doc.text.empty()) return "no_main_content";
    return "";
  }

 private:
  ExtractOptions opt_;
  bool only_html_ = true;
};
}  // namespace

std::unique_ptr<Stage> make_html_extract_stage(const StageParams& p) {
  return std::make_unique<HtmlExtractStage>(p);
}

}  // namespace loom::curate
