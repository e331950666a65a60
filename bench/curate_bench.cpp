// Curation throughput: MB/s per core for each stage and for the default pipeline, on text that
// Debian installs on every machine (/usr/share/doc: READMEs, changelogs, copyright files, HTML
// manuals), the shipped default pipeline (configs/curate/jsonl.toml) end to end, and fuzzy-dedup
// memory on generated short documents. Baselines are the targets in the curation issue:
// MinHash >= 50 MB/s/core, default pipeline (no HTML) >= 20 MB/s/core.
//
//   bench_curate [--max-mb 64] [--dedup-docs 100000] [--dedup-budget-mb 2048] [--dedup-only 1]
//
// --dedup-only skips the corpus stages so the peak RSS it prints is the dedup run's alone;
// --dedup-budget-mb below the signatures' size makes fuzzy dedup spill sorted runs to disk.
#include <sys/resource.h>
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/fs.h"
#include "core/log.h"
#include "curate/dedup.h"
#include "curate/input.h"
#include "curate/pipeline.h"
#include "curate/stage.h"

using namespace loom;
using namespace loom::curate;

static std::string read_any(const std::string& path, size_t cap) {
  try {
    auto src = open_source(path);
    std::string out, buf(1 << 16, '\0');
    for (size_t r; (r = src->read(buf.data(), buf.size())) > 0 && out.size() < cap;)
      out.append(buf, 0, r);
    return out;
  } catch (const Error&) {
    return "";
  }
}

// CPU seconds of this thread: the machine is shared, so wall time would measure the neighbours.
static double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

static double peak_rss_mb() {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_maxrss) / 1024.0;
}

struct Corpus {
  std::vector<std::string> docs;
  size_t bytes = 0;
};

static Corpus load(bool html, size_t max_bytes) {
  Corpus c;
  std::vector<std::string> files;
  for (auto& e : std::filesystem::recursive_directory_iterator(
           "/usr/share/doc", std::filesystem::directory_options::skip_permission_denied)) {
    if (!e.is_regular_file()) continue;
    std::string p = e.path().string();
    bool is_html = p.size() > 5 && p.substr(p.size() - 5) == ".html";
    if (is_html == html) files.push_back(p);
  }
  std::sort(files.begin(), files.end());
  for (auto& f : files) {
    std::string t = read_any(f, 256 << 10);
    if (t.size() < 200 || t.find('\0') != std::string::npos) continue;
    c.bytes += t.size();
    c.docs.push_back(std::move(t));
    if (c.bytes >= max_bytes) break;
  }
  return c;
}

// Runs one stage over copies of the documents; returns MB/s on one core.
static double time_stage(const std::string& settings, const Corpus& c, int64_t* kept = nullptr) {
  Config cfg = Config::parse("[stage.1]\n" + settings + "\n", "bench");
  auto st = make_stage(cfg.get_string("stage.1.type", ""), StageParams(cfg, "stage.1"));
  StageStats stats;
  StageContext ctx;
  ctx.stats = &stats;
  double t0 = cpu_now();
  int64_t k = 0;
  for (auto& d : c.docs) {
    Doc doc;
    doc.text = d;
    doc.record = Json::object();
    k += st->process(doc, ctx).empty();
  }
  double dt = cpu_now() - t0;
  if (kept) *kept = k;
  return static_cast<double>(c.bytes) / 1e6 / dt;
}

// Fuzzy dedup on many short generated documents (the target: one million within
// 4 GB): 30 random words each, every tenth a one-word edit of the one before it.
static void bench_dedup(int64_t dedup_docs, double budget_mb) {
  std::string dir = "/tmp/loom_curate_bench_dedup";
  remove_all(dir);
  make_dirs(dir + "/in");
  {
    std::mt19937_64 rng(1);
    std::string body, prev;
    int part = 0;
    for (int64_t i = 0; i < dedup_docs; ++i) {
      std::string t;
      if (i % 10 == 9) {
        t = prev;
        t.replace(0, t.find(' '), "edited");
      } else {
        for (int w = 0; w < 30; ++w) t += "w" + std::to_string(rng() % 50000) + " ";
      }
      prev = t;
      Json j = Json::object();
      j["id"] = i;
      j["text"] = t;
      body += j.dump() + "\n";
      if (body.size() > (16u << 20) || i + 1 == dedup_docs) {
        write_file_atomic(dir + "/in/p" + std::to_string(part++) + ".jsonl", body);
        body.clear();
      }
    }
  }
  double rss_before = peak_rss_mb();
  Pipeline fd(Config::parse("[input]\npaths = [\"" + dir + "/in\"]\n[output]\ndir = \"" + dir +
                                "/out\"\n[stage.1]\ntype = \"fuzzy_dedup\"\nmemory_budget_mb = " +
                                std::to_string(budget_mb) + "\n",
                            "bench"));
  RunOptions ro;
  ro.workers = 1;
  ro.progress_interval = 0;
  double t0 = cpu_now(), w0 = now_seconds();
  Json rep = fd.run(ro);
  Json lsh = Json::parse(read_file(dir + "/out/work/fuzzy_dedup/lsh.json"), "lsh.json");
  std::printf(
      "fuzzy dedup of %lld short docs (budget %.0f MB): %.1f s CPU (%.1f s wall), kept %lld, "
      "%lld candidate pairs, %lld spilled runs; peak RSS %.0f MB (before: %.0f MB; target "
      "4096 MB: %.2fx of it)\n",
      static_cast<long long>(dedup_docs), budget_mb, cpu_now() - t0, now_seconds() - w0,
      static_cast<long long>(rep.at("output").at("kept_docs").as_int()),
      static_cast<long long>(lsh.at("candidate_pairs").as_int()),
      static_cast<long long>(lsh.at("spill_runs").as_int()), peak_rss_mb(), rss_before,
      peak_rss_mb() / 4096);
  remove_all(dir);
}

int main(int argc, char** argv) {
  size_t max_mb = 64;
  int64_t dedup_docs = 100000;
  double dedup_budget_mb = 2048;
  bool dedup_only = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--dedup-budget-mb")) dedup_budget_mb = std::atof(argv[i + 1]);
    if (!std::strcmp(argv[i], "--dedup-only")) dedup_only = std::atoi(argv[i + 1]) != 0;
    if (!std::strcmp(argv[i], "--max-mb")) max_mb = static_cast<size_t>(std::atoll(argv[i + 1]));
    if (!std::strcmp(argv[i], "--dedup-docs")) dedup_docs = std::atoll(argv[i + 1]);
  }
  set_log_level(LogLevel::Warn);
  if (dedup_only) {
    bench_dedup(dedup_docs, dedup_budget_mb);
    return 0;
  }
  Corpus text = load(false, max_mb << 20), html = load(true, max_mb << 20);
  std::printf("corpus: %zu text docs, %.1f MB from /usr/share/doc; %zu HTML pages, %.1f MB\n",
              text.docs.size(), static_cast<double>(text.bytes) / 1e6, html.docs.size(),
              static_cast<double>(html.bytes) / 1e6);
  std::printf("\n%-22s %10s   (one core)\n", "stage", "MB/s");
  const char* stages[][2] = {
      {"clean", "type = \"clean\""},
      {"gopher_quality", "type = \"gopher_quality\""},
      {"gopher_repetition", "type = \"gopher_repetition\""},
      {"c4", "type = \"c4\""},
      {"fineweb", "type = \"fineweb\""},
      {"pii", "type = \"pii\""},
      {"langid", "type = \"langid\""},
      {"langid whole docs", "type = \"langid\"\nsample_bytes = 0"},
  };
  double inv_sum = 0;
  for (auto& s : stages) {
    double mbs = time_stage(s[1], text, nullptr);
    if (std::strcmp(s[0], "langid whole docs") != 0) inv_sum += 1 / mbs;
    std::printf("%-22s %10.1f\n", s[0], mbs);
  }
  MinHasher mh(MinHashParams{});
  double t0 = cpu_now();
  uint64_t sink = 0;
  for (auto& d : text.docs) sink += mh.signature(d)[0];
  double minhash = static_cast<double>(text.bytes) / 1e6 / (cpu_now() - t0);
  std::printf("%-22s %10.1f   (target 50: %.2fx)\n", "minhash 14x8 word-5", minhash, minhash / 50);
  MinHashParams nemo;
  nemo.shingle = "char";
  nemo.ngram = 24;
  nemo.bands = 20;
  nemo.rows = 13;
  MinHasher mn(nemo);
  t0 = cpu_now();
  for (auto& d : text.docs) sink += mn.signature(d)[0];
  std::printf("%-22s %10.1f\n", "minhash 20x13 char-24",
              static_cast<double>(text.bytes) / 1e6 / (cpu_now() - t0));
  if (!html.docs.empty())
    std::printf("%-22s %10.1f   (on %.1f MB of HTML)\n", "html_extract",
                time_stage("type = \"html_extract\"", html), static_cast<double>(html.bytes) / 1e6);
  // Every text stage above on every document (in a pipeline, filters shrink what later stages
  // read, so this bounds the engine figure below from underneath) plus MinHash signatures.
  double pipeline = 1 / (inv_sum + 1 / minhash);
  std::printf(
      "\nevery stage on every document (sum of stage times, sampled langid, minhash): %.1f MB/s "
      "per core (target 20: %.2fx)\n",
      pipeline, pipeline / 20);

  // End to end through the engine (readers, JSON, writers, two segments with fuzzy dedup).
  std::string dir = "/tmp/loom_curate_bench";
  remove_all(dir);
  make_dirs(dir + "/in");
  {
    std::string body;
    for (size_t i = 0; i < text.docs.size(); ++i) {
      Json j = Json::object();
      j["id"] = static_cast<int64_t>(i);
      j["text"] = text.docs[i];
      body += j.dump() + "\n";
      if (body.size() > (8u << 20) || i + 1 == text.docs.size()) {
        write_file_atomic(dir + "/in/part" + std::to_string(i) + ".jsonl", body);
        body.clear();
      }
    }
  }
  // The shipped default pipeline as users run it: clean, langid, Gopher x2, FineWeb, PII, exact
  // and fuzzy dedup, with readers, JSON and writers; the figure is input MB over the CPU
  // seconds of the whole run (the report's mb_per_cpu_second).
  Config cfg = Config::load(LOOM_SOURCE_DIR "/configs/curate/jsonl.toml");
  cfg.set("input.paths", "[\"" + dir + "/in\"]", "bench");
  cfg.set("output.dir", "\"" + dir + "/out\"", "bench");
  set_log_level(LogLevel::Warn);
  Pipeline p(cfg);
  RunOptions ro;
  ro.workers = 1;
  ro.progress_interval = 0;
  Json rep = p.run(ro);
  std::printf("\nconfigs/curate/jsonl.toml end to end, 1 worker (engine: JSONL in and out):\n");
  for (auto& t : rep.at("timing").as_array())
    std::printf("  %-20s %8.3f s %8.1f MB/s of its input\n", t.at("name").as_string().c_str(),
                t.at("seconds").as_double(), t.at("mb_per_s").as_double());
  double e2e = rep.at("run").at("mb_per_cpu_second").as_double();
  std::printf(
      "default pipeline end to end: %.1f MB/s per core (%.2f CPU s for %.1f MB; target 20: "
      "%.2fx), kept %lld of %zu\n",
      e2e, rep.at("run").at("cpu_seconds").as_double(),
      static_cast<double>(rep.at("input").at("bytes").as_int()) / 1e6, e2e / 20,
      static_cast<long long>(rep.at("output").at("kept_docs").as_int()), text.docs.size());
  remove_all(dir);

  bench_dedup(dedup_docs, dedup_budget_mb);
  return sink == 42 ? 1 : 0;
}
