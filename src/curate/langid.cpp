// Language identification with CLD2 (Debian libcld2): the top language, its share of the
// text as the confidence score, kept when the language is in the list and the score reaches
// the threshold. CLD2 reads about 32 MB/s per core, its cost in proportion to the bytes it
// reads, the slowest stage of a text pipeline, so documents past 1 KB are sampled
// (language_sample) rather than read whole.
#include <cstdio>  // compact_lang_det.h uses FILE without including it

#include <cld2/public/compact_lang_det.h>

#include <set>

#include "core/error.h"
#include "curate/langid.h"
#include "curate/stages.h"
#include "curate/text.h"

namespace loom::curate {

namespace {

bool continuation(char c) {
  return (static_cast<unsigned char>(c) & 0xC0) == 0x80;
}
bool space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

// How far a window edge may move to land on whitespace instead of inside a word.
constexpr size_t kWordSlack = 48;

}  // namespace

std::string_view language_sample(std::string_view text, size_t max_bytes, std::string& scratch) {
  if (max_bytes == 0 || text.size() <= max_bytes) return text;
  const size_t width = max_bytes / kSampleWindows, n = text.size();
  scratch.clear();
  for (int w = 0; w < kSampleWindows; ++w) {
    size_t begin = (n - width) * static_cast<size_t>(w) / (kSampleWindows - 1);
    size_t end = begin + width;
    // Inside the text, start after a space when one is near, else at the next character
    // boundary; end at a space when one is near (never before the start), else at a boundary.
    if (begin > 0) {
      size_t b = begin;
      while (b < end && b - begin < kWordSlack && !space(text[b])) ++b;
      begin = b < end && space(text[b]) ? b + 1 : begin;
      while (begin < end && continuation(text[begin])) ++begin;
    }
    if (end < n) {
      size_t e = end;
      while (e > begin && end - e < kWordSlack && !space(text[e - 1])) --e;
      end = e > begin && space(text[e - 1]) ? e : end;
      while (end > begin && continuation(text[end])) --end;
    }
    if (end <= begin) continue;
    if (!scratch.empty()) scratch += '\n';
    scratch.append(text.substr(begin, end - begin));
  }
  return scratch;
}

LangResult detect_language(std::string_view full_text, size_t max_bytes) {
  thread_local std::string scratch;
  std::string_view text = language_sample(full_text, max_bytes, scratch);
  // Set here: CLD2 leaves them unwritten when the text is not interchange-valid UTF-8.
  CLD2::Language lang3[3] = {CLD2::UNKNOWN_LANGUAGE, CLD2::UNKNOWN_LANGUAGE,
                             CLD2::UNKNOWN_LANGUAGE};
  int percent3[3] = {0, 0, 0};
  double norm3[3] = {0, 0, 0};
  int text_bytes = 0, valid_prefix = 0;
  bool reliable = false;
  CLD2::Language top = CLD2::ExtDetectLanguageSummaryCheckUTF8(
      text.data(), static_cast<int>(std::min<size_t>(text.size(), 1u << 30)), true, nullptr, 0,
      lang3, percent3, norm3, nullptr, &text_bytes, &reliable, &valid_prefix);
  LangResult r;
  r.code = CLD2::LanguageCode(top);
  // CLD2's summary language need not be lang3[0]: when English leads a mixed text, CLD2 names
  // the other language, so the score is the share of whichever of the three it named.
  for (int i = 0; i < 3; ++i)
    if (lang3[i] == top) r.score = percent3[i] / 100.0;
  if (!reliable) r.score *= 0.5;
  return r;
}

namespace {
class LangIdStage : public Stage {
 public:
  explicit LangIdStage(const StageParams& p) {
    for (auto& l : p.get_list("languages", {})) langs_.insert(l);
    min_score_ = p.get_double("min_score", 0.5, 0, 1);
    field_ = p.get_string("field", "language");
    int64_t sample = p.get_int("sample_bytes", kDefaultSampleBytes, 0, int64_t{1} << 30);
    LOOM_CHECK(sample == 0 || sample >= 4 * kSampleWindows, p.where("sample_bytes"),
               " must be 0 (read whole documents) or at least ", 4 * kSampleWindows, ", not ",
               sample);
    sample_bytes_ = static_cast<size_t>(sample);
  }
  std::string process(Doc& doc, StageContext& ctx) const override {
    LangResult r = detect_language(doc.text, sample_bytes_);
    doc.record[field_] = r.code;
    doc.record[field_ + "_score"] = r.score;
    ctx.count("lang_" + r.code);
    ctx.score("language_score", r.score, 0, 1);
    if (!langs_.empty() && !langs_.count(r.code)) return "language_not_in_list";
    if (r.score < min_score_) return "language_score_below_threshold";
    return "";
  }

 private:
  std::set<std::string> langs_;
  double min_score_;
  std::string field_;
  size_t sample_bytes_;
};
}  // namespace

std::unique_ptr<Stage> make_langid_stage(const StageParams& p) {
  return std::make_unique<LangIdStage>(p);
}

}  // namespace loom::curate
