#include <gtest/gtest.h>

#include "curate/langid.h"
#include "helpers.h"

using namespace loom::curate;

static const char* kEn =
    "The committee will meet again next week to discuss the budget for the new library, and "
    "members of the public are welcome to attend and share their views on the proposal.";
static const char* kDe =
    "Der Ausschuss wird sich nächste Woche erneut treffen, um über den Haushalt für die neue "
    "Bibliothek zu beraten, und die Öffentlichkeit ist herzlich eingeladen, daran teilzunehmen.";
static const char* kFr =
    "Le comité se réunira de nouveau la semaine prochaine pour discuter du budget de la nouvelle "
    "bibliothèque, et le public est invité à venir donner son avis sur la proposition.";

TEST(LangId, DetectsCommonLanguagesWithConfidence) {
  auto en = detect_language(kEn), de = detect_language(kDe), fr = detect_language(kFr);
  EXPECT_EQ(en.code, "en");
  EXPECT_EQ(de.code, "de");
  EXPECT_EQ(fr.code, "fr");
  EXPECT_GT(en.score, 0.8);
  EXPECT_EQ(detect_language("12345 67890 !!!").code, "un");
}

TEST(LangId, StageFiltersByListAndThreshold) {
  const std::string cfg = "type = \"langid\"\nlanguages = [\"en\", \"fr\"]\nmin_score = 0.6";
  auto en = test::run_stage(cfg, kEn);
  EXPECT_EQ(en.reason, "");
  EXPECT_EQ(en.doc.record.at("language").as_string(), "en");
  EXPECT_GT(en.doc.record.at("language_score").as_double(), 0.6);
  EXPECT_EQ(test::run_stage(cfg, kFr).reason, "");
  EXPECT_EQ(test::run_stage(cfg, kDe).reason, "language_not_in_list");
  // Half English, half German: English wins but with a share below a strict threshold.
  std::string mixed = std::string(kEn) + " " + kDe;
  EXPECT_EQ(test::run_stage("type = \"langid\"\nmin_score = 0.9", mixed).reason,
            "language_score_below_threshold");
}
