// Each filter on hand-made documents at both sides of each threshold; every rejection must
// name the rule that fired.
#include <gtest/gtest.h>

#include "curate/text.h"
#include "helpers.h"

using loom::curate::split_words;
using loom::curate::test::prose;
using loom::curate::test::run_stage;

static const std::string kGopher = "type = \"gopher_quality\"";
static const std::string kRep = "type = \"gopher_repetition\"";
static const std::string kLooseNgrams =
    kRep +
    "\ndup_5_gram_frac = 1\ndup_6_gram_frac = 1\ndup_7_gram_frac = 1\ndup_8_gram_frac = 1"
    "\ndup_9_gram_frac = 1\ndup_10_gram_frac = 1";

TEST(GopherQuality, NaturalProsePasses) {
  EXPECT_EQ(run_stage(kGopher, prose(8)).reason, "");
}

TEST(GopherQuality, WordCountBounds) {
  std::string t = prose(8);
  int n = static_cast<int>(split_words(t).size());
  EXPECT_EQ(run_stage(kGopher + "\nmin_doc_words = " + std::to_string(n), t).reason, "");
  EXPECT_EQ(run_stage(kGopher + "\nmin_doc_words = " + std::to_string(n + 1), t).reason,
            "gopher_short_doc");
  EXPECT_EQ(run_stage(kGopher + "\nmax_doc_words = " + std::to_string(n), t).reason, "");
  EXPECT_EQ(run_stage(kGopher + "\nmax_doc_words = " + std::to_string(n - 1), t).reason,
            "gopher_long_doc");
  // Default: 50 words.
  EXPECT_EQ(run_stage(kGopher, prose(2)).reason, "gopher_short_doc");
}

TEST(GopherQuality, MeanWordLength) {
  std::string shortw;
  for (int i = 0; i < 30; ++i) shortw += "the cat of an ox and a pig. ";
  EXPECT_EQ(run_stage(kGopher, shortw).reason, "gopher_below_avg_threshold");
  std::string longw;
  for (int i = 0; i < 12; ++i)
    longw +=
        "the internationalization characterization telecommunications and incomprehensibilities "
        "with. ";
  EXPECT_EQ(run_stage(kGopher, longw).reason, "gopher_above_avg_threshold");
}

TEST(GopherQuality, HashSymbolRatio) {
  std::string base = prose(8);
  // Hashtags add words too; find the count at which the ratio first exceeds 0.1.
  for (int k = 1; k < 40; ++k) {
    std::string t = base + "\nTags:";
    for (int i = 0; i < k; ++i) t += " #topic" + std::to_string(i);
    double ratio = static_cast<double>(k) / static_cast<double>(split_words(t).size());
    EXPECT_EQ(run_stage(kGopher, t).reason, ratio > 0.1 ? "gopher_too_many_hashes" : "") << k;
  }
}

TEST(GopherQuality, BulletAndEllipsisLines) {
  std::string nine, ten;
  const std::string p11 = prose(11);
  auto lines = loom::curate::split_lines(p11);
  // 10 of 11 lines bulleted: 0.909 > 0.9.
  for (size_t i = 0; i < lines.size(); ++i)
    ten += (i ? "\n" : "") + std::string(i < 10 ? "• " : "") + std::string(lines[i]);
  // 9 of 10 lines: exactly 0.9, not above.
  for (size_t i = 0; i < 10; ++i)
    nine += (i ? "\n" : "") + std::string(i < 9 ? "• " : "") + std::string(lines[i]);
  EXPECT_EQ(run_stage(kGopher, ten).reason, "gopher_too_many_bullets");
  EXPECT_EQ(run_stage(kGopher, nine).reason, "");
  std::string e3, e2;
  const std::string p8 = prose(8);
  auto l8 = loom::curate::split_lines(p8);
  for (size_t i = 0; i < 8; ++i)
    e3 += (i ? "\n" : "") + std::string(l8[i]) + (i < 3 ? ".." : "");  // 3/8
  for (size_t i = 0; i < 8; ++i)
    e2 += (i ? "\n" : "") + std::string(l8[i]) + (i < 2 ? ".." : "");  // 2/8
  EXPECT_EQ(run_stage(kGopher, e3).reason, "gopher_too_many_end_ellipsis");
  EXPECT_EQ(run_stage(kGopher, e2).reason, "");
}

TEST(GopherQuality, AlphabeticWordsAndStopWords) {
  std::string base = prose(8);
  for (int k = 10; k < 60; k += 7) {
    std::string t = base + "\n";
    for (int i = 0; i < k; ++i) t += std::to_string(1000 + i) + " ";
    auto words = split_words(t);
    double alpha = static_cast<double>(words.size() - static_cast<size_t>(k)) /
                   static_cast<double>(words.size());
    EXPECT_EQ(run_stage(kGopher, t).reason, alpha < 0.8 ? "gopher_below_alpha_threshold" : "") << k;
  }
  std::string no_stop = base;
  for (const char* s : {"The ", " of the", " and"}) {
    for (size_t p; (p = no_stop.find(s)) != std::string::npos;)
      no_stop.erase(p, std::string(s).size());
  }
  EXPECT_EQ(run_stage(kGopher, no_stop).reason, "gopher_too_few_stop_words");
  EXPECT_EQ(run_stage(kGopher, "The " + no_stop).reason, "gopher_too_few_stop_words");  // 1 < 2
  EXPECT_EQ(run_stage(kGopher, "The the " + no_stop).reason, "");
}

TEST(GopherRepetition, DuplicateLines) {
  std::string base = prose(10);
  std::string five = base, four = base;
  for (int i = 0; i < 6; ++i) five += "\nYes.";  // 16 lines, 5 repeats: 0.3125 > 0.3
  for (int i = 0; i < 4; ++i) four += "\nYes.";  // 14 lines, 3 repeats: 0.21
  EXPECT_EQ(run_stage(kRep, five).reason, "gopher_rep_dup_line_frac");
  EXPECT_EQ(run_stage(kRep, four).reason, "");
  EXPECT_EQ(run_stage(kRep, base).reason, "");
}

TEST(GopherRepetition, DuplicateLineCharacters) {
  std::string base = prose(10);
  auto lines = loom::curate::split_lines(base);
  std::string t = base + "\n" + std::string(lines[0]) + "\n" + std::string(lines[1]);
  double frac =
      static_cast<double>(lines[0].size() + lines[1].size()) / static_cast<double>(t.size());
  EXPECT_EQ(run_stage(kRep + "\ndup_line_char_frac = " + std::to_string(frac - 0.001), t).reason,
            "gopher_rep_dup_line_char_frac");
  // The repeated lines also repeat n-grams; relax those rules to see this one alone.
  EXPECT_EQ(
      run_stage(kLooseNgrams + "\ndup_line_char_frac = " + std::to_string(frac + 0.001), t).reason,
      "");
}

TEST(GopherRepetition, DuplicateParagraphs) {
  std::string p1 = prose(2, 1), p2 = prose(2, 2), p3 = prose(2, 3);
  std::string t = p1 + "\n\n" + p2 + "\n\n" + p1 + "\n\n" + p3;  // 1 of 4 repeated: 0.25
  const std::string loose = kLooseNgrams + "\ndup_para_char_frac = 0.9\ndup_line_char_frac = 0.9";
  EXPECT_EQ(run_stage(loose, t).reason, "");
  EXPECT_EQ(run_stage(loose + "\ndup_para_frac = 0.2", t).reason, "gopher_rep_dup_para_frac");
  EXPECT_EQ(run_stage(kRep, t).reason, "gopher_rep_dup_para_char_frac");  // ~0.25 of chars > 0.2
}

TEST(GopherRepetition, TopBigramAndDuplicatedNgrams) {
  std::string base = prose(6);
  auto with_bigram = [&](int k) {
    std::string t = base + "\n";
    for (int i = 0; i < k; ++i) t += "alpha beta x" + std::to_string(i) + " ";
    return t;
  };
  EXPECT_EQ(run_stage(kRep, with_bigram(40)).reason, "gopher_rep_top_2_gram");
  EXPECT_EQ(run_stage(kRep, with_bigram(4)).reason, "");
  std::string phrase =
      "seventeen purple elephants quietly painted wonderful murals across the northern city walls "
      "today";
  auto with_phrase = [&](int k) {
    std::string t = prose(20) + "\n";
    for (int i = 0; i < k; ++i) t += phrase + " ";
    return t;
  };
  EXPECT_EQ(run_stage(kRep, with_phrase(8)).reason, "gopher_rep_duplicated_5_n_grams");
  EXPECT_EQ(run_stage(kRep, with_phrase(2)).reason, "");
}

TEST(C4, LineRulesEditTheText) {
  std::string t =
      "Home | About | Contact\n"
      "This sentence ends properly and has words.[1]\n"
      "Please enable JavaScript to view the comments.\n"
      "We use cookies. Read our privacy policy for details.\n"
      "Two words.\n"
      "Another good line is here.[citation needed]\n"
      "A third fine sentence stays. It even has two sentences!\n"
      "The fourth line is also kept here.\n";
  auto r = run_stage("type = \"c4\"", t);
  EXPECT_EQ(r.reason, "");
  EXPECT_EQ(r.text,
            "This sentence ends properly and has words.\n"
            "Another good line is here.\n"
            "A third fine sentence stays. It even has two sentences!\n"
            "The fourth line is also kept here.");
  EXPECT_EQ(r.stats.counters["lines_dropped_no_terminal_punct"], 1);
  EXPECT_EQ(r.stats.counters["lines_dropped_javascript"], 1);
  EXPECT_EQ(r.stats.counters["lines_dropped_policy"], 1);
  EXPECT_EQ(r.stats.counters["lines_dropped_too_few_words"], 1);
}

TEST(C4, PageRules) {
  std::string five = prose(5), four = prose(4);
  EXPECT_EQ(run_stage("type = \"c4\"", five).reason, "");
  EXPECT_EQ(run_stage("type = \"c4\"", four).reason, "c4_too_few_sentences");
  EXPECT_EQ(run_stage("type = \"c4\"", five + "\nLorem ipsum dolor sit amet.").reason,
            "c4_lorem_ipsum");
  EXPECT_EQ(run_stage("type = \"c4\"", five + "\nThe function f() { return 1; } is here.").reason,
            "c4_curly_bracket");
  EXPECT_EQ(run_stage("type = \"c4\"\nfilter_curly_bracket = false", five + "\nThe code { is here.")
                .reason,
            "");
}

static std::string long_line(int i, const char* end) {
  return "The number " + std::to_string(i) + " of the series is written out here" + end;
}

TEST(FineWeb, TerminalPunctuationRatio) {
  auto doc = [](int punct) {
    std::string t;
    for (int i = 0; i < 10; ++i) t += long_line(i, i < punct ? "." : "") + "\n";
    return t;
  };
  EXPECT_EQ(run_stage("type = \"fineweb\"", doc(1)).reason, "fineweb_line_punct_ratio");  // 0.1
  EXPECT_EQ(run_stage("type = \"fineweb\"", doc(2)).reason, "");                          // 0.2
}

TEST(FineWeb, ShortLineRatio) {
  auto doc = [](int shorts) {
    std::string t;
    for (int i = 0; i < 10; ++i)
      t += (i < shorts ? "Short line number " + std::to_string(i) + "." : long_line(i, ".")) + "\n";
    return t;
  };
  EXPECT_EQ(run_stage("type = \"fineweb\"", doc(7)).reason, "fineweb_short_line_ratio");  // 0.7
  EXPECT_EQ(run_stage("type = \"fineweb\"", doc(6)).reason, "");                          // 0.6
}

TEST(FineWeb, DuplicateLineCharactersAndListRatio) {
  std::string base = prose(20);
  auto lines = loom::curate::split_lines(base);
  EXPECT_EQ(run_stage("type = \"fineweb\"", base).reason, "");
  EXPECT_EQ(run_stage("type = \"fineweb\"", base + "\n" + std::string(lines[3])).reason,
            "fineweb_char_dup_ratio");
  auto list = [](int words_per_line) {
    std::string t;
    for (int i = 0; i < 12; ++i) {
      std::string l;
      for (int w = 0; w < words_per_line; ++w)
        l += (w ? " " : "") + std::string("Itemizedentry") + std::to_string(i * 10 + w);
      t += l + ".\n";
    }
    return t;
  };
  EXPECT_EQ(run_stage("type = \"fineweb\"", list(3)).reason, "fineweb_list_ratio");  // 11/36 > 0.3
  EXPECT_EQ(run_stage("type = \"fineweb\"", list(4)).reason, "");                    // 11/48
}
