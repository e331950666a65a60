#include <gtest/gtest.h>
#include <utf8proc.h>

#include <cstdlib>
#include <random>

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

// Normalisation only sends the spans around code points that can change (or make their
// neighbours change) through utf8proc; the result must equal normalising the whole text.
TEST(Clean, PiecewiseNormalizationEqualsWholeText) {
  const char* pool[] = {"a",
                        "e",
                        "A",
                        " ",
                        "\n",
                        "Z",
                        "\xC3\xA9" /* é */,
                        "\xC3\x80" /* À */,
                        "\xCC\x81" /* combining acute */,
                        "\xCC\xA3" /* combining dot below */,
                        "\xCC\x88" /* combining diaeresis */,
                        "\xEF\xAC\x81" /* ﬁ */,
                        "\xE2\x91\xA0" /* ① */,
                        "\xE2\x84\xAB" /* Angstrom sign */,
                        "\xE2\x84\xA6" /* Ohm sign */,
                        "\xE1\x84\x80" /* Hangul L */,
                        "\xE1\x85\xA1" /* Hangul V */,
                        "\xE1\x86\xA8" /* Hangul T */,
                        "\xEA\xB0\x80" /* 가 (LV) */,
                        "\xE0\xAD\x87" /* Oriya E */,
                        "\xE0\xAD\x96" /* Oriya AI mark */,
                        "\xE0\xAC\xBE" /* Oriya AA */,
                        "\xE2\x80\x99" /* ’ */,
                        "\xC2\xA0" /* NBSP */,
                        "\xEF\xBD\x86" /* fullwidth f */,
                        "\xF0\x9F\x98\x80" /* emoji */,
                        "\xCD\x84" /* U+0344 */,
                        "\xE2\x80\x80" /* en quad */,
                        "\xC5\xBF" /* long s */,
                        "\xE1\xBA\x9B" /* long s dot */};
  std::mt19937_64 rng(4);
  for (int round = 0; round < 3000; ++round) {
    std::string s;
    int n = 1 + static_cast<int>(rng() % 12);
    for (int k = 0; k < n; ++k) s += pool[rng() % (sizeof(pool) / sizeof(pool[0]))];
    for (const char* form : {"nfc", "nfkc"}) {
      int options =
          UTF8PROC_STABLE | UTF8PROC_COMPOSE | (std::string(form) == "nfkc" ? UTF8PROC_COMPAT : 0);
      utf8proc_uint8_t* dst = nullptr;
      utf8proc_ssize_t len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &dst,
                                          static_cast<utf8proc_option_t>(options));
      ASSERT_GE(len, 0);
      std::string whole(reinterpret_cast<char*>(dst), static_cast<size_t>(len));
      std::free(dst);
      ASSERT_EQ(unicode_normalize(s, form), whole) << form << " of '" << s << "'";
    }
  }
}

TEST(Clean, AsciiAndInertTextIsCopiedAsIs) {
  CleanOptions o;
  CleanCounts c;
  std::string t =
      "Plain text \xE2\x80\x99quoted\xE2\x80\x99 \xE2\x80\x94 caf\xC3\xA9, na\xC3\xAFve.";
  EXPECT_EQ(clean_text(t, o, &c), t);
  EXPECT_FALSE(c.normalized_changed);
  EXPECT_EQ(c.invalid_bytes, 0);
  EXPECT_EQ(c.mojibake_fixes, 0);
  // Long ASCII runs with an invalid byte past the first eight-byte block.
  int64_t n = 0;
  EXPECT_EQ(repair_utf8("abcdefghijklmnop\xFFqrstuvwxyz", true, &n),
            "abcdefghijklmnop\xEF\xBF\xBDqrstuvwxyz");
  EXPECT_EQ(n, 1);
}

// The whitespace pass copies runs of printable ASCII and single spaces eight bytes at a time:
// put double spaces, tabs, controls and non-ASCII at every offset of a block.
TEST(Clean, WhitespaceRulesHoldAtEveryOffset) {
  CleanOptions collapse, keep;
  keep.collapse_spaces = false;
  for (size_t k = 1; k < 20; ++k) {
    std::string word(k, 'x');
    auto clean = [](const std::string& s, const CleanOptions& o) { return clean_text(s, o); };
    ASSERT_EQ(clean(word + "  y   z  ", collapse), word + " y z") << k;
    ASSERT_EQ(clean(word + "  y   z  ", keep), word + "  y   z") << k;
    ASSERT_EQ(clean(word + " \t y", collapse), word + " y") << k;
    ASSERT_EQ(clean(word + "\t\ty", keep), word + "  y") << k;
    ASSERT_EQ(clean("t\n    " + word + " a  b\n    c  d", collapse),
              "t\n    " + word + " a b\n    c d")
        << k;
    ASSERT_EQ(clean(word + "  \ny", collapse), word + "\ny") << k;  // trailing spaces trimmed
    CleanCounts c;
    ASSERT_EQ(clean_text(word + "\x7F" + word + "\x01 " + word, collapse, &c),
              word + word + " " + word)
        << k;
    ASSERT_EQ(c.control_chars, 2) << k;
    ASSERT_EQ(clean(word + " caf\xC3\xA9  \xC2\xA0 ok", collapse), word + " caf\xC3\xA9 ok") << k;
    ASSERT_EQ(clean(word + "\xE2\x80\xA8next", collapse), word + "\nnext") << k;  // U+2028
  }
}

// ASCII skips repair, mojibake and normalisation; text with one non-ASCII byte anywhere must
// still get all three.
TEST(Clean, NonAsciiAfterLongAsciiRunsIsStillCleaned) {
  CleanOptions o;
  for (size_t k = 0; k < 20; ++k) {
    std::string head = std::string(k, 'a') + "w";
    CleanCounts c;
    ASSERT_EQ(clean_text(head + " Cafe\xCC\x81", o, &c), head + " Caf\xC3\xA9") << k;  // NFC
    ASSERT_TRUE(c.normalized_changed) << k;
    CleanCounts m;
    ASSERT_EQ(clean_text(head + " Caf\xC3\x83\xC2\xA9", o, &m), head + " Caf\xC3\xA9") << k;
    ASSERT_EQ(m.mojibake_fixes, 1) << k;
    CleanCounts r;
    ASSERT_EQ(clean_text(head + " x\xFF", o, &r), head + " x\xEF\xBF\xBD") << k;
    ASSERT_EQ(r.invalid_bytes, 1) << k;
    CleanCounts a;
    ASSERT_EQ(clean_text(head + " plain", o, &a), head + " plain") << k;
    ASSERT_FALSE(a.normalized_changed);
  }
}

// The mojibake search jumps between 0xC3 bytes: those that start no mojibake, and 0xC3 in
// invalid UTF-8 (fix_mojibake on its own does not repair first), are kept as they are.
TEST(Clean, MojibakeSearchKeepsEverythingElse) {
  int64_t fixes = 0;
  EXPECT_EQ(fix_mojibake("caf\xC3\xA9 and caf\xC3\x83\xC2\xA9 and \xC3\x83", &fixes),
            "caf\xC3\xA9 and caf\xC3\xA9 and \xC3\x83");
  EXPECT_EQ(fixes, 1);
  fixes = 0;
  EXPECT_EQ(fix_mojibake("abc\xC3", &fixes), "abc\xC3");
  EXPECT_EQ(fix_mojibake("\xC3\x28\xC3\x83\xC2\xA9\xFF", &fixes), "\xC3\x28\xC3\xA9\xFF");
  EXPECT_EQ(fixes, 1);
  // Truncated: the first byte asks for more continuation characters than the text holds.
  EXPECT_EQ(fix_mojibake("x\xC3\xA2\xE2\x82\xAC"), "x\xC3\xA2\xE2\x82\xAC");
  // Triple encoding takes three rounds, the most there are: 4 + 2 + 1 sequences reversed.
  int64_t triple = 0;
  EXPECT_EQ(
      fix_mojibake("Caf\xC3\x83\xC6\x92\xC3\x86\xE2\x80\x99\xC3\x83\xE2\x80\x9A\xC3\x82\xC2\xA9",
                   &triple),
      "Caf\xC3\xA9");
  EXPECT_EQ(triple, 7);
}
