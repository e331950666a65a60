// Heuristic quality filters with the published rules and thresholds as defaults:
// Gopher quality and repetition (Rae et al. 2021, appendix A, table A1), C4 (Raffel et al.
// 2020, line and page rules) and FineWeb (Penedo et al. 2024). Rule names follow datatrove's,
// prefixed by the filter; every threshold is a config key of the same name.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "curate/stages.h"
#include "curate/text.h"

namespace loom::curate {
namespace {

size_t count_substr(std::string_view s, std::string_view sub) {
  size_t n = 0;
  for (size_t p = s.find(sub); p != std::string_view::npos; p = s.find(sub, p + sub.size())) ++n;
  return n;
}

bool has_alpha(std::string_view w) {
  size_t i = 0;
  while (i < w.size())
    if (is_alpha_cp(utf8_next(w, i))) return true;
  return false;
}

// ---------------------------------------------------------------------------------------------
class GopherQuality : public Stage {
 public:
  explicit GopherQuality(const StageParams& p) {
    min_words_ = p.get_int("min_doc_words", 50);
    max_words_ = p.get_int("max_doc_words", 100000);
    min_avg_ = p.get_double("min_avg_word_length", 3);
    max_avg_ = p.get_double("max_avg_word_length", 10);
    max_symbol_ = p.get_double("max_symbol_word_ratio", 0.1);
    max_bullet_ = p.get_double("max_bullet_lines_ratio", 0.9);
    max_ellipsis_ = p.get_double("max_ellipsis_lines_ratio", 0.3);
    min_alpha_ = p.get_double("min_alpha_words_ratio", 0.8);
    min_stop_ = p.get_int("min_stop_words", 2);
    for (auto& w :
         p.get_list("stop_words", {"the", "be", "to", "of", "and", "that", "have", "with"}))
      stop_.insert(ascii_lower(w));
    for (auto& w : stop_) max_stop_len_ = std::max(max_stop_len_, w.size());
  }

  std::string process(Doc& doc, StageContext& ctx) const override {
    const std::string& t = doc.text;
    auto words = split_words(t);
    double n = static_cast<double>(words.size());
    ctx.score("word_count_log10", std::log10(n + 1), 0, 6);
    if (static_cast<int64_t>(words.size()) < min_words_) return "gopher_short_doc";
    if (static_cast<int64_t>(words.size()) > max_words_) return "gopher_long_doc";
    double chars = 0, alpha = 0;
    int64_t stops = 0;
    for (auto w : words) {
      chars += static_cast<double>(utf8_length(w));
      alpha += has_alpha(w);
      if (w.size() <= max_stop_len_ && stop_.count(ascii_lower(w))) ++stops;
    }
    double avg = chars / n;
    ctx.score("mean_word_length", avg, 0, 20);
    if (avg < min_avg_) return "gopher_below_avg_threshold";
    if (avg > max_avg_) return "gopher_above_avg_threshold";
    double hashes = static_cast<double>(count_substr(t, "#")) / n;
    double ellipses = static_cast<double>(count_substr(t, "...") + count_substr(t, "…")) / n;
    ctx.score("hash_word_ratio", hashes, 0, 0.5);
    ctx.score("ellipsis_word_ratio", ellipses, 0, 0.5);
    if (hashes > max_symbol_) return "gopher_too_many_hashes";
    if (ellipses > max_symbol_) return "gopher_too_many_ellipsis";
    auto lines = split_lines(t);
    double bullets = 0, end_ellipsis = 0;
    for (auto l : lines) {
      auto s = trim_view(l);
      for (const char* b : {"•", "‣", "◦", "●", "▪", "·"})
        if (starts_with(s, b)) {
          ++bullets;
          break;
        }
      end_ellipsis += ends_with(s, "...") || ends_with(s, "…");
    }
    double nl = static_cast<double>(lines.size());
    if (bullets / nl > max_bullet_) return "gopher_too_many_bullets";
    if (end_ellipsis / nl > max_ellipsis_) return "gopher_too_many_end_ellipsis";
    ctx.score("alpha_word_ratio", alpha / n, 0, 1);
    if (alpha / n < min_alpha_) return "gopher_below_alpha_threshold";
    if (stops < min_stop_) return "gopher_too_few_stop_words";
    return "";
  }

 private:
  int64_t min_words_, max_words_, min_stop_;
  double min_avg_, max_avg_, max_symbol_, max_bullet_, max_ellipsis_, min_alpha_;
  std::set<std::string> stop_;
  size_t max_stop_len_ = 0;
};

// ---------------------------------------------------------------------------------------------
// (duplicate elements, their characters) counting every repeat after the first occurrence.
std::pair<size_t, size_t> find_duplicates(const std::vector<std::string_view>& xs) {
  std::unordered_set<std::string_view> seen;
  size_t dup = 0, chars = 0;
  for (auto x : xs) {
    if (!seen.insert(x).second) {
      ++dup;
      chars += utf8_length(x);
    }
  }
  return {dup, chars};
}

class GopherRepetition : public Stage {
 public:
  explicit GopherRepetition(const StageParams& p) {
    dup_line_ = p.get_double("dup_line_frac", 0.3);
    dup_para_ = p.get_double("dup_para_frac", 0.3);
    dup_line_char_ = p.get_double("dup_line_char_frac", 0.2);
    dup_para_char_ = p.get_double("dup_para_char_frac", 0.2);
    const double top[] = {0.2, 0.18, 0.16};
    for (int n = 2; n <= 4; ++n) top_[n] = p.get_double(cat("top_", n, "_gram_frac"), top[n - 2]);
    const double dup[] = {0.15, 0.14, 0.13, 0.12, 0.11, 0.10};
    for (int n = 5; n <= 10; ++n) dup_[n] = p.get_double(cat("dup_", n, "_gram_frac"), dup[n - 5]);
  }

  std::string process(Doc& doc, StageContext& ctx) const override {
    std::string_view text = doc.text;
    double len = static_cast<double>(utf8_length(text));
    if (len == 0) return "gopher_rep_empty";
    // Paragraphs: separated by two or more newlines.
    std::vector<std::string_view> paras;
    std::string_view st = trim_view(text);
    size_t start = 0;
    while (start <= st.size()) {
      size_t p = st.find("\n\n", start);
      if (p == std::string_view::npos) {
        paras.push_back(st.substr(start));
        break;
      }
      paras.push_back(st.substr(start, p - start));
      while (p < st.size() && st[p] == '\n') ++p;
      start = p;
    }
    auto [pd, pc] = find_duplicates(paras);
    double para_frac = static_cast<double>(pd) / static_cast<double>(paras.size());
    ctx.score("dup_para_frac", para_frac, 0, 1);
    if (para_frac > dup_para_) return "gopher_rep_dup_para_frac";
    if (static_cast<double>(pc) / len > dup_para_char_) return "gopher_rep_dup_para_char_frac";
    // Lines (blank lines are separators, not repeated content).
    std::vector<std::string_view> lines;
    for (auto l : split_lines(text))
      if (!trim_view(l).empty()) lines.push_back(l);
    if (!lines.empty()) {
      auto [ld, lc] = find_duplicates(lines);
      double line_frac = static_cast<double>(ld) / static_cast<double>(lines.size());
      ctx.score("dup_line_frac", line_frac, 0, 1);
      if (line_frac > dup_line_) return "gopher_rep_dup_line_frac";
      if (static_cast<double>(lc) / len > dup_line_char_) return "gopher_rep_dup_line_char_frac";
    }
    // Word n-grams, hashed; an n-gram's characters are its words joined by single spaces.
    auto words = split_words(text);
    std::vector<uint64_t> wh(words.size());
    std::vector<size_t> wl(words.size());
    for (size_t i = 0; i < words.size(); ++i) {
      wh[i] = hash64(words[i], 7);
      wl[i] = utf8_length(words[i]);
    }
    auto gram = [&](size_t i, int n) {
      uint64_t h = 0xcbf29ce484222325ULL;
      for (int k = 0; k < n; ++k) h = (h ^ wh[i + k]) * 0x100000001b3ULL + static_cast<uint64_t>(k);
      return h;
    };
    auto gram_len = [&](size_t i, int n) {
      size_t c = static_cast<size_t>(n - 1);
      for (int k = 0; k < n; ++k) c += wl[i + k];
      return c;
    };
    for (auto& [n, thr] : top_) {
      if (words.size() < static_cast<size_t>(n)) continue;
      size_t m = words.size() - n + 1;
      std::unordered_map<uint64_t, uint32_t> counts;
      counts.reserve(m * 2);
      uint32_t best = 0;
      size_t best_pos = 0;
      std::vector<uint64_t> hs(m);
      for (size_t i = 0; i < m; ++i) hs[i] = gram(i, n);
      for (size_t i = 0; i < m; ++i) ++counts[hs[i]];
      for (size_t i = 0; i < m; ++i) {  // most frequent; ties go to the first seen
        uint32_t c = counts[hs[i]];
        if (c > best) {
          best = c;
          best_pos = i;
        }
      }
      double frac = static_cast<double>(gram_len(best_pos, n) * best) / len;
      ctx.score(cat("top_", n, "_gram_frac"), frac, 0, 1);
      if (frac > thr) return cat("gopher_rep_top_", n, "_gram");
    }
    for (auto& [n, thr] : dup_) {
      if (words.size() < static_cast<size_t>(n)) continue;
      size_t m = words.size() - n + 1;
      std::unordered_set<uint64_t> seen;
      seen.reserve(m * 2);
      size_t dup_chars = 0;
      // As in datatrove: after a repeated n-gram, skip past it so overlaps count once.
      for (size_t i = 0; i < m;) {
        if (!seen.insert(gram(i, n)).second) {
          dup_chars += gram_len(i, n);
          i += static_cast<size_t>(n);
        } else {
          ++i;
        }
      }
      double frac = static_cast<double>(dup_chars) / len;
      ctx.score(cat("dup_", n, "_gram_frac"), frac, 0, 1);
      if (frac > thr) return cat("gopher_rep_duplicated_", n, "_n_grams");
    }
    return "";
  }

 private:
  double dup_line_, dup_para_, dup_line_char_, dup_para_char_;
  std::map<int, double> top_, dup_;
};

// ---------------------------------------------------------------------------------------------
bool ends_terminal_c4(std::string_view l) {
  if (ends_with(l, "...")) return false;
  return ends_with(l, ".") || ends_with(l, "?") || ends_with(l, "!") || ends_with(l, "\"") ||
         ends_with(l, "'");
}

// Removes Wikipedia-style citation marks: [1], [12], [], [edit], [citation needed].
std::string remove_citations(std::string_view l) {
  std::string out;
  size_t i = 0;
  while (i < l.size()) {
    if (l[i] == '[') {
      size_t j = i + 1;
      while (j < l.size() && l[j] >= '0' && l[j] <= '9') ++j;
      if (j < l.size() && l[j] == ']') {
        i = j + 1;
        continue;
      }
      if (l.substr(i, 6) == "[edit]") {
        i += 6;
        continue;
      }
      if (l.substr(i, 17) == "[citation needed]") {
        i += 17;
        continue;
      }
    }
    out += l[i++];
  }
  return out;
}

size_t count_sentences(std::string_view l) {
  size_t n = 0;
  for (size_t i = 0; i < l.size(); ++i) {
    char c = l[i];
    if ((c == '.' || c == '!' || c == '?') && (i + 1 == l.size() || l[i + 1] == ' ')) {
      // "..." or "?!" count once: skip runs of terminal marks.
      if (i > 0 && (l[i - 1] == '.' || l[i - 1] == '!' || l[i - 1] == '?')) continue;
      ++n;
    }
  }
  return std::max<size_t>(n, 1);
}

class C4Filter : public Stage {
 public:
  explicit C4Filter(const StageParams& p) {
    remove_citations_ = p.get_bool("remove_citations", true);
    terminal_ = p.get_bool("filter_no_terminal_punct", true);
    min_sentences_ = p.get_int("min_num_sentences", 5);
    min_words_line_ = p.get_int("min_words_per_line", 3);
    max_word_len_ = p.get_int("max_word_length", 1000);
    lorem_ = p.get_bool("filter_lorem_ipsum", true);
    javascript_ = p.get_bool("filter_javascript", true);
    curly_ = p.get_bool("filter_curly_bracket", true);
    policy_ = p.get_bool("filter_policy", true);
  }

  std::string process(Doc& doc, StageContext& ctx) const override {
    static const char* kPolicy[] = {"terms of use", "privacy policy", "cookie policy",
                                    "uses cookies", "use of cookies", "use cookies"};
    std::string kept;
    int64_t sentences = 0, lines_in = 0, lines_kept = 0;
    for (auto raw : split_lines(doc.text)) {
      std::string_view l0 = trim_view(raw);
      if (l0.empty()) continue;  // blank lines separate paragraphs; they are not content
      ++lines_in;
      std::vector<std::string_view> ws;
      {
        size_t i = 0;
        while (i < l0.size()) {
          while (i < l0.size() && l0[i] == ' ') ++i;
          size_t b = i;
          while (i < l0.size() && l0[i] != ' ' && l0[i] != '\t') ++i;
          if (i > b) ws.push_back(l0.substr(b, i - b));
          if (i < l0.size()) ++i;
        }
      }
      if (max_word_len_ >= 0 && std::any_of(ws.begin(), ws.end(), [&](auto w) {
            return static_cast<int64_t>(utf8_length(w)) > max_word_len_;
          })) {
        ctx.count("lines_dropped_too_long_word");
        continue;
      }
      std::string line = remove_citations_ ? remove_citations(l0) : std::string(l0);
      if (terminal_ && !ends_terminal_c4(line)) {
        ctx.count("lines_dropped_no_terminal_punct");
        continue;
      }
      if (static_cast<int64_t>(ws.size()) < min_words_line_) {
        ctx.count("lines_dropped_too_few_words");
        continue;
      }
      std::string lower = ascii_lower(line);
      if (lorem_ && lower.find("lorem ipsum") != std::string::npos) return "c4_lorem_ipsum";
      if (javascript_ && lower.find("javascript") != std::string::npos) {
        ctx.count("lines_dropped_javascript");
        continue;
      }
      if (curly_ && line.find('{') != std::string::npos) return "c4_curly_bracket";
      if (policy_ && std::any_of(std::begin(kPolicy), std::end(kPolicy), [&](const char* p) {
            return lower.find(p) != std::string::npos;
          })) {
        ctx.count("lines_dropped_policy");
        continue;
      }
      sentences += static_cast<int64_t>(count_sentences(line));
      if (!kept.empty()) kept += '\n';
      kept += line;
      ++lines_kept;
    }
    ctx.score("kept_line_fraction",
              lines_in ? static_cast<double>(lines_kept) / static_cast<double>(lines_in) : 0, 0, 1);
    if (sentences < min_sentences_) return "c4_too_few_sentences";
    doc.text = std::move(kept);
    return "";
  }

 private:
  bool remove_citations_, terminal_, lorem_, javascript_, curly_, policy_;
  int64_t min_sentences_, min_words_line_, max_word_len_;
};

// ---------------------------------------------------------------------------------------------
bool ends_terminal_any(std::string_view l) {
  static const char* kStops[] = {".", "!",  "?",  "\"", "'", "”", "’",
                                 "»", "。", "！", "？", "…", "؟", "।"};
  for (const char* s : kStops)
    if (ends_with(l, s)) return true;
  return false;
}

class FineWebFilter : public Stage {
 public:
  explicit FineWebFilter(const StageParams& p) {
    line_punct_ = p.get_double("line_punct_thr", 0.12);
    exclude_zero_ = p.get_bool("line_punct_exclude_zero", false);
    short_thr_ = p.get_double("short_line_thr", 0.67);
    short_len_ = p.get_int("short_line_length", 30);
    char_dup_ = p.get_double("char_duplicates_ratio", 0.01);
    new_line_ = p.get_double("new_line_ratio", 0.3);
  }

  std::string process(Doc& doc, StageContext& ctx) const override {
    std::vector<std::string_view> lines;
    for (auto l : split_lines(doc.text))
      if (!trim_view(l).empty()) lines.push_back(trim_view(l));
    if (lines.empty()) return "fineweb_empty";
    double n = static_cast<double>(lines.size());
    double punct = 0, shorts = 0;
    for (auto l : lines) {
      punct += ends_terminal_any(l);
      shorts += static_cast<int64_t>(utf8_length(l)) <= short_len_;
    }
    double pr = punct / n, sr = shorts / n;
    ctx.score("line_punct_ratio", pr, 0, 1);
    ctx.score("short_line_ratio", sr, 0, 1);
    if (pr < line_punct_ && !(pr == 0 && exclude_zero_)) return "fineweb_line_punct_ratio";
    if (sr > short_thr_) return "fineweb_short_line_ratio";
    double chars = static_cast<double>(utf8_length(doc.text) - count_substr(doc.text, "\n"));
    double dup = chars > 0 ? static_cast<double>(find_duplicates(lines).second) / chars : 0;
    ctx.score("char_dup_ratio", dup, 0, 0.2);
    if (dup > char_dup_) return "fineweb_char_dup_ratio";
    size_t words = 0;
    {
      bool in = false;
      for (char c : doc.text) {
        bool sp = c == ' ' || c == '\n' || c == '\t';
        if (!sp && !in) ++words;
        in = !sp;
      }
    }
    double lr = static_cast<double>(count_substr(doc.text, "\n")) /
                static_cast<double>(std::max<size_t>(1, words));
    ctx.score("newline_word_ratio", lr, 0, 1);
    if (lr > new_line_) return "fineweb_list_ratio";
    return "";
  }

 private:
  double line_punct_, short_thr_, char_dup_, new_line_;
  bool exclude_zero_;
  int64_t short_len_;
};

// ---------------------------------------------------------------------------------------------
// Simple length bounds in characters and words (a cheap first filter).
class LengthFilter : public Stage {
 public:
  explicit LengthFilter(const StageParams& p) {
    min_chars_ = p.get_int("min_chars", 0);
    max_chars_ = p.get_int("max_chars", INT64_MAX);
    min_words_ = p.get_int("min_words", 0);
  }
  std::string process(Doc& doc, StageContext& ctx) const override {
    int64_t c = static_cast<int64_t>(utf8_length(doc.text));
    if (c < min_chars_) return "too_few_chars";
    if (c > max_chars_) return "too_many_chars";
    if (min_words_ > 0 && static_cast<int64_t>(split_words(doc.text).size()) < min_words_)
      return "too_few_words";
    return "";
  }

 private:
  int64_t min_chars_, max_chars_, min_words_;
};

}  // namespace

std::unique_ptr<Stage> make_gopher_quality_stage(const StageParams& p) {
  return std::make_unique<GopherQuality>(p);
}
std::unique_ptr<Stage> make_gopher_repetition_stage(const StageParams& p) {
  return std::make_unique<GopherRepetition>(p);
}
std::unique_ptr<Stage> make_c4_stage(const StageParams& p) {
  return std::make_unique<C4Filter>(p);
}
std::unique_ptr<Stage> make_fineweb_stage(const StageParams& p) {
  return std::make_unique<FineWebFilter>(p);
}
std::unique_ptr<Stage> make_length_stage(const StageParams& p) {
  return std::make_unique<LengthFilter>(p);
}

}  // namespace loom::curate
