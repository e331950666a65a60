// Fuzzy dedup through the pipeline: the external-sort (spill to disk) bucket path must give
// exactly the clusters of the in-memory path, and the optional verification must compare the
// exact Jaccard similarity of the candidate pairs' shingle sets with its threshold.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>
#include <set>

#include "core/fs.h"
#include "core/json.h"
#include "curate/dedup.h"
#include "curate/pipeline.h"
#include "helpers.h"

using namespace loom;
using namespace loom::curate;
using loom::curate::test::TempDir;

namespace {

std::string words_text(const std::vector<std::string>& ws) {
  std::string s;
  for (auto& w : ws) s += w + " ";
  return s;
}

// Writes `docs` (id, text) as JSONL over `shards` files under dir/in.
void write_corpus(const TempDir& t, const std::vector<std::pair<std::string, std::string>>& docs,
                  int shards) {
  make_dirs(t / "in");
  std::vector<std::string> bodies(static_cast<size_t>(shards));
  for (size_t i = 0; i < docs.size(); ++i) {
    Json j = Json::object();
    j["id"] = docs[i].first;
    j["text"] = docs[i].second;
    bodies[i % bodies.size()] += j.dump() + "\n";
  }
  for (size_t k = 0; k < bodies.size(); ++k)
    write_file_atomic(t / ("in/part" + std::to_string(k) + ".jsonl"), bodies[k]);
}

struct DedupRun {
  std::map<std::string, std::string> cluster;  // id -> cluster id (its kept document)
  Json lsh;                                    // work/fuzzy_dedup/lsh.json
  int64_t kept = 0;
};

DedupRun run_dedup(const TempDir& t, const std::string& out, const std::string& settings) {
  std::string cfg = "[input]\npaths = [\"" + (t / "in") + "\"]\n[output]\ndir = \"" + (t / out) +
                    "\"\n[stage.1]\ntype = \"fuzzy_dedup\"\n" + settings;
  Pipeline p(Config::parse(cfg, "test.toml"));
  RunOptions ro;
  ro.workers = 2;
  ro.progress_interval = 0;
  Json report = p.run(ro);
  EXPECT_TRUE(report.at("output").at("all_docs_accounted").as_bool());
  DedupRun r;
  r.kept = report.at("output").at("kept_docs").as_int();
  for (const char* sub : {"kept", "rejected"}) {
    for (auto& e : std::filesystem::directory_iterator(t / (out + "/" + sub))) {
      std::string data = read_file(e.path().string());
      for (size_t start = 0; start < data.size();) {
        size_t nl = data.find('\n', start);
        Json j = Json::parse(data.substr(start, nl - start), e.path().string());
        start = nl + 1;
        r.cluster[j.at("id").as_string()] = j.at("cluster_id").as_string();
      }
    }
  }
  r.lsh = Json::parse(read_file(t / (out + "/work/fuzzy_dedup/lsh.json")), "lsh.json");
  return r;
}

}  // namespace

TEST(FuzzyDedup, SpilledBucketsGiveTheSameClustersAsInMemory) {
  // 400 base documents, each with 0-3 near copies (a few words edited), shuffled over shards.
  std::mt19937_64 rng(3);
  std::vector<std::pair<std::string, std::string>> docs;
  for (int b = 0; b < 400; ++b) {
    std::vector<std::string> ws(60);
    for (auto& w : ws) w = "w" + std::to_string(rng() % 5000);
    docs.push_back({"b" + std::to_string(b), words_text(ws)});
    int copies = static_cast<int>(rng() % 4);
    for (int c = 0; c < copies; ++c) {
      auto v = ws;
      int edits = static_cast<int>(rng() % 3);
      for (int e = 0; e < edits; ++e) v[rng() % v.size()] = "x" + std::to_string(rng() % 5000);
      docs.push_back({"b" + std::to_string(b) + "c" + std::to_string(c), words_text(v)});
    }
  }
  std::shuffle(docs.begin(), docs.end(), rng);
  TempDir t;
  write_corpus(t, docs, 3);
  DedupRun mem = run_dedup(t, "mem", "");
  // 0.01 MB: runs of 1024 bucket entries (the floor), so ~14 sorted runs for ~13k entries.
  DedupRun disk = run_dedup(t, "disk", "memory_budget_mb = 0.01\n");
  EXPECT_EQ(mem.lsh.at("spill_runs").as_int(), 0);
  EXPECT_GT(disk.lsh.at("spill_runs").as_int(), 5);
  EXPECT_EQ(mem.lsh.at("candidate_pairs").as_int(), disk.lsh.at("candidate_pairs").as_int());
  ASSERT_EQ(mem.cluster.size(), docs.size());
  EXPECT_EQ(mem.cluster, disk.cluster);
  // Not trivially equal: many documents were merged into clusters.
  EXPECT_LT(mem.kept, static_cast<int64_t>(docs.size()) - 200);
  EXPECT_GE(mem.kept, 400 - 5);  // distinct bases stay apart (random words: Jaccard ~0)
  // No run files are left behind.
  for (auto& e : std::filesystem::directory_iterator(t / "disk/work/fuzzy_dedup"))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

TEST(FuzzyDedup, VerificationUsesTheExactJaccardOfCandidatePairs) {
  // A pair with Jaccard ~0.8 that shares an LSH band, and an unrelated document.
  MinHasher h(MinHashParams{});
  std::mt19937_64 rng(11);
  std::string a, b;
  double s = 0;
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::vector<std::string> ws(300);
    for (auto& w : ws) w = "w" + std::to_string(rng() % 1000000);
    a = words_text(ws);
    for (int e = 0; e < 6; ++e) ws[rng() % ws.size()] = "e" + std::to_string(rng() % 1000000);
    b = words_text(ws);
    auto ba = h.band_hashes(h.signature(a)), bb = h.band_hashes(h.signature(b));
    bool candidate = false;
    for (size_t k = 0; k < ba.size(); ++k) candidate |= ba[k] == bb[k];
    if (!candidate) continue;
    auto sa = h.shingles(a), sb = h.shingles(b);
    std::set<uint64_t> A(sa.begin(), sa.end()), B(sb.begin(), sb.end());
    size_t inter = 0;
    for (auto x : A) inter += B.count(x);
    s = static_cast<double>(inter) / static_cast<double>(A.size() + B.size() - inter);
    break;
  }
  ASSERT_GT(s, 0.6);
  ASSERT_LT(s, 0.95);
  TempDir t;
  write_corpus(t, {{"a", a}, {"u", "an unrelated short text"}, {"b", b}}, 2);
  auto above = run_dedup(t, "above", "verify_threshold = " + std::to_string(s + 0.01) + "\n");
  auto below = run_dedup(t, "below", "verify_threshold = " + std::to_string(s - 0.01) + "\n");
  auto none = run_dedup(t, "none", "");
  EXPECT_EQ(above.cluster["b"], "b");  // candidate, but not similar enough: kept apart
  EXPECT_EQ(above.lsh.at("verified_pairs").as_int(), 1);
  EXPECT_EQ(above.lsh.at("pairs_above_threshold").as_int(), 0);
  EXPECT_EQ(below.cluster["b"], "a");
  EXPECT_EQ(below.lsh.at("pairs_above_threshold").as_int(), 1);
  EXPECT_EQ(none.cluster["b"], "a");  // without verification every candidate pair joins
  EXPECT_EQ(none.cluster["u"], "u");
  // The same with spilled buckets.
  auto spilled =
      run_dedup(t, "spilled",
                "verify_threshold = " + std::to_string(s - 0.01) + "\nmemory_budget_mb = 0.0001\n");
  EXPECT_EQ(spilled.cluster["b"], "a");
  EXPECT_GT(spilled.lsh.at("spill_runs").as_int(), 0);
}
