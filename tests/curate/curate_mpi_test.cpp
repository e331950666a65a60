// The curation pipeline over N MPI ranks (run with mpirun -n 2 and -n 3) against one process on
// the same corpus: byte-identical kept and rejected outputs (cluster ids, duplicate_of),
// identical per-shard stats and report, with exact and fuzzy duplicates spread over shards of
// different ranks, Jaccard verification, spilled bucket runs, and a resumed run.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>

#include "comm/communicator.h"
#include "core/config.h"
#include "core/fs.h"
#include "core/json.h"
#include "curate/collective.h"
#include "curate/pipeline.h"
#include "helpers.h"
#include "mpi_main.h"

using namespace loom;
using namespace loom::curate;
using loom::curate::test::prose;

namespace {

comm::Communicator& W() {
  return comm::world();
}

// One directory shared by every rank (rank 0 creates it), removed at the end.
struct SharedDir {
  std::string path;
  SharedDir() {
    if (W().rank() == 0) {
      const char* tmp = std::getenv("TMPDIR");  // as tests/temp_dir.h
      std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/loom_curate_mpi_XXXXXX";
      path = ::mkdtemp(tmpl.data());
    }
    path = broadcast_bytes(W(), path, 0);
  }
  ~SharedDir() {
    W().barrier();
    if (W().rank() == 0) remove_all(path);
  }
  std::string operator/(const std::string& name) const { return path + "/" + name; }
};

std::string jline(const std::string& id, const std::string& text) {
  Json j = Json::object();
  j["id"] = id;
  j["text"] = text;
  return j.dump() + "\n";
}

// Seven shards (one empty): unique prose, exact duplicates (case and spacing changed) and
// near duplicates (one word changed) of documents in other shards, short documents the
// length filter rejects, and a malformed line.
void write_corpus(const std::string& dir) {
  make_dirs(dir);
  std::vector<std::string> shards(7);
  std::vector<std::string> originals;
  for (int k = 0; k < 60; ++k) originals.push_back(prose(6, 1000 + static_cast<uint64_t>(k)));
  for (int k = 0; k < 60; ++k) {
    size_t s = static_cast<size_t>(k) % 7 == 3 ? 4 : static_cast<size_t>(k) % 7;
    shards[s] += jline(cat("u", k), originals[static_cast<size_t>(k)]);
    if (k % 4 == 0) {  // an exact duplicate, in a later shard
      std::string t = originals[static_cast<size_t>(k)];
      std::transform(t.begin(), t.end(), t.begin(), ::toupper);
      shards[(s + 2) % 7 == 3 ? 5 : (s + 2) % 7] += jline(cat("x", k), "  " + t + "  ");
    }
    if (k % 3 == 0) {  // near duplicates: one word changed, in one or two other shards
      std::string t = originals[static_cast<size_t>(k)];
      size_t at = t.find(' ', t.size() / 2);
      t.insert(at, " indeed");
      shards[(s + 1) % 7 == 3 ? 0 : (s + 1) % 7] += jline(cat("n", k), t);
      if (k % 6 == 0) shards[(s + 5) % 7 == 3 ? 6 : (s + 5) % 7] += jline(cat("m", k), t + " Yes.");
    }
    if (k % 5 == 0)
      shards[static_cast<size_t>(k) % 7 == 3 ? 1 : static_cast<size_t>(k) % 7] +=
          jline(cat("s", k), "Too short.");
  }
  shards[2] += "{\"id\": \"broken\", \"text\": \n";
  for (size_t s = 0; s < shards.size(); ++s)
    write_file_atomic(cat(dir, "/part-", s, ".jsonl"), shards[s]);
}

std::string config(const std::string& in, const std::string& out, const std::string& fuzzy) {
  return "[input]\npaths = [\"" + in + "/*.jsonl\"]\n[output]\ndir = \"" + out +
         "\"\n[stage.1]\ntype = \"clean\"\n[stage.2]\ntype = \"length\"\nmin_words = 5\n"
         "[stage.3]\ntype = \"exact_dedup\"\n[stage.4]\ntype = \"fuzzy_dedup\"\n" +
         fuzzy;
}

Json run(const std::string& cfg, comm::Communicator* c) {
  Pipeline p(Config::parse(cfg, "test.toml"));
  RunOptions ro;
  ro.workers = 2;
  ro.progress_interval = 0;
  ro.comm = c;
  return p.run(ro);
}

std::vector<std::string> files_under(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(std::filesystem::relative(e.path(), dir).string());
  std::sort(out.begin(), out.end());
  return out;
}

Json without_seconds(const std::string& path) {
  Json j = Json::parse(read_file(path), path);
  j.as_object().erase("seconds");
  j.as_object().erase("stage_seconds");
  return j;
}

// Rank 0 checks that `dist` holds exactly the outputs of `ref`.
void expect_same_outputs(const std::string& ref, const std::string& dist) {
  if (W().rank() != 0) return;
  for (const char* sub : {"kept", "rejected"}) {
    auto a = files_under(ref + "/" + sub), b = files_under(dist + "/" + sub);
    ASSERT_EQ(a, b) << sub;
    for (auto& f : a)
      EXPECT_TRUE(read_file(ref + "/" + sub + "/" + f) == read_file(dist + "/" + sub + "/" + f))
          << sub << "/" << f << " differs";
  }
  auto a = files_under(ref + "/stats"), b = files_under(dist + "/stats");
  ASSERT_EQ(a, b);
  for (auto& f : a)
    EXPECT_EQ(without_seconds(ref + "/stats/" + f).dump(),
              without_seconds(dist + "/stats/" + f).dump())
        << f;
  Json ra = Json::parse(read_file(ref + "/report.json")),
       rb = Json::parse(read_file(dist + "/report.json"));
  EXPECT_EQ(ra.at("stages").dump(), rb.at("stages").dump());
  EXPECT_EQ(ra.at("errors").dump(), rb.at("errors").dump());
  EXPECT_EQ(ra.at("output").at("kept_docs").dump(), rb.at("output").at("kept_docs").dump());
  EXPECT_TRUE(rb.at("output").at("all_docs_accounted").as_bool());
  EXPECT_EQ(rb.at("run").at("ranks").as_int(), W().size());
}

// The reference run found duplicates of both kinds, some across shards of different ranks
// (so a rank-local dedup would not reproduce it).
void expect_cross_rank_duplicates(const std::string& ref) {
  if (W().rank() != 0) return;
  Json report = Json::parse(read_file(ref + "/report.json"));
  auto& st = report.at("stages").as_array();
  EXPECT_GT(st[3].at("reasons").at("exact_duplicate").as_int(), 5);
  EXPECT_GT(st[4].at("reasons").at("near_duplicate").as_int(), 5);
  std::string rej = read_file(ref + "/rejected/shard-00001.s2.jsonl");
  EXPECT_NE(rej.find("\"duplicate_of\": \"u0\""), std::string::npos) << rej;  // u0: shard 0
}

void run_both_and_compare(const SharedDir& t, const std::string& fuzzy) {
  if (W().rank() == 0) {
    write_corpus(t / "in");
    auto self = comm::make_self_communicator();
    run(config(t / "in", t / "ref", fuzzy), self.get());
  }
  W().barrier();
  Json report = run(config(t / "in", t / "dist", fuzzy), nullptr);
  EXPECT_TRUE(report.at("output").at("all_docs_accounted").as_bool());  // every rank has it
  W().barrier();
  expect_cross_rank_duplicates(t / "ref");
  expect_same_outputs(t / "ref", t / "dist");
}

}  // namespace

TEST(CurateMpi, SameOutputsAsOneProcess) {
  ASSERT_GT(W().size(), 1);
  SharedDir t;
  run_both_and_compare(t, "");
}

TEST(CurateMpi, VerifiedAndSpilledBucketsSameAsOneProcess) {
  SharedDir t;
  // 0.002 MB: 131 entries per run, so every rank spills several sorted runs.
  run_both_and_compare(t, "verify_threshold = 0.7\nmemory_budget_mb = 0.002\n");
  if (W().rank() == 0) {
    Json lsh = Json::parse(read_file(t / "dist/work/fuzzy_dedup/lsh.json"));
    Json ref = Json::parse(read_file(t / "ref/work/fuzzy_dedup/lsh.json"));
    EXPECT_GT(lsh.at("spill_runs").as_int(), W().size());
    for (const char* k :
         {"documents", "candidate_pairs", "verified_pairs", "pairs_above_threshold"})
      EXPECT_EQ(lsh.at(k).as_int(), ref.at(k).as_int()) << k;
  }
}

TEST(CurateMpi, ResumesUnfinishedShards) {
  SharedDir t;
  run_both_and_compare(t, "");
  // As if the run had been killed: some shards of each segment unfinished, one shard's
  // signatures never written, and a stray temporary.
  if (W().rank() == 0) {
    for (const char* f : {"stats/s0-shard-00002.json", "stats/s1-shard-00004.json",
                          "stats/s2-shard-00001.json", "stats/s2-shard-00005.json",
                          "kept/shard-00005.jsonl", "work/fuzzy_dedup/3.sig", "report.json"})
      std::filesystem::remove(t / cat("dist/", f));
    write_file_atomic(t / "dist/kept/shard-00005.jsonl.tmp.123", "half");
  }
  W().barrier();
  Json report = run(config(t / "in", t / "dist", ""), nullptr);
  EXPECT_EQ(report.at("run").at("shards_processed").as_int(), 4);
  W().barrier();
  expect_same_outputs(t / "ref", t / "dist");
  if (W().rank() == 0) {
    EXPECT_FALSE(file_exists(t / "dist/kept/shard-00005.jsonl.tmp.123"));
  }
}

TEST(CurateMpi, ResumesWithFewerRanks) {
  SharedDir t;
  run_both_and_compare(t, "");
  if (W().rank() == 0) {
    for (const char* f : {"stats/s0-shard-00003.json", "stats/s2-shard-00000.json",
                          "stats/s2-shard-00006.json", "work/fuzzy_dedup/0.sig"})
      std::filesystem::remove(t / cat("dist/", f));
  }
  W().barrier();
  // All ranks but the last resume the run (one process when there are two).
  const bool resumes = W().rank() < W().size() - 1;
  auto fewer = W().split(resumes ? 0 : 1, W().rank(), "fewer");
  if (resumes) {
    Json report = run(config(t / "in", t / "dist", ""), fewer.get());
    EXPECT_EQ(report.at("run").at("shards_processed").as_int(), 3);
  }
  W().barrier();
  if (W().rank() == 0) {
    for (const char* sub : {"kept", "rejected"})
      for (auto& f : files_under(t / cat("ref/", sub)))
        EXPECT_TRUE(read_file(t / cat("ref/", sub, "/", f)) ==
                    read_file(t / cat("dist/", sub, "/", f)))
            << f;
  }
}

LOOM_MPI_TEST_MAIN()
