// Language identification with CLD2 (Debian libcld2): the top language, its share of the
// text as the confidence score, kept when the language is in the list and the score reaches
// the threshold.
#include <cstdio>  // compact_lang_det.h uses FILE without including it

#include <cld2/public/compact_lang_det.h>

#include <set>

#include "core/error.h"
#include "curate/langid.h"
#include "curate/stages.h"
#include "curate/text.h"

namespace loom::curate {

LangResult detect_language(std::string_view text) {
  CLD2::Language lang3[3];
  int percent3[3];
  double norm3[3];
  int text_bytes = 0, valid_prefix = 0;
  bool reliable = false;
  CLD2::Language top = CLD2::ExtDetectLanguageSummaryCheckUTF8(
      text.data(), static_cast<int>(std::min<size_t>(text.size(), 1u << 30)), true, nullptr, 0,
      lang3, percent3, norm3, nullptr, &text_bytes, &reliable, &valid_prefix);
  LangResult r;
  r.code = CLD2::LanguageCode(top);
  r.score = lang3[0] == top ? percent3[0] / 100.0 : 0.0;
  if (!reliable) r.score *= 0.5;
  return r;
}

namespace {
class LangIdStage : public Stage {
 public:
  explicit LangIdStage(const StageParams& p) {
    for (auto& l : p.get_list("languages", {})) langs_.insert(l);
    min_score_ = p.get_double("min_score", 0.5);
    field_ = p.get_string("field", "language");
  }
  std::string process(Doc& doc, StageContext& ctx) const override {
    LangResult r = detect_language(doc.text);
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
};
}  // namespace

std::unique_ptr<Stage> make_langid_stage(const StageParams& p) {
  return std::make_unique<LangIdStage>(p);
}

}  // namespace loom::curate
