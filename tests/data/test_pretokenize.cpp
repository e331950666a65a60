#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/pretokenize.h"
#include "data/unicode.h"

using namespace loom::data;

static std::vector<std::string> split(PreTokenizer p, std::string_view text) {
  std::vector<std::string> out;
  for_each_piece(p, text, [&](std::string_view piece) { out.emplace_back(piece); });
  return out;
}

using V = std::vector<std::string>;

TEST(UnicodeClasses, KnownCodePoints) {
  EXPECT_EQ(char_class('a'), CharClass::Letter);
  EXPECT_EQ(char_class('7'), CharClass::Number);
  EXPECT_EQ(char_class(' '), CharClass::Space);
  EXPECT_EQ(char_class('!'), CharClass::Other);
  EXPECT_EQ(char_class(0x4E2D), CharClass::Letter);   // CJK ideograph
  EXPECT_EQ(char_class(0x00BD), CharClass::Number);   // vulgar fraction one half (No)
  EXPECT_EQ(char_class(0x3000), CharClass::Space);    // ideographic space
  EXPECT_EQ(char_class(0x0085), CharClass::Space);    // next line: White_Space
  EXPECT_EQ(char_class(0x200B), CharClass::Other);    // zero width space is not White_Space
  EXPECT_EQ(char_class(0x1F600), CharClass::Other);   // emoji
  EXPECT_EQ(char_class(0x20000), CharClass::Letter);  // CJK extension B (a range in the UCD)
}

TEST(Utf8, RejectsMalformedSequences) {
  EXPECT_TRUE(utf8_valid("plain ascii"));
  EXPECT_TRUE(utf8_valid("caf\xc3\xa9 \xf0\x9f\x98\x80"));
  size_t bad = 99;
  EXPECT_FALSE(utf8_valid("ab\xff", &bad));
  EXPECT_EQ(bad, 2u);
  EXPECT_FALSE(utf8_valid("\xc0\xaf"));          // overlong '/'
  EXPECT_FALSE(utf8_valid("\xed\xa0\x80"));      // surrogate
  EXPECT_FALSE(utf8_valid("\xf4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(utf8_valid("\xe4\xb8"));          // truncated
}

TEST(PreTokenizeGpt2, WordsSpacesAndContractions) {
  EXPECT_EQ(split(PreTokenizer::Gpt2, "Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(split(PreTokenizer::Gpt2, "I'm he'll"), (V{"I", "'m", " he", "'ll"}));
  EXPECT_EQ(split(PreTokenizer::Gpt2, "I'M"), (V{"I", "'", "M"}));  // case-sensitive
  EXPECT_EQ(split(PreTokenizer::Gpt2, "a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(split(PreTokenizer::Gpt2, "a \tb"), (V{"a", " ", "\t", "b"}));
  EXPECT_EQ(split(PreTokenizer::Gpt2, "x  "), (V{"x", "  "}));  // trailing run kept whole
  EXPECT_EQ(split(PreTokenizer::Gpt2, "abc123 456!?"), (V{"abc", "123", " 456", "!?"}));
  EXPECT_EQ(split(PreTokenizer::Gpt2, "\xe4\xb8\xad\xe6\x96\x87"), (V{"\xe4\xb8\xad\xe6\x96\x87"}));
}

TEST(PreTokenizeCl100k, LetterPrefixNumbersAndNewlines) {
  EXPECT_EQ(split(PreTokenizer::Cl100k, "I'M ok"), (V{"I", "'M", " ok"}));
  EXPECT_EQ(split(PreTokenizer::Cl100k, "(int x"), (V{"(int", " x"}));
  EXPECT_EQ(split(PreTokenizer::Cl100k, "12345"), (V{"123", "45"}));
  EXPECT_EQ(split(PreTokenizer::Cl100k, "a;\n\nb"), (V{"a", ";\n\n", "b"}));
  EXPECT_EQ(split(PreTokenizer::Cl100k, "x \n  y"), (V{"x", " \n", " ", " y"}));
  EXPECT_EQ(split(PreTokenizer::Cl100k, "\n\tfoo"), (V{"\n", "\tfoo"}));
}

TEST(PreTokenize, InvalidBytesAreOtherAndCoverTheInput) {
  std::string text = "ab\xff\xfe cd\xc3";
  for (PreTokenizer p : {PreTokenizer::Gpt2, PreTokenizer::Cl100k}) {
    std::string joined;
    for (auto& s : split(p, text)) joined += s;
    EXPECT_EQ(joined, text);
  }
  EXPECT_EQ(split(PreTokenizer::Gpt2, text), (V{"ab", "\xff\xfe", " cd", "\xc3"}));
}
