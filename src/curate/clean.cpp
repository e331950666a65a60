#include "curate/clean.h"

#include <utf8proc.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/swar.h"
#include "curate/document.h"
#include "curate/stage.h"
#include "curate/stages.h"
#include "curate/text.h"

namespace loom::curate {

// Bytes outside the printable ASCII range 0x21..0x7E (space, controls, DEL, non-ASCII).
static inline uint64_t bytes_not_printable(uint64_t w) {
  return (w & swar::kHigh) | swar::below(w, 0x21) | swar::equal(w, 0x7F);
}

// Index of the first non-ASCII byte at or after i (s.size() if none).
static size_t ascii_run_end(std::string_view s, size_t i) {
  const size_t n = s.size();
  for (; i + 8 <= n; i += 8) {
    uint64_t high = swar::load8(s.data() + i) & swar::kHigh;
    if (high) return i + swar::first(high);
  }
  while (i < n && static_cast<unsigned char>(s[i]) < 0x80) ++i;
  return i;
}

// Length of the valid prefix of s[i..): ASCII eight bytes at a time, other code points decoded.
static size_t valid_run(std::string_view s, size_t i) {
  const size_t n = s.size();
  while (i < n) {
    if (i + 8 <= n) {
      if (!(swar::load8(s.data() + i) & swar::kHigh)) {
        i += 8;
        continue;
      }
    }
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    size_t j = i;
    if (utf8_next(s, j) < 0) return i;
    i = j;
  }
  return n;
}

// Writes the repaired text to `out` and returns true, or returns false if s is valid as is.
static bool repair_utf8_into(std::string_view s, bool replace, int64_t* invalid, std::string& out) {
  size_t i = valid_run(s, 0);
  if (i == s.size()) return false;
  out.clear();
  out.reserve(s.size() + 16);
  size_t copied = 0;
  while (i < s.size()) {
    out.append(s.substr(copied, i - copied));
    ++i;  // one invalid byte (utf8_next's rule: an invalid sequence advances by one)
    if (invalid) ++*invalid;
    if (replace) utf8_append(out, 0xFFFD);
    copied = i;
    i = valid_run(s, i);
  }
  out.append(s.substr(copied));
  return true;
}

std::string repair_utf8(std::string_view s, bool replace, int64_t* invalid) {
  std::string out;
  if (!repair_utf8_into(s, replace, invalid, out)) out.assign(s);
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

// Every mojibake sequence starts with a code point in U+00C2..U+00F4 (a UTF-8 lead byte read
// as latin-1), which UTF-8 writes as 0xC3 0x82..0xB4: text without a 0xC3 byte has none. And
// 0xC3 is never a continuation byte, so each one starts a code point (utf8_next's reading,
// valid or not): the search can jump from one 0xC3 to the next and keep the rest as it is.
static bool may_have_mojibake(std::string_view s) {
  return s.find('\xC3') != std::string_view::npos;
}

// The character that the code points at s[i..) spell as cp1252/latin-1 bytes, if they spell a
// UTF-8 multi-byte sequence; on success `i` moves past them.
static int32_t mojibake_at(std::string_view s, size_t& i) {
  size_t j = i;
  int lead = cp1252_byte(utf8_next(s, j));
  int need = lead >= 0xC2 && lead <= 0xDF   ? 1
             : lead >= 0xE0 && lead <= 0xEF ? 2
             : lead >= 0xF0 && lead <= 0xF4 ? 3
                                            : 0;
  if (need == 0) return -1;
  char bytes[4] = {static_cast<char>(lead)};
  for (int k = 1; k <= need; ++k) {  // do the next `need` characters map to continuation bytes?
    if (j >= s.size()) return -1;
    int b = cp1252_byte(utf8_next(s, j));
    if (b < 0x80 || b > 0xBF) return -1;
    bytes[k] = static_cast<char>(b);
  }
  std::string_view seq(bytes, static_cast<size_t>(need) + 1);
  size_t p = 0;
  int32_t dec = utf8_next(seq, p);
  if (dec < 0x80 || p != seq.size()) return -1;
  i = j;
  return dec;
}

// One round of reversal into `out`; returns false (out untouched) if nothing was reversed.
static bool fix_mojibake_once(std::string_view s, int64_t* fixes, std::string& out) {
  size_t i = 0, copied = 0;
  bool changed = false;
  while ((i = s.find('\xC3', i)) != std::string_view::npos) {
    size_t start = i;
    int32_t dec = mojibake_at(s, i);
    if (dec < 0) {
      utf8_next(s, i);  // keep this code point as it is
      continue;
    }
    if (!changed) {
      out.clear();
      out.reserve(s.size());
      changed = true;
    }
    out.append(s.substr(copied, start - copied));
    utf8_append(out, static_cast<uint32_t>(dec));
    copied = i;
    if (fixes) ++*fixes;
  }
  if (changed) out.append(s.substr(copied));
  return changed;
}

// All rounds (double-encoded text needs two); returns false (out untouched) if s has none.
static bool fix_mojibake_into(std::string_view s, int64_t* fixes, std::string& out) {
  if (!may_have_mojibake(s)) return false;
  std::string cur, next;
  std::string_view view = s;
  bool changed = false;
  for (int round = 0; round < 3; ++round) {
    int64_t n = 0;
    if (!fix_mojibake_once(view, &n, next)) break;
    if (fixes) *fixes += n;
    cur.swap(next);
    view = cur;
    changed = true;
  }
  if (changed) out = std::move(cur);
  return changed;
}

std::string fix_mojibake(std::string_view s, int64_t* fixes) {
  std::string out;
  if (!fix_mojibake_into(s, fixes, out)) out.assign(s);
  return out;
}

// Code points that normalisation leaves alone whatever surrounds them: combining class 0,
// never the second element of a canonical composition (nor a Hangul jamo), and unchanged by
// the normalisation on their own (for NFKC: no compatibility mapping either). Text can be
// normalised piecewise between such code points, so only the spans around the others go
// through utf8proc. Derived from utf8proc's own tables once per process.
struct InertSets {
  std::vector<uint64_t> nfc, nfkc;  // bitsets over U+0000..U+10FFFF
  bool test(const std::vector<uint64_t>& set, int32_t cp) const {
    return cp >= 0 && ((set[static_cast<size_t>(cp) >> 6] >> (cp & 63)) & 1);
  }
};

static std::string utf8proc_normalize(std::string_view s, bool compat, bool* ok) {
  int options = UTF8PROC_STABLE | UTF8PROC_COMPOSE;
  if (compat) options |= UTF8PROC_COMPAT;
  utf8proc_uint8_t* dst = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    static_cast<utf8proc_ssize_t>(s.size()), &dst,
                                    static_cast<utf8proc_option_t>(options));
  *ok = n >= 0;
  if (n < 0) return std::string(s);
  std::string out(reinterpret_cast<char*>(dst), static_cast<size_t>(n));
  std::free(dst);
  return out;
}

static const InertSets& inert_sets() {
  static const InertSets sets = [] {
    constexpr int32_t kMax = 0x110000;
    std::vector<bool> second(kMax, false);
    for (int32_t cp = 0; cp < kMax; ++cp) {
      const utf8proc_property_t* p = utf8proc_get_property(cp);
      if (p->decomp_seqindex == UINT16_MAX || p->decomp_type != 0) continue;  // not canonical
      utf8proc_int32_t buf[16];
      int last = 0;
      utf8proc_ssize_t n = utf8proc_decompose_char(cp, buf, 16, UTF8PROC_DECOMPOSE, &last);
      for (utf8proc_ssize_t k = 1; k < n && k < 16; ++k) second[static_cast<size_t>(buf[k])] = true;
    }
    InertSets s;
    s.nfc.assign(kMax / 64, 0);
    s.nfkc.assign(kMax / 64, 0);
    for (int32_t cp = 0; cp < kMax; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;  // surrogates never occur in valid UTF-8
      bool jamo = (cp >= 0x1100 && cp <= 0x11FF) || (cp >= 0xA960 && cp <= 0xA97F) ||
                  (cp >= 0xD7B0 && cp <= 0xD7FF);
      const utf8proc_property_t* p = utf8proc_get_property(cp);
      if (jamo || p->combining_class != 0 || second[static_cast<size_t>(cp)]) continue;
      bool nfc = true, nfkc = true;
      if (p->decomp_seqindex != UINT16_MAX || (cp >= 0xAC00 && cp <= 0xD7A3)) {
        std::string one;
        utf8_append(one, cp);
        bool ok;
        nfc = utf8proc_normalize(one, false, &ok) == one && ok;
        nfkc = utf8proc_normalize(one, true, &ok) == one && ok;
      }
      uint64_t bit = uint64_t{1} << (cp & 63);
      if (nfc) s.nfc[static_cast<size_t>(cp) >> 6] |= bit;
      if (nfkc) s.nfkc[static_cast<size_t>(cp) >> 6] |= bit;
    }
    return s;
  }();
  return sets;
}

// Normalises the spans of s that hold non-inert code points (each with the inert code point
// before it, which may compose with them) into `out`; returns false if s is already normal.
static bool normalize_into(std::string_view s, bool compat, std::string& out) {
  const InertSets& sets = inert_sets();
  const std::vector<uint64_t>& inert = compat ? sets.nfkc : sets.nfc;
  const size_t npos = std::string_view::npos;
  size_t i = 0, last_inert = 0, region = npos, copied = 0;
  bool changed = false;
  auto flush = [&](size_t end) -> bool {
    bool ok;
    std::string_view span = s.substr(region, end - region);
    std::string norm = utf8proc_normalize(span, compat, &ok);
    if (!ok) return false;
    if (!changed && norm == span) return true;  // nothing to rewrite yet
    if (!changed) {
      out.clear();
      out.reserve(s.size() + 16);
      changed = true;
    }
    out.append(s.substr(copied, region - copied));
    out += norm;
    copied = end;
    return true;
  };
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {  // ASCII is inert
      if (region != npos) {
        if (!flush(i)) return false;
        region = npos;
      }
      i = ascii_run_end(s, i);
      last_inert = i - 1;
      continue;
    }
    size_t start = i;
    int32_t cp = utf8_next(s, i);
    if (sets.test(inert, cp)) {
      if (region != npos) {
        if (!flush(start)) return false;
        region = npos;
      }
      last_inert = start;
    } else if (region == npos) {
      region = last_inert;
    }
  }
  if (region != npos && !flush(s.size())) return false;
  if (changed) out.append(s.substr(copied));
  return changed;
}

std::string unicode_normalize(std::string_view s, const std::string& form) {
  if (form == "none" || is_ascii(s)) return std::string(s);
  std::string out;
  if (!normalize_into(s, form == "nfkc", out)) out.assign(s);
  return out;
}

// Index of the first byte at or after i that the whitespace pass must look at: anything but
// printable ASCII and spaces that are written as they are. A space after a printable
// character is one (never in the indentation, never a second space); with collapse_spaces
// off, every space is. Needs s[i - 1] printable or such a space.
static size_t plain_run_end(std::string_view s, size_t i, bool collapse_spaces) {
  const size_t n = s.size();
  for (; i + 8 <= n; i += 8) {
    uint64_t w = swar::load8(s.data() + i);
    uint64_t spaces = swar::equal(w, ' ');
    uint64_t stop = bytes_not_printable(w) & ~spaces;
    if (collapse_spaces) {
      uint64_t space_before = (spaces << 8) | (s[i - 1] == ' ' ? 0x80 : 0);
      stop |= spaces & space_before;
    }
    if (stop) return i + swar::first(stop);
  }
  for (; i < n; ++i) {
    unsigned char ch = static_cast<unsigned char>(s[i]);
    bool plain = (ch > 0x20 && ch < 0x7F) || (ch == ' ' && (!collapse_spaces || s[i - 1] != ' '));
    if (!plain) return i;
  }
  return n;
}

std::string clean_text(std::string_view in, const CleanOptions& opt, CleanCounts* counts) {
  CleanCounts local;
  CleanCounts& c = counts ? *counts : local;
  // Each step rewrites only when it changes something; `s` views the latest version.
  std::string a, b;
  std::string_view s = in;
  c.normalized_changed = false;
  // ASCII is valid UTF-8, holds no mojibake (no 0xC3) and is its own NFC and NFKC.
  if (ascii_run_end(s, 0) != s.size()) {
    if (repair_utf8_into(s, opt.replace_invalid, &c.invalid_bytes, a)) s = a;
    if (opt.fix_mojibake && fix_mojibake_into(s, &c.mojibake_fixes, b)) {
      a.swap(b);
      s = a;
    }
    if (opt.normalize != "none" && normalize_into(s, opt.normalize == "nfkc", b)) {
      c.normalized_changed = true;
      a.swap(b);
      s = a;
    }
  }

  // Control characters and whitespace, in one pass. The output is never longer than the input.
  std::string out(s.size(), '\0');
  char* o = out.data();
  char* line_start = o;
  char* const begin = o;
  size_t i = 0;
  const size_t n = s.size();
  int newlines = 0;  // consecutive '\n' just emitted
  bool in_indent = true;
  auto end_line = [&] {
    if (opt.collapse_spaces)
      while (o > line_start && o[-1] == ' ') --o;
  };
  auto newline = [&] {
    end_line();
    if (o == begin) return;  // no leading newlines
    if (newlines <= opt.max_blank_lines) *o++ = '\n';
    ++newlines;
    line_start = o;
    in_indent = true;
  };
  auto space = [&] {
    // Leading indentation is kept (code, poetry); inner runs of spaces collapse to one.
    if (opt.collapse_spaces && !in_indent && o[-1] == ' ') return;
    *o++ = ' ';
  };
  while (i < n) {
    unsigned char ch = static_cast<unsigned char>(s[i]);
    if (ch > 0x20 && ch < 0x7F) {  // printable ASCII: copy the run, single spaces included
      size_t j = plain_run_end(s, i + 1, opt.collapse_spaces);
      std::memcpy(o, s.data() + i, j - i);
      o += j - i;
      i = j;
      in_indent = false;
      newlines = 0;
      continue;
    }
    if (ch < 0x80) {
      ++i;
      if (ch == '\r') {
        if (i < n && s[i] == '\n') ++i;
        newline();
      } else if (ch == '\n') {
        newline();
      } else if (ch == ' ' || ch == '\t') {
        space();
      } else {
        ++c.control_chars;  // other C0 controls and DEL
      }
      continue;
    }
    size_t start = i;
    int32_t cp = utf8_next(s, i);
    if (cp == 0x2028 || cp == 0x2029 || cp == 0x85) {
      newline();
      continue;
    }
    bool control = cp < 0 || (cp >= 0x80 && cp <= 0x9F) || cp == 0xFEFF || cp == 0xFFFE ||
                   cp == 0xFFFF || cp == 0xAD;
    if (control) {
      ++c.control_chars;
      continue;
    }
    if (is_space_cp(cp)) {
      space();
      continue;
    }
    in_indent = false;
    newlines = 0;
    std::memcpy(o, s.data() + start, i - start);
    o += i - start;
  }
  end_line();
  while (o > begin && (o[-1] == '\n' || o[-1] == ' ')) --o;
  out.resize(static_cast<size_t>(o - begin));
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
               p.where("normalize"), " must be nfc, nfkc or none, got '", opt_.normalize, "'");
    opt_.collapse_spaces = p.get_bool("collapse_spaces", true);
    opt_.max_blank_lines = p.get_int32("max_blank_lines", 1, 0, 1000000);
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
