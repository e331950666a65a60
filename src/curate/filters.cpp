// Heuristic quality filters with the published rules and thresholds as defaults:
// Gopher quality and repetition (Rae et al. 2021, appendix A, table A1), C4 (Raffel et al.
// 2020, line and page rules) and FineWeb (Penedo et al. 2024). Rule names follow datatrove's,
// prefixed by the filter; every threshold is a config key of the same name.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "core/error.h"
#include "core/swar.h"
#include "curate/flat_table.h"
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
  while (i < w.size()) {
    unsigned char c = static_cast<unsigned char>(w[i]);
    if (c < 0x80) {  // ASCII without decoding
      if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return true;
      ++i;
      continue;
    }
    if (is_alpha_cp(utf8_next(w, i))) return true;
  }
  return false;
}

// Tests on the bytes of a short word held in a uint64_t (detail::load_short_in), all eight
// lanes at once; bytes of 0x80 and above are never ASCII letters.
using swar::ascii_in_range, swar::kHigh, swar::kOnes;

constexpr uint64_t ascii_lower_word(uint64_t x) {
  return x | (ascii_in_range(x, 'A', 'Z') >> 2);
}

constexpr bool has_ascii_letter_word(uint64_t x) {
  return ascii_in_range(x | (kOnes * 0x20), 'a', 'z') != 0;
}

// The stop words of up to seven bytes as integers (their bytes, with the length in the top
// byte, which they leave free), so a short word is looked up without a string comparison.
class ShortStopWords {
 public:
  void add(std::string_view w) {
    if (w.empty() || w.size() >= 8) return;
    uint64_t key = 0;
    std::memcpy(&key, w.data(), w.size());
    keys_.push_back(key | (static_cast<uint64_t>(w.size()) << 56));
    std::sort(keys_.begin(), keys_.end());
  }
  // Whether the word of n < 8 bytes whose lowercased bytes are `lowered` is a stop word.
  bool contains(uint64_t lowered, size_t n) const {
    uint64_t key = lowered | (static_cast<uint64_t>(n) << 56);
    if (keys_.size() > 16) return std::binary_search(keys_.begin(), keys_.end(), key);
    bool found = false;  // the usual handful: compare with all, no branches
    for (uint64_t k : keys_) found |= k == key;
    return found;
  }

 private:
  std::vector<uint64_t> keys_;
};

// ---------------------------------------------------------------------------------------------
class GopherQuality : public Stage {
 public:
  explicit GopherQuality(const StageParams& p) {
    min_words_ = p.get_int("min_doc_words", 50, 0, INT64_MAX);
    max_words_ = p.get_int("max_doc_words", 100000, 0, INT64_MAX);
    min_avg_ = p.get_double("min_avg_word_length", 3, 0, 1e9);
    max_avg_ = p.get_double("max_avg_word_length", 10, 0, 1e9);
    max_symbol_ = p.get_double("max_symbol_word_ratio", 0.1, 0, 1e9);
    max_bullet_ = p.get_double("max_bullet_lines_ratio", 0.9, 0, 1e9);
    max_ellipsis_ = p.get_double("max_ellipsis_lines_ratio", 0.3, 0, 1e9);
    min_alpha_ = p.get_double("min_alpha_words_ratio", 0.8, 0, 1);
    min_stop_ = p.get_int("min_stop_words", 2, 0, INT64_MAX);
    for (auto& w :
         p.get_list("stop_words", {"the", "be", "to", "of", "and", "that", "have", "with"}))
      stop_.insert(ascii_lower(w));
    for (auto& w : stop_) {
      max_stop_len_ = std::max(max_stop_len_, w.size());
      short_stop_.add(w);
    }
    LOOM_CHECK(max_stop_len_ <= 64, p.where("stop_words"), ": stop words are at most 64 bytes");
  }

  std::string process(Doc& doc, StageContext& ctx) const override {
    const std::string& t = doc.text;
    thread_local std::vector<std::string_view> words, lines;
    split_words(t, words);
    double n = static_cast<double>(words.size());
    ctx.score("word_count_log10", std::log10(n + 1), 0, 6);
    if (static_cast<int64_t>(words.size()) < min_words_) return "gopher_short_doc";
    if (static_cast<int64_t>(words.size()) > max_words_) return "gopher_long_doc";
    double chars = 0, alpha = 0;
    int64_t stops = 0;
    size_t total_chars = 0, alpha_words = 0;
    for (auto w : words) {
      uint64_t bytes;
      if (w.size() < 8 && detail::load_short_in(t, w, bytes)) {
        // Most words: one read of their bytes answers all three questions. A word with an
        // ASCII letter has a letter; one without letters or non-ASCII bytes has none.
        total_chars += w.size() - detail::continuation_bytes(bytes);
        alpha_words += has_ascii_letter_word(bytes) || ((bytes & kHigh) && has_alpha(w));
        stops += short_stop_.contains(ascii_lower_word(bytes), w.size());
        continue;
      }
      total_chars += utf8_length(w);
      alpha_words += has_alpha(w);
      if (w.size() <= max_stop_len_) {
        char low[64];
        for (size_t k = 0; k < w.size(); ++k)
          low[k] = (w[k] >= 'A' && w[k] <= 'Z') ? static_cast<char>(w[k] + 32) : w[k];
        if (stop_.count(std::string_view(low, w.size()))) ++stops;
      }
    }
    chars = static_cast<double>(total_chars);
    alpha = static_cast<double>(alpha_words);
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
    split_lines(t, lines);
    double bullets = 0, end_ellipsis = 0;
    for (auto l : lines) {
      auto s = trim_view(l);
      // Every bullet is a multi-byte character: ASCII-led lines skip the comparisons.
      if (!s.empty() && static_cast<unsigned char>(s[0]) >= 0x80)
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
  std::set<std::string, std::less<>> stop_;
  ShortStopWords short_stop_;  // the stop words shorter than 8 bytes, for words as short
  size_t max_stop_len_ = 0;
};

// ---------------------------------------------------------------------------------------------
// (duplicate elements, their characters) counting every repeat after the first occurrence.
// Elements are compared by content; `table` is scratch.
std::pair<size_t, size_t> find_duplicates(const std::vector<std::string_view>& xs,
                                          FlatTable& table) {
  table.reset(xs.size());
  size_t dup = 0, chars = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    bool inserted;
    table.find_or_insert_checked(
        table_hash(xs[i]), static_cast<uint32_t>(i), [&](uint32_t j) { return xs[j] == xs[i]; },
        inserted);
    if (!inserted) {
      ++dup;
      chars += utf8_length(xs[i]);
    }
  }
  return {dup, chars};
}

std::pair<size_t, size_t> find_duplicates(const std::vector<std::string_view>& xs) {
  thread_local FlatTable table;
  return find_duplicates(xs, table);
}

// The word n-grams of a document as equivalence classes, one n at a time. Words are equal when
// their hashes are; n-grams when their words are. Going from n to n+1 refines the classes: an
// n-gram that occurs once stays unique when extended, so each step revisits only the positions
// whose n-gram repeats (in prose, a small part of the text past n = 3) instead of hashing every
// position again.
class NgramClasses {
 public:
  // Starts at n = 1 over the words with these hashes.
  void reset(const std::vector<uint64_t>& word_hash, FlatTable& table) {
    const size_t W = word_hash.size();
    LOOM_CHECK(W < UINT32_MAX, "gopher_repetition: too many words in one document");
    word_id_.resize(W);
    assign_classes(word_hash, table, word_id_.data());
    class_ = word_id_;
    word_repeats_.resize(W);
    repeated_.resize(W);
    size_t kept = 0;
    for (size_t i = 0; i < W; ++i) {
      bool repeats = count_[word_id_[i]] > 1;
      word_repeats_[i] = repeats;
      repeated_[kept] = static_cast<uint32_t>(i);
      kept += repeats;  // compacting without a branch: whether a word repeats is unpredictable
    }
    repeated_.resize(kept);
    n_ = 1;
  }

  // From n to n + 1.
  void advance(FlatTable& table) {
    const size_t W = word_repeats_.size();
    // The (n+1)-gram at p is (n-gram at p, word at p + n): it can repeat only if both do.
    keys_.resize(repeated_.size());
    size_t kept = 0;
    for (uint32_t p : repeated_) {
      size_t next = std::min<size_t>(p + n_, W - 1);  // W - 1 stands in past the end
      bool extends = p + n_ < W && word_repeats_[next];
      keys_[kept] = (static_cast<uint64_t>(class_[p]) << 32) | word_id_[next];
      repeated_[kept] = p;
      kept += extends;
    }
    repeated_.resize(kept);
    keys_.resize(kept);
    ids_.resize(kept);
    assign_classes(keys_, table, ids_.data());
    size_t still = 0;
    for (size_t j = 0; j < kept; ++j) {
      uint32_t p = repeated_[j];
      class_[p] = ids_[j];
      repeated_[still] = p;
      still += count_[ids_[j]] > 1;
    }
    repeated_.resize(still);
    ++n_;
  }

  size_t n() const { return n_; }
  // Positions whose n-gram occurs more than once, ascending; every other n-gram is unique.
  const std::vector<uint32_t>& repeated() const { return repeated_; }
  uint32_t class_at(uint32_t p) const { return class_[p]; }  // for p in repeated()
  uint32_t occurrences(uint32_t cls) const { return count_[cls]; }
  size_t classes() const { return count_.size(); }  // an upper bound of the class names

 private:
  // Names each key by the index of its first occurrence (not by a running count of distinct
  // keys: that would chain every lookup to the one before) and counts each in count_.
  void assign_classes(const std::vector<uint64_t>& keys, FlatTable& table, uint32_t* id) {
    constexpr size_t kAhead = 16;  // probes in flight
    table.reset(keys.size());
    count_.assign(keys.size(), 0);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (i + kAhead < keys.size()) table.prefetch(keys[i + kAhead]);
      uint32_t c = table.find_or_assign(keys[i], static_cast<uint32_t>(i));
      id[i] = c;
      ++count_[c];
    }
  }

  size_t n_ = 0;
  std::vector<uint32_t> word_id_;      // the classes of n = 1
  std::vector<uint8_t> word_repeats_;  // whether the word at p occurs more than once
  std::vector<uint32_t> class_;        // class of the n-gram at p, for p in repeated_
  std::vector<uint32_t> count_;        // occurrences of each class
  std::vector<uint32_t> repeated_, ids_;
  std::vector<uint64_t> keys_;
};

// Per-thread buffers of the repetition filter, reused across documents.
struct RepetitionScratch {
  std::vector<std::string_view> paras, lines, words;
  std::vector<uint64_t> word_hash;
  std::vector<size_t> char_prefix;  // characters of words [0, i)
  std::vector<size_t> long_words;   // the words of 8 bytes or more
  std::vector<uint8_t> seen;
  NgramClasses grams;
  FlatTable table;
};

class GopherRepetition : public Stage {
 public:
  explicit GopherRepetition(const StageParams& p) {
    dup_line_ = p.get_double("dup_line_frac", 0.3, 0, 1e9);
    dup_para_ = p.get_double("dup_para_frac", 0.3, 0, 1e9);
    dup_line_char_ = p.get_double("dup_line_char_frac", 0.2, 0, 1e9);
    dup_para_char_ = p.get_double("dup_para_char_frac", 0.2, 0, 1e9);
    const double top[] = {0.2, 0.18, 0.16};
    for (int n = 2; n <= 4; ++n) {
      top_[n] = p.get_double(cat("top_", n, "_gram_frac"), top[n - 2], 0, 1e9);
      score_name_[n] = cat("top_", n, "_gram_frac");
      reason_[n] = cat("gopher_rep_top_", n, "_gram");
    }
    const double dup[] = {0.15, 0.14, 0.13, 0.12, 0.11, 0.10};
    for (int n = 5; n <= 10; ++n) {
      dup_[n] = p.get_double(cat("dup_", n, "_gram_frac"), dup[n - 5], 0, 1e9);
      score_name_[n] = cat("dup_", n, "_gram_frac");
      reason_[n] = cat("gopher_rep_duplicated_", n, "_n_grams");
    }
  }

  std::string process(Doc& doc, StageContext& ctx) const override {
    thread_local RepetitionScratch sc;
    std::string_view text = doc.text;
    double len = static_cast<double>(utf8_length(text));
    if (len == 0) return "gopher_rep_empty";
    // Paragraphs: separated by two or more newlines, so runs of lines with empty lines between
    // them. The trimmed text starts and ends with a non-empty line (or is one empty line).
    auto& paras = sc.paras;
    paras.clear();
    std::string_view st = trim_view(text);
    auto& st_lines = sc.lines;  // scratch until the lines of the whole text below
    split_lines(st, st_lines);
    for (size_t j = 0; j < st_lines.size();) {
      size_t k = j;
      while (k + 1 < st_lines.size() && !st_lines[k + 1].empty()) ++k;
      const char* b = st_lines[j].data();
      paras.emplace_back(b, static_cast<size_t>(st_lines[k].data() + st_lines[k].size() - b));
      for (j = k + 1; j < st_lines.size() && st_lines[j].empty();) ++j;
    }
    auto [pd, pc] = find_duplicates(paras, sc.table);
    double para_frac = static_cast<double>(pd) / static_cast<double>(paras.size());
    ctx.score("dup_para_frac", para_frac, 0, 1);
    if (para_frac > dup_para_) return "gopher_rep_dup_para_frac";
    if (static_cast<double>(pc) / len > dup_para_char_) return "gopher_rep_dup_para_char_frac";
    // Lines (blank lines are separators, not repeated content).
    auto& lines = sc.lines;
    split_lines(text, lines);
    lines.erase(std::remove_if(lines.begin(), lines.end(),
                               [](std::string_view l) { return trim_view(l).empty(); }),
                lines.end());
    if (!lines.empty()) {
      auto [ld, lc] = find_duplicates(lines, sc.table);
      double line_frac = static_cast<double>(ld) / static_cast<double>(lines.size());
      ctx.score("dup_line_frac", line_frac, 0, 1);
      if (line_frac > dup_line_) return "gopher_rep_dup_line_frac";
      if (static_cast<double>(lc) / len > dup_line_char_) return "gopher_rep_dup_line_char_frac";
    }
    // Word n-grams; an n-gram's characters are its words joined by single spaces.
    auto& words = sc.words;
    split_words(text, words);
    const size_t W = words.size();
    sc.word_hash.resize(W);
    sc.char_prefix.resize(W + 1);
    sc.char_prefix[0] = 0;
    // Most words are short: one read gives both their characters and the input of their hash,
    // and the hashes of the short ones are then computed in a loop that vectorises.
    sc.long_words.clear();
    for (size_t i = 0; i < W; ++i) {
      std::string_view w = words[i];
      uint64_t bytes;
      size_t chars;
      if (w.size() < 8 && detail::load_short_in(text, w, bytes)) {
        sc.word_hash[i] = bytes | (static_cast<uint64_t>(w.size()) << 56);
        chars = w.size() - detail::continuation_bytes(bytes);
      } else {
        sc.long_words.push_back(i);
        chars = utf8_length(w);
      }
      sc.char_prefix[i + 1] = sc.char_prefix[i] + chars;
    }
    for (size_t i = 0; i < W; ++i) sc.word_hash[i] = detail::hash64_packed(sc.word_hash[i], 7);
    for (size_t i : sc.long_words) sc.word_hash[i] = hash64(words[i], 7);
    auto gram_len = [&](size_t i, size_t n) {
      return n - 1 + sc.char_prefix[i + n] - sc.char_prefix[i];
    };
    NgramClasses& grams = sc.grams;
    if (W > 0) grams.reset(sc.word_hash, sc.table);
    auto advance_to = [&](size_t n) {
      while (grams.n() < n) grams.advance(sc.table);
    };
    for (auto& [n, thr] : top_) {
      if (W < static_cast<size_t>(n)) continue;
      advance_to(static_cast<size_t>(n));
      // The most frequent n-gram; ties go to the first seen. When none repeats, the first.
      uint32_t best = 1;
      size_t best_pos = 0;
      for (uint32_t p : grams.repeated()) {
        uint32_t c = grams.occurrences(grams.class_at(p));
        if (c > best) {
          best = c;
          best_pos = p;
        }
      }
      double frac = static_cast<double>(gram_len(best_pos, static_cast<size_t>(n)) * best) / len;
      ctx.score(score_name_.at(n), frac, 0, 1);
      if (frac > thr) return reason_.at(n);
    }
    for (auto& [n, thr] : dup_) {
      if (W < static_cast<size_t>(n)) continue;
      advance_to(static_cast<size_t>(n));
      const size_t step = static_cast<size_t>(n);
      sc.seen.assign(grams.classes(), 0);
      size_t dup_chars = 0;
      // As in datatrove: after a repeated n-gram, skip past it so overlaps count once. Unique
      // n-grams only move the scan forward by one, so the scan visits repeated positions alone.
      size_t next = 0;
      for (uint32_t p : grams.repeated()) {
        if (p < next) continue;
        uint8_t& seen = sc.seen[grams.class_at(p)];
        if (seen) {
          dup_chars += gram_len(p, step);
          next = p + step;
        } else {
          seen = 1;
          next = p + 1;
        }
      }
      double frac = static_cast<double>(dup_chars) / len;
      ctx.score(score_name_.at(n), frac, 0, 1);
      if (frac > thr) return reason_.at(n);
    }
    return "";
  }

 private:
  double dup_line_, dup_para_, dup_line_char_, dup_para_char_;
  std::map<int, double> top_, dup_;
  std::map<int, std::string> score_name_, reason_;
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
    min_sentences_ = p.get_int("min_num_sentences", 5, 0, INT64_MAX);
    min_words_line_ = p.get_int("min_words_per_line", 3, 0, INT64_MAX);
    max_word_len_ = p.get_int("max_word_length", 1000, 1, INT64_MAX);
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
    thread_local std::vector<std::string_view> raw_lines;
    thread_local std::string line_buf, lower;
    split_lines(doc.text, raw_lines);
    for (auto raw : raw_lines) {
      std::string_view l0 = trim_view(raw);
      if (l0.empty()) continue;  // blank lines separate paragraphs; they are not content
      ++lines_in;
      // Words split on spaces (and tabs ending a word); counted, and checked for length.
      int64_t nwords = 0;
      bool long_word = false;
      {
        size_t i = 0;
        while (i < l0.size()) {
          while (i < l0.size() && l0[i] == ' ') ++i;
          size_t b = i;
          while (i < l0.size() && l0[i] != ' ' && l0[i] != '\t') ++i;
          if (i > b) {
            ++nwords;
            if (max_word_len_ >= 0 && i - b > static_cast<size_t>(max_word_len_) &&
                static_cast<int64_t>(utf8_length(l0.substr(b, i - b))) > max_word_len_)
              long_word = true;
          }
          if (i < l0.size()) ++i;
        }
      }
      if (long_word) {
        ctx.count("lines_dropped_too_long_word");
        continue;
      }
      std::string_view line = l0;
      if (remove_citations_ && l0.find('[') != std::string_view::npos) {
        line_buf = remove_citations(l0);
        line = line_buf;
      }
      if (terminal_ && !ends_terminal_c4(line)) {
        ctx.count("lines_dropped_no_terminal_punct");
        continue;
      }
      if (nwords < min_words_line_) {
        ctx.count("lines_dropped_too_few_words");
        continue;
      }
      lower.assign(line);
      for (char& c : lower)
        if (c >= 'A' && c <= 'Z') c = static_cast<char>(c + 32);
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
  if (l.empty()) return false;
  // The ASCII marks are single bytes, and a multi-byte one ends in a byte of 0x80 or above:
  // the last byte decides which of the two lists can match.
  char last = l.back();
  if (static_cast<unsigned char>(last) < 0x80)
    return last == '.' || last == '!' || last == '?' || last == '"' || last == '\'';
  static constexpr std::string_view kStops[] = {"”", "’", "»", "。", "！", "？", "…", "؟", "।"};
  for (std::string_view s : kStops)
    if (ends_with(l, s)) return true;
  return false;
}

class FineWebFilter : public Stage {
 public:
  explicit FineWebFilter(const StageParams& p) {
    line_punct_ = p.get_double("line_punct_thr", 0.12, 0, 1);
    exclude_zero_ = p.get_bool("line_punct_exclude_zero", false);
    short_thr_ = p.get_double("short_line_thr", 0.67, 0, 1e9);
    short_len_ = p.get_int("short_line_length", 30, 0, INT64_MAX);
    char_dup_ = p.get_double("char_duplicates_ratio", 0.01, 0, 1e9);
    new_line_ = p.get_double("new_line_ratio", 0.3, 0, 1e9);
  }

  std::string process(Doc& doc, StageContext& ctx) const override {
    thread_local std::vector<std::string_view> raw, lines;
    split_lines(doc.text, raw);
    lines.clear();
    for (auto l : raw)
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
    size_t words = count_space_separated(doc.text);
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
    min_chars_ = p.get_int("min_chars", 0, 0, INT64_MAX);
    max_chars_ = p.get_int("max_chars", INT64_MAX, 0, INT64_MAX);
    min_words_ = p.get_int("min_words", 0, 0, INT64_MAX);
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
