// Test helpers for curation stages: build a stage from config text and run it on a text.
#pragma once

#include <stdlib.h>

#include <cstdint>
#include <random>
#include <string>

#include "core/config.h"
#include "core/error.h"
#include "core/fs.h"
#include "curate/document.h"
#include "curate/stage.h"
#include "temp_dir.h"

namespace loom::curate::test {

// Scratch directories: the shared RAII helper (tests/temp_dir.h), removed pass or fail.
struct TempDir : loom::test::TempDir {
  TempDir() : loom::test::TempDir("curate") {}
};

struct StageRun {
  std::string reason;  // empty: kept
  std::string text;    // text after the stage
  StageStats stats;
  Doc doc;
};

// `settings` are the lines of a [stage.1] section, e.g. "type = \"c4\"\nmin_num_sentences = 2".
inline StageRun run_stage(const std::string& settings, const std::string& text) {
  Config cfg = Config::parse("[stage.1]\n" + settings + "\n", "test");
  auto stage = make_stage(cfg.get_string("stage.1.type", ""), StageParams(cfg, "stage.1"));
  cfg.check_all_used();
  StageRun r;
  r.doc.text = text;
  r.doc.id = "t";
  r.doc.record = Json::object();
  StageContext ctx;
  ctx.stats = &r.stats;
  r.reason = stage->process(r.doc, ctx);
  r.text = r.doc.text;
  return r;
}

// Natural-looking English prose: lines of one sentence each, words from a fixed vocabulary
// drawn by a seeded generator, so no phrase repeats by construction of the test.
inline std::string prose(int sentences, uint64_t seed = 1) {
  static const char* kWords[] = {
      "river",   "garden",  "morning",  "people",    "village",    "history",   "market",
      "winter",  "teacher", "window",   "letter",    "station",    "mountain",  "library",
      "kitchen", "summer",  "doctor",   "bridge",    "harbor",     "forest",    "student",
      "country", "evening", "painter",  "journey",   "silver",     "ancient",   "quiet",
      "bright",  "careful", "gentle",   "famous",    "walked",     "carried",   "opened",
      "visited", "painted", "followed", "noticed",   "remembered", "quickly",   "slowly",
      "finally", "often",   "across",   "toward",    "beneath",    "between",   "music",
      "dinner",  "island",  "castle",   "engine",    "valley",     "meadow",    "lantern",
      "stories", "friends", "workers",  "travelers", "children",   "neighbors", "sailors",
      "farmers"};
  std::mt19937_64 rng(seed);
  std::string out;
  for (int s = 0; s < sentences; ++s) {
    std::string line = "The";
    int n = 9 + static_cast<int>(rng() % 4);
    for (int w = 0; w < n; ++w) {
      line += " ";
      line += kWords[rng() % (sizeof kWords / sizeof *kWords)];
      if (w == 3) line += " of the";
      if (w == 6) line += " and";
    }
    out += line + ".\n";
  }
  if (!out.empty()) out.pop_back();
  return out;
}

}  // namespace loom::curate::test
