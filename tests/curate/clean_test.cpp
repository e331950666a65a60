#include <gtest/gtest.h>

#include "curate/clean.h"
#include "curate/text.h"
#include "helpers.h"

using namespace loom::curate;

TEST(Clean, InvalidUtf8IsReplacedOrDropped) {
  std::string bad = "ok \xC3\x28 x \xFF\xFE end \xE2\x82";  // bad continuation, junk, truncated
  int64_t n = 0;
  std::string fixed = repair_utf8(bad, true, &n);
  EXPECT_TRUE(utf8_valid(fixed));
  EXPECT_EQ(n, 5);
  EXPECT_EQ(fixed, "ok \xEF\xBF\xBD( x \xEF\xBF\xBD\xEF\xBF\xBD end \xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(repair_utf8(bad, false), "ok ( x  end ");
  // Overlong encodings and surrogates are invalid too.
  EXPECT_FALSE(utf8_valid("\xC0\xAF"));
  EXPECT_FALSE(utf8_valid("\xED\xA0\x80"));
  EXPECT_TRUE(utf8_valid("caf\xC3\xA9 \xF0\x9F\x98\x80"));
}

TEST(Clean, MojibakeFromCp1252AndLatin1IsReversed) {
  int64_t fixes = 0;
  EXPECT_EQ(fix_mojibake("CafÃ© au lait", &fixes), "Café au lait");
  EXPECT_EQ(fixes, 1);
  EXPECT_EQ(fix_mojibake("itâ€™s â€œquotedâ€\xC2\x9D"), "it’s “quoted”");  // 0x9D: C1 in latin-1
  EXPECT_EQ(fix_mojibake("naÃ¯ve rÃ©sumÃ©"), "naïve résumé");
  // Double encoding: UTF-8 -> cp1252 -> UTF-8 -> cp1252 -> UTF-8.
  EXPECT_EQ(fix_mojibake("CafÃƒÂ©"), "Café");
  // Correct text is left alone, including legitimate Latin-1 letters.
  EXPECT_EQ(fix_mojibake("Âge déjà vu, Ãrbol"), "Âge déjà vu, Ãrbol");
  EXPECT_EQ(fix_mojibake("plain ascii"), "plain ascii");
}

TEST(Clean, NfcAndNfkc) {
  std::string decomposed = "Cafe\xCC\x81";  // e + combining acute
  EXPECT_EQ(unicode_normalize(decomposed, "nfc"), "Caf\xC3\xA9");
  EXPECT_EQ(unicode_normalize("ﬁne ①", "nfc"), "ﬁne ①");
  EXPECT_EQ(unicode_normalize("ﬁne ①", "nfkc"), "fine 1");
  EXPECT_EQ(unicode_normalize(decomposed, "none"), decomposed);
}

TEST(Clean, ControlCharactersAndWhitespace) {
  CleanOptions o;
  CleanCounts c;
  std::string in =
      "\xEF\xBB\xBF  Title\r\n\r\n\r\n\r\nfirst\x01 line   with\tgaps  \n\n\n  indented\x7F "
      "code\rlast ";
  std::string out = clean_text(in, o, &c);
  EXPECT_EQ(out, "Title\n\nfirst line with gaps\n\n  indented code\nlast");
  EXPECT_EQ(c.control_chars, 3);  // BOM, \x01, DEL
}

TEST(Clean, StageRejectsDocumentsThatCleanToNothing) {
  auto r = loom::curate::test::run_stage("type = \"clean\"", " \x01\x02 \n\n ");
  EXPECT_EQ(r.reason, "empty_after_cleaning");
  auto k = loom::curate::test::run_stage("type = \"clean\"\nnormalize = \"nfkc\"", "ﬁne CafÃ©\x01");
  EXPECT_EQ(k.reason, "");
  EXPECT_EQ(k.text, "fine Café");
  EXPECT_EQ(k.stats.counters["docs_mojibake_fixed"], 1);
  EXPECT_THROW(loom::curate::test::run_stage("type = \"clean\"\nnormalize = \"nfd\"", "x"),
               loom::Error);
  EXPECT_THROW(loom::curate::test::run_stage("type = \"clean\"\nnormalise = \"nfc\"", "x"),
               loom::Error);
}
