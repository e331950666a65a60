// Out-of-range curate settings: every integer and number a pipeline or
// stage reads is range-checked before it is narrowed or used, and the error names the file,
// the line and the key. Before, input.max_doc_bytes = -5 became a 16-EiB cap, a worker count of
// 4294967297 became 1 worker and stage.N.bands = 4294967297 became 1 band, all silently.
#include <gtest/gtest.h>

#include <string>

#include "core/config.h"
#include "core/error.h"
#include "curate/pipeline.h"

using namespace loom;
using namespace loom::curate;

namespace {

// A valid pipeline with one extra line appended to the section `section` (line 2 of the file
// holds [input]'s first key, so the errors' line numbers are checked exactly).
std::string config_with(const std::string& section, const std::string& line) {
  std::string s =
      "[input]\n"                              // 1
      "format = \"jsonl\"\n"                   // 2
      "paths = [\"/nonexistent/in.jsonl\"]\n"  // 3
      "[output]\n"                             // 4
      "dir = \"/nonexistent/out\"\n"           // 5
      "[pipeline]\n"                           // 6
      "[stage.1]\n"                            // 7
      "type = \"html_extract\"\n"              // 8
      "[stage.2]\n"                            // 9
      "type = \"fuzzy_dedup\"\n"               // 10
      "[stage.3]\n"                            // 11
      "type = \"gopher_quality\"\n";           // 12
  const std::string header = "[" + section + "]\n";
  const size_t at = s.find(header);
  EXPECT_NE(at, std::string::npos) << section;
  s.insert(at + header.size(), line + "\n");
  return s;
}

std::string error_of(const std::string& text) {
  try {
    Pipeline p(Config::parse(text, "run.toml"));
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

struct Case {
  const char* section;
  const char* line;
  const char* where;  // file:line and key the error must name
};

}  // namespace

TEST(CurateConfigLimits, OutOfRangeNumbersNameFileLineAndKey) {
  const Case cases[] = {
      {"input", "max_doc_bytes = -5", "run.toml:2: 'input.max_doc_bytes'"},
      {"input", "max_line_bytes = 0", "run.toml:2: 'input.max_line_bytes'"},
      {"input", "files_per_shard = -3", "run.toml:2: 'input.files_per_shard'"},
      {"output", "zstd_level = 99", "run.toml:5: 'output.zstd_level'"},
      {"pipeline", "workers = 4294967297", "run.toml:7: 'pipeline.workers'"},
      {"stage.1", "max_depth = 0", "run.toml:8: 'stage.1.max_depth'"},
      {"stage.1", "max_parse_mb = 4294967297", "run.toml:8: 'stage.1.max_parse_mb'"},
      {"stage.1", "max_link_density = -0.5", "run.toml:8: 'stage.1.max_link_density'"},
      {"stage.2", "bands = 4294967297", "run.toml:10: 'stage.2.bands'"},
      {"stage.2", "rows = -1", "run.toml:10: 'stage.2.rows'"},
      {"stage.2", "ngram = 0", "run.toml:10: 'stage.2.ngram'"},
      {"stage.2", "memory_budget_mb = -1.0", "run.toml:10: 'stage.2.memory_budget_mb'"},
      {"stage.3", "min_doc_words = -1", "run.toml:12: 'stage.3.min_doc_words'"},
      {"stage.3", "min_alpha_words_ratio = 2.0", "run.toml:12: 'stage.3.min_alpha_words_ratio'"},
  };
  for (const Case& c : cases) {
    const std::string e = error_of(config_with(c.section, c.line));
    EXPECT_NE(e.find(c.where), std::string::npos) << c.line << " -> " << e;
    EXPECT_NE(e.find("out of range"), std::string::npos) << c.line << " -> " << e;
  }
}

TEST(CurateConfigLimits, ValuesInRangeAreAccepted) {
  // The same sections with in-range values build a pipeline (the bounds do not refuse the
  // documented settings).
  for (const Case& c :
       {Case{"input", "max_doc_bytes = 1048576", ""}, Case{"output", "zstd_level = -5", ""},
        Case{"pipeline", "workers = 8", ""}, Case{"stage.2", "memory_budget_mb = 0.01", ""},
        Case{"stage.3", "min_alpha_words_ratio = 1.0", ""}})
    EXPECT_EQ(error_of(config_with(c.section, c.line)), "") << c.line;
}

TEST(CurateConfigLimits, StageChoiceErrorsNameFileAndLine) {
  EXPECT_NE(
      error_of(config_with("stage.2", "preset = \"fast\"")).find("run.toml:10: 'stage.2.preset'"),
      std::string::npos);
  EXPECT_NE(
      error_of(config_with("input", "on_error = \"ignore\"")).find("run.toml:2: 'input.on_error'"),
      std::string::npos);
}
