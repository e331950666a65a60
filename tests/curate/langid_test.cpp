#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "curate/langid.h"
#include "curate/text.h"
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

static std::string repeat(const std::string& s, size_t bytes) {
  std::string out;
  while (out.size() < bytes) out += s + " ";
  return out;
}

// `bytes` of the sentence's words in a seeded random order: CLD2 squeezes out text that
// repeats verbatim, so a long test document must not be one sentence over and over.
static std::string shuffled(const std::string& sentence, size_t bytes) {
  std::vector<std::string> words;
  for (std::string_view w : split_words(sentence)) words.emplace_back(w);
  std::mt19937 rng(7);
  std::string out;
  while (out.size() < bytes) {
    std::shuffle(words.begin(), words.end(), rng);
    for (auto& w : words) out += w + " ";
    out.back() = '\n';
  }
  return out;
}

TEST(LangId, SampleOfLongDocumentsCoversStartMiddleAndEnd) {
  std::string scratch;
  std::string shortdoc = kFr;
  EXPECT_EQ(language_sample(shortdoc, 4096, scratch), shortdoc);  // short: read whole
  EXPECT_EQ(language_sample(repeat(kDe, 50000), 0, scratch).size(), repeat(kDe, 50000).size());
  // Four distinct 20 KB parts: each window lands in its own part, whole words, valid UTF-8.
  std::string parts[4] = {repeat("alpha", 20000), repeat("bravo", 20000), repeat("čaj ÿes", 20000),
                          repeat("delta", 20000)};
  std::string doc = parts[0] + parts[1] + parts[2] + parts[3];
  std::string_view sample = language_sample(doc, 4096, scratch);
  EXPECT_LE(sample.size(), 4096u);
  EXPECT_GT(sample.size(), 3800u);
  EXPECT_EQ(sample.substr(0, 6), "alpha ");  // the first window starts at the first byte
  EXPECT_EQ(sample.substr(sample.size() - 6), "delta ");  // and the last ends at the last
  for (const char* word : {"alpha", "bravo", "čaj", "delta"})
    EXPECT_NE(sample.find(word), std::string_view::npos) << word;
  size_t lines = 0;
  for (std::string_view rest = sample; !rest.empty();) {
    size_t nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    ++lines;
    EXPECT_NE(line.front(), ' ');  // cut after whitespace, so whole words
    EXPECT_EQ(line.back(), ' ');
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
  }
  EXPECT_EQ(lines, static_cast<size_t>(kSampleWindows));
  EXPECT_TRUE(utf8_valid(sample));

  // A document without whitespace is still cut at character boundaries.
  std::string cjk;
  while (cjk.size() < 30000) cjk += "語";
  std::string_view s2 = language_sample(cjk, 1000, scratch);
  EXPECT_TRUE(utf8_valid(s2));
  EXPECT_GT(s2.size(), 900u);
}

TEST(LangId, SampledScoreSeesALanguageThatFillsTheEnd) {
  // 60 KB of English then 60 KB of German: the whole text and the sample both give about half
  // to each, where a prefix would call it all English.
  std::string doc = shuffled(kEn, 60000) + shuffled(kDe, 60000);
  LangResult whole = detect_language(doc, 0), sampled = detect_language(doc, 4096);
  EXPECT_EQ(whole.code, sampled.code);
  EXPECT_GT(whole.score, 0.3);  // the share of the language CLD2 named, even when not lang3[0]
  EXPECT_LT(whole.score, 0.7);
  EXPECT_GT(detect_language(std::string_view(doc).substr(0, 4096), 0).score, 0.9);
  EXPECT_LT(sampled.score, 0.7);
  EXPECT_GT(sampled.score, 0.3);
  EXPECT_GT(detect_language(shuffled(kEn, 60000), 4096).score, 0.9);
  EXPECT_EQ(detect_language(shuffled(kFr, 60000), 4096).code, "fr");
  EXPECT_THROW(test::run_stage("type = \"langid\"\nsample_bytes = 3", kEn), loom::Error);
}
