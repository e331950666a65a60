// The default pipeline's fast paths against the reference paths (set_reference_paths): the
// exact-dedup key and MinHash shingles give the same values, and the shipped default pipeline
// (configs/curate/jsonl.toml) keeps and rejects the same documents of a varied corpus of short
// web-like documents for the same reasons, with langid's default sample (1024 bytes) against
// its former one (whole documents up to 4096 bytes).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>

#include "core/config.h"
#include "core/fs.h"
#include "core/json.h"
#include "curate/dedup.h"
#include "curate/pipeline.h"
#include "curate/text.h"
#include "helpers.h"
#include "web_corpus.h"

using namespace loom;
using namespace loom::curate;

namespace {

// Restores the fast paths when a test ends, pass or fail.
struct ReferencePaths {
  explicit ReferencePaths(bool on) { set_reference_paths(on); }
  ~ReferencePaths() { set_reference_paths(false); }
};

// Random texts over the bytes normalisation and word splitting treat differently: every ASCII
// space, upper and lower case, punctuation, UTF-8 of several lengths, stray high bytes, long
// words (past the 64 bytes MinHash lowercases on the stack).
std::string random_text(uint64_t seed, size_t n) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 7;
  auto next = [&] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  static const char* kPieces[] = {" ",  "  ", "\t",   "\n",   "\r",   "\f", "\v",  "A",    "Z", "a",
                                  "z",  "@",  "[",    "`",    "{",    ".",  ",",   "é",    "Ä", "€",
                                  "中", "😀",  "\xC3", "\xFF", "\x80", "0",  "The", "WORD", "x"};
  std::string t;
  while (t.size() < n) {
    if (next() % 50 == 0) {
      t += std::string(40 + next() % 60, static_cast<char>('A' + next() % 26));
      continue;
    }
    t += kPieces[next() % std::size(kPieces)];
  }
  return t;
}

std::map<std::string, std::string> outcomes(const std::string& out, bool with_fields) {
  std::map<std::string, std::string> m;
  for (const char* sub : {"kept", "rejected"})
    for (auto& e : std::filesystem::directory_iterator(out + "/" + sub)) {
      const std::string data = read_file(e.path().string());
      for (auto line : split_lines(data)) {
        if (line.empty()) continue;
        Json j = Json::parse(line, e.path().string());
        std::string o = j.contains("rejected_stage") ? j.at("rejected_stage").as_string() + "/" +
                                                           j.at("rejected_reason").as_string()
                                                     : "kept";
        if (j.contains("duplicate_of")) o += " of " + j.at("duplicate_of").as_string();
        if (with_fields) o += " " + j.dump();
        m[j.at("id").as_string()] = o;
      }
    }
  return m;
}

}  // namespace

TEST(FastPaths, DedupHashIsHashOfNormalizedText) {
  for (uint64_t seed = 0; seed < 3000; ++seed) {
    const std::string t = random_text(seed, seed % 300);
    const Hash128 want = hash128(normalize_for_dedup(t));
    EXPECT_EQ(dedup_hash(t), want) << "seed " << seed;
    ReferencePaths ref(true);
    EXPECT_EQ(dedup_hash(t), want) << "seed " << seed;
  }
  EXPECT_EQ(dedup_hash("  Hello\tWORLD \n"), hash128("hello world"));
  EXPECT_EQ(dedup_hash(""), hash128(""));
}

TEST(FastPaths, MinHashShinglesMatchReference) {
  MinHasher mh(MinHashParams{});
  for (uint64_t seed = 0; seed < 500; ++seed) {
    const std::string t = random_text(seed, 50 + seed * 7);
    const auto fast = mh.shingles(t);
    ReferencePaths ref(true);
    EXPECT_EQ(fast, mh.shingles(t)) << "seed " << seed;
  }
}

TEST(FastPaths, DefaultPipelineKeepsAndRejectsTheSameWebDocuments) {
  curate::test::TempDir t;
  make_dirs(t / "in");
  curate::test::WebCorpus gen(5);
  const auto docs = gen.make(1500);
  write_file_atomic(t / "in/web.jsonl", curate::test::WebCorpus::jsonl(docs));
  auto run = [&](const std::string& out, bool reference, int sample_bytes) {
    ReferencePaths ref(reference);
    Config cfg = Config::load(LOOM_SOURCE_DIR "/configs/curate/jsonl.toml");
    cfg.set("input.paths", "[\"" + (t / "in") + "\"]", "test");
    cfg.set("output.dir", "\"" + out + "\"", "test");
    if (sample_bytes > 0) cfg.set("stage.2.sample_bytes", std::to_string(sample_bytes), "test");
    Pipeline p(cfg);
    RunOptions ro;
    ro.workers = 1;
    ro.progress_interval = 0;
    return p.run(ro);
  };
  const Json fast = run(t / "fast", false, 0);
  run(t / "ref", true, 4096);      // the code and the langid sample before the fast paths
  run(t / "ref_sample", true, 0);  // the reference code with today's sample
  const auto f = outcomes(t / "fast", false), r = outcomes(t / "ref", false);
  ASSERT_EQ(f.size(), docs.size());
  EXPECT_EQ(f, r);
  // The fast code paths alone change no byte of any record.
  const auto full = outcomes(t / "fast", true);
  EXPECT_EQ(full, outcomes(t / "ref_sample", true));
  // The corpus exercises every kind of rejection the default pipeline has.
  std::map<std::string, int> stages;
  for (auto& [id, o] : f) ++stages[o.substr(0, o.find('/'))];
  for (const char* s : {"kept", "clean", "langid", "gopher_repetition", "gopher_quality", "fineweb",
                        "exact_dedup", "fuzzy_dedup"})
    EXPECT_GT(stages[s], 0) << s;
  int redacted = 0;
  for (auto& [id, o] : full) redacted += o.find("\"pii_redacted\"") != std::string::npos;
  EXPECT_GT(redacted, 20);
  EXPECT_EQ(fast.at("output").at("kept_docs").as_int(), stages["kept"]);
}
