// End to end: the pipeline as a library and `loom curate` as a process (kill and resume,
// malformed input, config errors).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <filesystem>
#include <map>
#include <set>

#include "core/fs.h"
#include "core/json.h"
#include "curate/pipeline.h"
#include "helpers.h"

using namespace loom;
using namespace loom::curate;
using loom::curate::test::prose;
using loom::curate::test::TempDir;

static std::string jline(const std::string& id, const std::string& text) {
  Json j = Json::object();
  j["id"] = id;
  j["text"] = text;
  j["source"] = "unit";
  return j.dump() + "\n";
}

static std::vector<Json> read_jsonl_dir(const std::string& dir) {
  std::vector<std::string> files;
  for (auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  std::vector<Json> out;
  for (auto& f : files) {
    std::string data = read_file(f);
    size_t start = 0;
    while (start < data.size()) {
      size_t nl = data.find('\n', start);
      out.push_back(Json::parse(data.substr(start, nl - start), f));
      start = nl + 1;
    }
  }
  return out;
}

static std::map<std::string, Json> by_id(const std::vector<Json>& v) {
  std::map<std::string, Json> m;
  for (auto& j : v) {
    EXPECT_EQ(m.count(j.at("id").as_string()), 0u) << "id twice: " << j.at("id").as_string();
    m[j.at("id").as_string()] = j;
  }
  return m;
}

TEST(Pipeline, EndToEndKeptRejectedDedupAndReport) {
  TempDir t;
  make_dirs(t / "in");
  std::string g1 = prose(8, 11), u1 = prose(8, 12);
  std::string n1 = g1;
  n1.replace(n1.find("The"), 3, "One");  // one word changed: Jaccard ~0.97
  write_file_atomic(t / "in/a.jsonl",
                    jline("g1", g1) + jline("s1", "Too short to keep.") +
                        jline("p1", prose(8, 13) + "\nContact me at jane@example.com please.") +
                        "{\"id\": \"broken\", \"text\": \n");
  write_file_atomic(t / "in/b.jsonl", jline("d1", g1) + jline("n1", n1) + jline("u1", u1));
  std::string cfg = "[input]\npaths = [\"" + (t / "in/*.jsonl") +
                    "\"]\n"
                    "[output]\ndir = \"" +
                    (t / "out") +
                    "\"\n"
                    "[stage.1]\ntype = \"clean\"\n"
                    "[stage.2]\ntype = \"gopher_quality\"\n"
                    "[stage.3]\ntype = \"pii\"\n"
                    "[stage.4]\ntype = \"exact_dedup\"\n"
                    "[stage.5]\ntype = \"fuzzy_dedup\"\n";
  Pipeline p(Config::parse(cfg, "test.toml"));
  RunOptions ro;
  ro.workers = 2;
  ro.progress_interval = 0;
  Json report = p.run(ro);

  auto kept = by_id(read_jsonl_dir(t / "out/kept"));
  auto rejected = by_id(read_jsonl_dir(t / "out/rejected"));
  EXPECT_EQ(kept.size(), 3u);
  EXPECT_EQ(rejected.size(), 4u);
  for (auto& [id, j] : kept) EXPECT_EQ(rejected.count(id), 0u) << id;  // exactly one place
  ASSERT_TRUE(kept.count("g1") && kept.count("p1") && kept.count("u1"));
  EXPECT_EQ(kept["g1"].at("source").as_string(), "unit");  // input fields kept
  EXPECT_EQ(kept["g1"].at("cluster_size").as_int(), 2);    // g1 + n1 (d1 went to exact dedup)
  EXPECT_EQ(kept["g1"].at("cluster_id").as_string(), "g1");
  EXPECT_NE(kept["p1"].at("text").as_string().find("<EMAIL>"), std::string::npos);
  EXPECT_EQ(kept["p1"].at("pii_redacted").at("email").as_int(), 1);
  auto reason = [&](const std::string& id) {
    return rejected[id].at("rejected_stage").as_string() + "/" +
           rejected[id].at("rejected_reason").as_string();
  };
  EXPECT_EQ(reason("s1"), "gopher_quality/gopher_short_doc");
  EXPECT_EQ(reason("d1"), "exact_dedup/exact_duplicate");
  EXPECT_EQ(rejected["d1"].at("duplicate_of").as_string(), "g1");
  EXPECT_EQ(reason("n1"), "fuzzy_dedup/near_duplicate");
  EXPECT_EQ(rejected["n1"].at("duplicate_of").as_string(), "g1");
  std::string broken_id = t / "in/a.jsonl:4";
  ASSERT_TRUE(rejected.count(broken_id));
  EXPECT_EQ(reason(broken_id), "reader/malformed_json");

  // The report: per-stage flow adds up, reasons and histograms are there.
  EXPECT_TRUE(report.at("output").at("all_docs_accounted").as_bool());
  auto& st = report.at("stages").as_array();
  ASSERT_EQ(st.size(), 6u);
  EXPECT_EQ(st[0].at("name").as_string(), "reader");
  EXPECT_EQ(st[0].at("docs_in").as_int(), 7);
  for (size_t i = 1; i < st.size(); ++i)
    EXPECT_EQ(st[i].at("docs_in").as_int(), st[i - 1].at("docs_out").as_int());
  EXPECT_EQ(st[5].at("docs_out").as_int(), 3);
  EXPECT_EQ(st[2].at("reasons").at("gopher_short_doc").as_int(), 1);
  EXPECT_GT(st[2].at("histograms").at("mean_word_length").at("count").as_int(), 0);
  EXPECT_EQ(st[3].at("counters").at("email").as_int(), 1);
  EXPECT_EQ(report.at("errors").at("count").as_int(), 1);
  Json saved = Json::parse(read_file(t / "out/report.json"));
  EXPECT_EQ(saved.at("output").dump(), report.at("output").dump());
  EXPECT_NE(read_file(t / "out/report.txt").find("gopher_short_doc"), std::string::npos);
  EXPECT_NE(read_file(t / "out/report.html").find("<svg"), std::string::npos);
  // Where the time went: the reader, every stage in order (the dedup one with its prepare) and
  // the writers; and the run's MB per CPU second.
  auto& timing = report.at("timing").as_array();
  ASSERT_EQ(timing.size(), st.size() + 1);
  for (size_t i = 0; i < st.size(); ++i)
    EXPECT_EQ(timing[i].at("name").as_string(), st[i].at("name").as_string());
  EXPECT_EQ(timing.back().at("name").as_string(), "writer");
  for (auto& x : timing) EXPECT_GE(x.at("seconds").as_double(), 0) << x.dump();
  EXPECT_TRUE(timing[5].contains("prepare_seconds"));  // fuzzy_dedup
  EXPECT_GT(report.at("run").at("cpu_seconds").as_double(), 0);
  EXPECT_GT(report.at("run").at("mb_per_cpu_second").as_double(), 0);
  EXPECT_NE(read_file(t / "out/report.txt").find("per core: "), std::string::npos);
}

// ---- the CLI as a process --------------------------------------------------------------------

struct Proc {
  int code;
  std::string out;
};

static Proc run_cli(const std::string& args, const std::string& env = "") {
  // Under $TMPDIR like every other scratch file of the tests (tests/temp_dir.h).
  const char* tmp = std::getenv("TMPDIR");
  std::string tmpl_s = std::string(tmp && *tmp ? tmp : "/tmp") + "/loom_curate_out_XXXXXX";
  char* tmpl = tmpl_s.data();
  int fd = mkstemp(tmpl);
  close(fd);
  std::string cmd = env + " " + CURATE_DRIVER + " " + args + " > " + tmpl + " 2>&1";
  int st = std::system(cmd.c_str());
  Proc p{WIFEXITED(st) ? WEXITSTATUS(st) : -1, read_file(tmpl)};
  std::remove(tmpl);
  return p;
}

static void make_corpus(const TempDir& t, int shards, int docs) {
  make_dirs(t / "in");
  for (int s = 0; s < shards; ++s) {
    std::string body;
    for (int d = 0; d < docs; ++d) {
      int k = s * docs + d;
      std::string text = (k % 5 == 0) ? "tiny" : prose(6, static_cast<uint64_t>(k));
      if (k % 7 == 0) text += "\nReach me at user" + std::to_string(k) + "@example.org today.";
      body += jline("doc" + std::to_string(k), text);
    }
    write_file_atomic(t / ("in/part" + std::to_string(s) + ".jsonl"), body);
  }
}

static std::string config(const TempDir& t, const std::string& out, const std::string& extra = "") {
  std::string c = "[input]\npaths = [\"" + (t / "in") + "\"]\n" + extra + "[output]\ndir = \"" +
                  (t / out) +
                  "\"\n[pipeline]\nworkers = 1\n"
                  "[stage.1]\ntype = \"clean\"\n[stage.2]\ntype = \"gopher_quality\"\n"
                  "[stage.3]\ntype = \"pii\"\n";
  write_file_atomic(t / (out + ".toml"), c);
  return t / (out + ".toml");
}

static std::string dir_contents(const std::string& dir) {
  std::string all;
  std::vector<std::string> files;
  for (auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  for (auto& f : files) all += std::filesystem::path(f).filename().string() + "\n" + read_file(f);
  return all;
}

TEST(CurateCli, KillAndResumeMatchesAnUninterruptedRun) {
  TempDir t;
  make_corpus(t, 4, 50);
  Proc ref = run_cli("--config " + config(t, "ref") + " --progress 0");
  ASSERT_EQ(ref.code, 0) << ref.out;
  EXPECT_NE(ref.out.find("every input document accounted for"), std::string::npos) << ref.out;

  std::string cfg = config(t, "run");
  Proc crashed = run_cli("--config " + cfg + " --progress 0", "LOOM_CURATE_CRASH_AFTER_DOCS=120");
  ASSERT_EQ(crashed.code, 86) << crashed.out;  // simulated kill in the middle of shard 2
  EXPECT_TRUE(file_exists(t / "run/kept/shard-00000.jsonl"));
  EXPECT_TRUE(file_exists(t / "run/stats/s0-shard-00001.json"));
  EXPECT_FALSE(file_exists(t / "run/kept/shard-00002.jsonl"));  // only a temporary
  bool temp_left = false;
  for (auto& e : std::filesystem::directory_iterator(t / "run/kept"))
    temp_left |= e.path().string().find(".tmp.") != std::string::npos;
  EXPECT_TRUE(temp_left);
  // A half-written shard file without its stats (as if killed between writes) is not trusted.
  write_file_atomic(t / "run/kept/shard-00003.jsonl", "{\"id\": \"half\"");
  struct stat before;
  ASSERT_EQ(::stat((t / "run/kept/shard-00000.jsonl").c_str(), &before), 0);

  Proc resumed = run_cli("--config " + cfg + " --progress 0");
  ASSERT_EQ(resumed.code, 0) << resumed.out;
  EXPECT_NE(resumed.out.find("2 shards processed"), std::string::npos) << resumed.out;
  struct stat after;
  ASSERT_EQ(::stat((t / "run/kept/shard-00000.jsonl").c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);  // the finished shard was not redone
  EXPECT_EQ(before.st_mtim.tv_nsec, after.st_mtim.tv_nsec);
  EXPECT_EQ(dir_contents(t / "run/kept"), dir_contents(t / "ref/kept"));
  EXPECT_EQ(dir_contents(t / "run/rejected"), dir_contents(t / "ref/rejected"));
  Json r1 = Json::parse(read_file(t / "ref/report.json")),
       r2 = Json::parse(read_file(t / "run/report.json"));
  EXPECT_EQ(r1.at("stages").dump(), r2.at("stages").dump());
  EXPECT_EQ(r2.at("output").at("kept_docs").as_int() + r2.at("output").at("rejected_docs").as_int(),
            200);

  // A different config over the same output directory is refused.
  std::string other = config(t, "run", "max_line_bytes = 5000\n");
  Proc mismatch = run_cli("--config " + t / "run.toml");
  EXPECT_EQ(mismatch.code, 1);
  EXPECT_NE(mismatch.out.find("--restart"), std::string::npos) << mismatch.out;
  EXPECT_EQ(run_cli("--config " + t / "run.toml --restart --progress 0").code, 0);
}

TEST(CurateCli, MalformedInputAndConfigErrors) {
  TempDir t;
  make_dirs(t / "in");
  write_file_atomic(t / "in/a.jsonl",
                    jline("ok", prose(6)) + "{\"id\": \"x\", \"text\": \"unterminated}\n");
  Proc strict =
      run_cli("--config " + config(t, "strict", "on_error = \"fail\"\n") + " --progress 0");
  EXPECT_EQ(strict.code, 1);
  EXPECT_NE(strict.out.find(t / "in/a.jsonl:2"), std::string::npos) << strict.out;
  EXPECT_FALSE(file_exists(t / "strict/kept/shard-00000.jsonl"));  // no partial output
  Proc lenient = run_cli("--config " + config(t, "lenient") + " --progress 0");
  EXPECT_EQ(lenient.code, 0) << lenient.out;
  EXPECT_NE(lenient.out.find("malformed_json: 1"), std::string::npos) << lenient.out;
  EXPECT_NE(lenient.out.find(t / "in/a.jsonl:2"), std::string::npos) << lenient.out;

  write_file_atomic(t / "typo.toml",
                    "[input]\npaths = [\"" + (t / "in") + "\"]\n[output]\ndir = \"" + (t / "o") +
                        "\"\n[stage.1]\ntype = \"gopher_quality\"\nmin_doc_wrds = 3\n");
  Proc typo = run_cli("--config " + t / "typo.toml");
  EXPECT_EQ(typo.code, 1);
  EXPECT_NE(typo.out.find("typo.toml:7: unknown config key 'stage.1.min_doc_wrds'"),
            std::string::npos)
      << typo.out;
  write_file_atomic(t / "type.toml", "[input]\npaths = [\"" + (t / "in") +
                                         "\"]\n[output]\ndir = \"" + (t / "o") +
                                         "\"\n[stage.1]\ntype = \"gopher\"\n");
  Proc badtype = run_cli("--config " + t / "type.toml");
  EXPECT_NE(badtype.out.find("unknown stage type 'gopher'"), std::string::npos) << badtype.out;
}

TEST(CurateCli, TrainClassifier) {
  TempDir t;
  std::string data;
  for (int i = 0; i < 200; ++i) {
    Json j = Json::object();
    j["text"] = i % 2 ? "click free casino bonus offer number " + std::to_string(i)
                      : prose(1, static_cast<uint64_t>(i));
    j["label"] = i % 2 ? "lq" : "hq";
    data += j.dump() + "\n";
  }
  write_file_atomic(t / "train.jsonl", data);
  Proc p = run_cli("train-classifier --input " + t / "train.jsonl" + " --output " + t / "m.bin" +
                   " --buckets 4096");
  ASSERT_EQ(p.code, 0) << p.out;
  EXPECT_NE(p.out.find("held-out accuracy 1.0000"), std::string::npos) << p.out;
  EXPECT_TRUE(file_exists(t / "m.bin"));
  write_file_atomic(t / "bad.jsonl", data + "{\"text\": \"no label\"}\n");
  Proc bad = run_cli("train-classifier --input " + t / "bad.jsonl" + " --output " + t / "m2.bin");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.out.find(t / "bad.jsonl:201"), std::string::npos) << bad.out;
}

// Out-of-range numbers are refused naming the flag, before the input is read and with no
// model written (before: --valid-fraction 2 was a SIGSEGV, -1 and --dim x --buckets past
// memory were "internal error"s).
TEST(CurateCli, TrainClassifierRefusesOutOfRangeNumbers) {
  TempDir t;
  write_file_atomic(t / "train.jsonl",
                    "{\"text\": \"a b c\", \"label\": \"hq\"}\n"
                    "{\"text\": \"d e f\", \"label\": \"lq\"}\n");
  const std::pair<const char*, const char*> cases[] = {
      {"--valid-fraction 2", "--valid-fraction = 2 is out of range"},
      {"--valid-fraction -1", "--valid-fraction = -1 is out of range"},
      {"--dim 100000", "--dim = 100000 is out of range"},
      {"--dim 1024 --buckets 67108864", "--dim x --buckets"},
      {"--buckets 4294967297", "--buckets = 4294967297 is out of range"},
      {"--lr -1", "--lr = -1 is out of range"},
  };
  for (const auto& [flags, message] : cases) {
    Proc p = run_cli("train-classifier --input " + t / "train.jsonl" + " --output " + t / "m.bin " +
                     flags);
    EXPECT_EQ(p.code, 1) << flags << ": " << p.out;
    EXPECT_NE(p.out.find(message), std::string::npos) << flags << ": " << p.out;
    EXPECT_FALSE(file_exists(t / "m.bin")) << flags;
  }
}

TEST(Pipeline, DedupOverAnEmptyShard) {
  // An empty shard has no hashes: its empty buffers once reached memcpy as null pointers
  // (undefined behaviour that UBSan reports; the sanitizer build runs this test).
  TempDir t;
  make_dirs(t / "in");
  write_file_atomic(t / "in/a.jsonl", "");
  write_file_atomic(t / "in/b.jsonl", jline("x", prose(6, 3)) + jline("y", prose(6, 3)));
  write_file_atomic(t / "in/c.jsonl", "\n");  // only a blank line: no documents either
  std::string cfg = "[input]\npaths = [\"" + (t / "in") + "\"]\n[output]\ndir = \"" + (t / "out") +
                    "\"\n[stage.1]\ntype = \"exact_dedup\"\n[stage.2]\ntype = \"fuzzy_dedup\"\n";
  Pipeline p(Config::parse(cfg, "test.toml"));
  RunOptions ro;
  ro.workers = 2;
  ro.progress_interval = 0;
  Json report = p.run(ro);
  EXPECT_EQ(report.at("output").at("kept_docs").as_int(), 1);
  EXPECT_EQ(report.at("output").at("rejected_docs").as_int(), 1);
}
