#include "curate/clean.h"

#include <utf8proc.h>

#include <cstdlib>

#include "core/error.h"
#include "curate/document.h"
#include "curate/stage.h"
#include "curate/stages.h"
#include "curate/text.h"

namespace loom::curate {

std::string repair_utf8(std::string_view s, bool replace, int64_t* invalid) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    size_t start = i;
    int32_t cp = utf8_next(s, i);
    if (cp < 0) {
      if (invalid) ++*invalid;
      if (replace) utf8_append(out, 0xFFFD);
    } else {
      out.append(s.substr(start, i - start));
    }
  }
  return out;
}

// The byte a code point came from when UTF-8 bytes were decoded as cp1252 (or latin-1 for
// the five bytes cp1252 leaves undefined); -1 if none.
static int cp1252_byte(int32_t cp) {
  if (cp >= 0x80 && cp <= 0xFF) return cp;  // latin-1 (and C1 for cp1252's undefined bytes)
  switch (cp) {
    case 0x20AC:
      return 0x80;
    case 0x201A:
      return 0x82;
    case 0x0192:
      return 0x83;
    case 0x201E:
      return 0x84;
    case 0x2026:
      return 0x85;
    case 0x2020:
      return 0x86;
    case 0x2021:
      return 0x87;
    case 0x02C6:
      return 0x88;
    case 0x2030:
      return 0x89;
    case 0x0160:
      return 0x8A;
    case 0x2039:
      return 0x8B;
    case 0x0152:
      return 0x8C;
    case 0x017D:
      return 0x8E;
    case 0x2018:
      return 0x91;
    case 0x2019:
      return 0x92;
    case 0x201C:
      return 0x93;
    case 0x201D:
      return 0x94;
    case 0x2022:
      return 0x95;
    case 0x2013:
      return 0x96;
    case 0x2014:
      return 0x97;
    case 0x02DC:
      return 0x98;
    case 0x2122:
      return 0x99;
    case 0x0161:
      return 0x9A;
    case 0x203A:
      return 0x9B;
    case 0x0153:
      return 0x9C;
    case 0x017E:
      return 0x9E;
    case 0x0178:
      return 0x9F;
    default:
      return -1;
  }
}

static std::string fix_mojibake_once(std::string_view s, int64_t* fixes) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t start = i;
    int32_t cp = utf8_next(s, i);
    int lead = cp1252_byte(cp);
    int need = lead >= 0xC2 && lead <= 0xDF   ? 1
               : lead >= 0xE0 && lead <= 0xEF ? 2
               : lead >= 0xF0 && lead <= 0xF4 ? 3
                                              : 0;
    if (need > 0) {
      // Do the next `need` characters map back to continuation bytes?
      std::string bytes(1, static_cast<char>(lead));
      size_t j = i;
      bool ok = true;
      for (int k = 0; k < need && ok; ++k) {
        if (j >= s.size()) {
          ok = false;
          break;
        }
        int b = cp1252_byte(utf8_next(s, j));
        ok = b >= 0x80 && b <= 0xBF;
        bytes += static_cast<char>(b);
      }
      if (ok) {
        size_t p = 0;
        int32_t dec = utf8_next(bytes, p);
        if (dec >= 0x80 && p == bytes.size()) {
          utf8_append(out, dec);
          if (fixes) ++*fixes;
          i = j;
          continue;
        }
      }
    }
    out.append(s.substr(start, i - start));
  }
  return out;
}

std::string fix_mojibake(std::string_view s, int64_t* fixes) {
  if (is_ascii(s)) return std::string(s);
  std::string cur(s);
  for (int round = 0; round < 3; ++round) {  // double-encoded text needs two rounds
    int64_t n = 0;
    std::string next = fix_mojibake_once(cur, &n);
    if (n == 0) break;
    if (fixes) *fixes += n;
    cur = std::move(next);
  }
  return cur;
}

std::string unicode_normalize(std::string_view s, const std::string& form) {
  if (form == "none" || is_ascii(s)) return std::string(s);
  int options = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
  if (form == "nfkc") options |= UTF8PROC_COMPAT;
  utf8proc_uint8_t* dst = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    static_cast<utf8proc_ssize_t>(s.size()), &dst,
                                    static_cast<utf8proc_option_t>(options));
  if (n < 0) return std::string(s);  // cannot happen for valid UTF-8; keep the text as is
  std::string out(reinterpret_cast<char*>(dst), static_cast<size_t>(n));
  std::free(dst);
  return out;
}

std::string clean_text(std::string_view in, const CleanOptions& opt, CleanCounts* counts) {
  CleanCounts local;
  CleanCounts& c = counts ? *counts : local;
  std::string s = repair_utf8(in, opt.replace_invalid, &c.invalid_bytes);
  if (opt.fix_mojibake) s = fix_mojibake(s, &c.mojibake_fixes);
  std::string norm = unicode_normalize(s, opt.normalize);
  c.normalized_changed = norm != s;
  s = std::move(norm);

  // Control characters and whitespace, in one pass.
  std::string out;
  out.reserve(s.size());
  size_t i = 0, line_start = 0;
  int newlines = 0;  // consecutive '\n' just emitted
  bool in_indent = true;
  auto end_line = [&] {
    if (opt.collapse_spaces)
      while (out.size() > line_start && out.back() == ' ') out.pop_back();
  };
  while (i < s.size()) {
    size_t start = i;
    int32_t cp = utf8_next(s, i);
    if (cp == '\r') {
      if (i < s.size() && s[i] == '\n') ++i;
      cp = '\n';
    }
    if (cp == '\n' || cp == 0x2028 || cp == 0x2029 || cp == 0x85) {
      end_line();
      if (out.empty()) continue;  // no leading newlines
      if (newlines <= opt.max_blank_lines) out += '\n';
      ++newlines;
      line_start = out.size();
      in_indent = true;
      continue;
    }
    bool control = (cp < 0x20 && cp != '\t') || cp == 0x7F || (cp >= 0x80 && cp <= 0x9F) ||
                   cp == 0xFEFF || cp == 0xFFFE || cp == 0xFFFF || cp == 0xAD;
    if (control) {
      ++c.control_chars;
      continue;
    }
    if (is_space_cp(cp)) {
      // Leading indentation is kept (code, poetry); inner runs of spaces collapse to one.
      if (opt.collapse_spaces && !in_indent && out.back() == ' ') continue;
      out += ' ';
      continue;
    }
    in_indent = false;
    newlines = 0;
    out.append(s, start, i - start);
  }
  end_line();
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  size_t lead = 0;
  while (lead < out.size() && out[lead] == ' ') ++lead;
  if (lead) out.erase(0, lead);
  return out;
}

namespace {

class CleanStage : public Stage {
 public:
  explicit CleanStage(const StageParams& p) {
    opt_.replace_invalid = p.get_string("invalid_utf8", "replace") == "replace";
    opt_.fix_mojibake = p.get_bool("fix_mojibake", true);
    opt_.normalize = p.get_string("normalize", "nfc");
    LOOM_CHECK(opt_.normalize == "nfc" || opt_.normalize == "nfkc" || opt_.normalize == "none",
               p.key("normalize"), " must be nfc, nfkc or none, got '", opt_.normalize, "'");
    opt_.collapse_spaces = p.get_bool("collapse_spaces", true);
    opt_.max_blank_lines = static_cast<int>(p.get_int("max_blank_lines", 1));
  }
  std::string process(Doc& doc, StageContext& ctx) const override {
    CleanCounts c;
    std::string t = clean_text(doc.text, opt_, &c);
    if (c.invalid_bytes) ctx.count("docs_with_invalid_utf8");
    ctx.count("invalid_utf8_bytes", c.invalid_bytes);
    if (c.mojibake_fixes) ctx.count("docs_mojibake_fixed");
    ctx.count("mojibake_fixes", c.mojibake_fixes);
    ctx.count("control_chars_dropped", c.control_chars);
    if (c.normalized_changed) ctx.count("docs_changed_by_normalization");
    if (t != doc.text) ctx.count("docs_changed");
    doc.text = std::move(t);
    if (doc.text.empty()) return "empty_after_cleaning";
    return "";
  }

 private:
  CleanOptions opt_;
};

}  // namespace

std::unique_ptr<Stage> make_clean_stage(const StageParams& p) {
  return std::make_unique<CleanStage>(p);
}

}  // namespace loom::curate
