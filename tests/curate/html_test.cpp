#include <gtest/gtest.h>

#include "core/fs.h"
#include "curate/html_extract.h"
#include "helpers.h"

using namespace loom::curate;

static const std::string kData = CURATE_TEST_DATA;

TEST(HtmlExtract, KeepsArticleDropsBoilerplate) {
  Extracted e = extract_main_text(loom::read_file(kData + "/html/article.html"), ExtractOptions());
  EXPECT_EQ(e.title, "How Rivers Shape Valleys & Plains");
  EXPECT_EQ(
      e.text,
      "How Rivers Shape Valleys\n\n"
      "Rivers carve their valleys over thousands of years, moving sediment from the mountains "
      "toward the sea. The shape of a valley tells a geologist much about its history.\n\n"
      "Erosion and deposition\n\n"
      "Fast water erodes the outer bank of a bend, while slow water on the inner bank drops "
      "sand and gravel. Over time the bends migrate across the floodplain.\n\n"
      "- Meanders form where the slope is gentle.\n"
      "- Oxbow lakes remain when a meander is cut off.");
  for (const char* junk : {"SCRIPT", "SITE_LOGO", "Home", "COOKIE", "SIDEBAR", "HIDDEN", "SHARE_",
                           "LINKY", "FOOTER", "font-family"})
    EXPECT_EQ(e.text.find(junk), std::string::npos) << junk;
  EXPECT_GE(e.blocks_dropped_links, 1);
}

TEST(HtmlExtract, WithoutMainUsesBodyAndLinkDensity) {
  Extracted e =
      extract_main_text(loom::read_file(kData + "/html/sub/no_main.html"), ExtractOptions());
  EXPECT_NE(e.text.find("This page has no main element"), std::string::npos);
  EXPECT_NE(e.text.find("short link inside a long sentence"), std::string::npos);
  EXPECT_EQ(e.text.find("MENU_ITEM"), std::string::npos);
  EXPECT_EQ(e.text.find("LINK_ONLY_BLOCK"), std::string::npos);
  EXPECT_EQ(e.text.find("PAGE_HEADER_TEXT"), std::string::npos);
  // With the link-density rule off, the link-only block comes back.
  ExtractOptions loose;
  loose.max_link_density = 1.0;
  EXPECT_NE(extract_main_text(loom::read_file(kData + "/html/sub/no_main.html"), loose)
                .text.find("LINK_ONLY_BLOCK"),
            std::string::npos);
}

TEST(HtmlExtract, StageRejectsPagesWithoutContent) {
  auto r = test::run_stage("type = \"html_extract\"", loom::read_file(kData + "/html/empty.htm"));
  EXPECT_EQ(r.reason, "no_main_content");
  auto k =
      test::run_stage("type = \"html_extract\"", loom::read_file(kData + "/html/article.html"));
  EXPECT_EQ(k.reason, "");
  EXPECT_EQ(k.doc.record.at("title").as_string(), "How Rivers Shape Valleys & Plains");
  // Broken markup and invalid UTF-8 do not crash the parser.
  auto b =
      test::run_stage("type = \"html_extract\"", "<p>Unclosed <b>bold \xFF\xFE text<div><p>more");
  EXPECT_EQ(b.reason, "");
  EXPECT_NE(b.text.find("Unclosed bold"), std::string::npos);
}
