#include <gtest/gtest.h>

#include <random>

#include "core/fs.h"
#include "curate/classifier.h"
#include "helpers.h"

using namespace loom::curate;
using loom::curate::test::TempDir;

// Two classes that differ in vocabulary (plus shared filler words), as "good" and "spam" pages.
static std::vector<LabelledText> make_data(int n, uint64_t seed) {
  static const char* kGood[] = {"research",   "analysis", "history", "evidence",
                                "theory",     "method",   "results", "chapter",
                                "experiment", "science",  "author",  "study"};
  static const char* kSpam[] = {"click", "free",  "winner", "casino",    "discount", "buy",
                                "cheap", "offer", "bonus",  "subscribe", "deal",     "prize"};
  static const char* kShared[] = {"the", "and", "of", "new", "page", "today", "people", "more"};
  std::mt19937_64 rng(seed);
  std::vector<LabelledText> out;
  for (int i = 0; i < n; ++i) {
    bool good = i % 2 == 0;
    std::string t;
    for (int w = 0; w < 20; ++w) {
      if (rng() % 3 == 0)
        t += std::string(good ? kGood[rng() % 12] : kSpam[rng() % 12]) + " ";
      else
        t += std::string(kShared[rng() % 8]) + " ";
    }
    out.push_back({t, good ? "hq" : "lq"});
  }
  return out;
}

TEST(Classifier, LearnsSeparableClassesAndRoundTrips) {
  ClassifierOptions o;
  o.buckets = 1 << 14;
  o.epochs = 5;
  auto train = make_data(600, 1), held = make_data(200, 2);
  TextClassifier m = TextClassifier::train(train, o);
  EXPECT_EQ(m.labels(), (std::vector<std::string>{"hq", "lq"}));
  EXPECT_GT(m.accuracy(held), 0.95);
  // Training is deterministic for a seed.
  TextClassifier m2 = TextClassifier::train(train, o);
  EXPECT_EQ(m.predict(held[0].text), m2.predict(held[0].text));
  TempDir t;
  m.save(t / "q.bin");
  TextClassifier back = TextClassifier::load(t / "q.bin");
  for (int i = 0; i < 10; ++i) EXPECT_EQ(back.predict(held[i].text), m.predict(held[i].text));
  // A truncated model is a clear error, not garbage.
  std::string bytes = loom::read_file(t / "q.bin");
  loom::write_file_atomic(t / "bad.bin", bytes.substr(0, bytes.size() - 5));
  EXPECT_THROW(TextClassifier::load(t / "bad.bin"), loom::Error);
}

TEST(Classifier, StageScoresAndThresholds) {
  ClassifierOptions o;
  o.buckets = 1 << 14;
  TempDir t;
  TextClassifier::train(make_data(600, 3), o).save(t / "q.bin");
  std::string base =
      "type = \"quality_classifier\"\nmodel = \"" + (t / "q.bin") + "\"\nthreshold = 0.5";
  std::string cfg = base + "\nlabel = \"hq\"";
  auto good = test::run_stage(cfg, "the research and analysis of history with evidence and theory");
  EXPECT_EQ(good.reason, "");
  EXPECT_GT(good.doc.record.at("quality_score").as_double(), 0.5);
  auto spam = test::run_stage(cfg, "click free casino bonus offer and buy cheap discount today");
  EXPECT_EQ(spam.reason, "quality_below_threshold");
  EXPECT_LT(spam.doc.record.at("quality_score").as_double(), 0.5);
  EXPECT_THROW(test::run_stage(base + "\nlabel = \"nope\"", "x"), loom::Error);
}
