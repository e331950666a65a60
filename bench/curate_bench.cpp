// Curation throughput: MB/s per core for each stage and for the default pipeline, on text that
// Debian installs on every machine (/usr/share/doc: READMEs, changelogs, copyright files, HTML
// manuals), the shipped default pipeline (configs/curate/jsonl.toml) end to end, and fuzzy-dedup
// memory on generated short documents. Baselines are the targets in the curation issue:
// MinHash >= 50 MB/s/core, default pipeline (no HTML) >= 20 MB/s/core.
//
//   bench_curate [--max-mb 64] [--dedup-docs 100000] [--dedup-budget-mb 2048] [--dedup-only 1]
//   bench_curate --web 1 [--web-docs 2700] [--runs 6] [--passes 3] [--reference-first 0] [--seed 1]
//
// --dedup-only skips the corpus stages so the peak RSS it prints is the dedup run's alone;
// --dedup-budget-mb below the signatures' size makes fuzzy dedup spill sorted runs to disk.
// --web runs only the short-document benchmark: the default pipeline on generated web-like
// documents (tests/curate/web_corpus.h), alternating the fast paths with the reference paths
// (set_reference_paths) run after run, the first run cold; it prints MB/s per core end to end
// and per stage, the load average, the kept and rejected counts by reason, and every document
// whose outcome (kept, or the stage and reason) differs between the two paths.
#include <sys/resource.h>
#include <cstdio>  // compact_lang_det.h uses FILE without including it

#include <cld2/public/compact_lang_det.h>
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/fs.h"
#include "core/log.h"
#include "curate/dedup.h"
#include "curate/input.h"
#include "curate/langid.h"
#include "curate/pipeline.h"
#include "curate/stage.h"
#include "curate/text.h"
#include "curate/web_corpus.h"

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

static std::string load_text() {
  std::string s = read_any("/proc/loadavg", 256);
  return s.substr(0, s.find(' ', s.find(' ', s.find(' ') + 1) + 1));
}

// id -> "kept" or "stage/reason" (and duplicate_of), then after a '|' the language fields
// langid wrote, for every document of a finished run's output directory.
static std::map<std::string, std::string> outcomes(const std::string& out) {
  std::map<std::string, std::string> m;
  for (const char* sub : {"kept", "rejected"}) {
    std::vector<std::string> files;
    for (auto& e : std::filesystem::directory_iterator(out + "/" + sub))
      files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    for (auto& f : files) {
      const std::string data = read_file(f);
      for (auto line : split_lines(data)) {
        if (line.empty()) continue;
        Json j = Json::parse(std::string(line), f);
        std::string o = j.contains("rejected_stage") ? j.at("rejected_stage").as_string() + "/" +
                                                           j.at("rejected_reason").as_string()
                                                     : "kept";
        if (j.contains("duplicate_of")) o += " of " + j.at("duplicate_of").dump();
        o += " |";  // what follows is the language fields
        if (j.contains("language"))
          o += " " + j.at("language").as_string() + " " + j.at("language_score").dump();
        m[j.at("id").as_string()] = o;
      }
    }
  }
  return m;
}

// CPU seconds per stage of the first segment (the stages before the first dedup) and the bytes
// each read: the documents go from memory through the stages in order, as in the engine.
struct StageCpu {
  std::vector<std::string> names;
  std::vector<double> seconds;
  std::vector<int64_t> bytes;
};
static StageCpu stage_cpu(const Pipeline& p, const std::vector<test::WebDoc>& docs) {
  StageCpu r;
  size_t n = 0;
  while (n < p.stages().size() && !p.stages()[n].stage->global()) ++n;
  for (size_t s = 0; s < n; ++s) r.names.push_back(p.stages()[s].name);
  r.seconds.assign(n, 0);
  r.bytes.assign(n, 0);
  std::vector<StageStats> stats(n);
  StageContext ctx;
  for (auto& d : docs) {
    Doc doc;
    doc.id = d.id;
    doc.text = d.text;
    doc.record = Json::object();
    doc.record["url"] = d.url;
    for (size_t s = 0; s < n; ++s) {
      ctx.stats = &stats[s];
      r.bytes[s] += static_cast<int64_t>(doc.text.size());
      const double t0 = cpu_now();
      const bool kept = p.stages()[s].stage->process(doc, ctx).empty();
      r.seconds[s] += cpu_now() - t0;
      if (!kept) break;
    }
  }
  return r;
}

// How CLD2's decisions and cost change with what it reads, on the cleaned short documents:
// the langid stage's default (whole text up to sample_bytes 4096) against bounded prefixes,
// four-window samples and CLD2 flags.
static int langid_study(size_t ndocs, uint64_t seed) {
  test::WebCorpus gen(seed);
  auto docs = gen.make(ndocs);
  Config cc = Config::parse("[stage.1]\ntype = \"clean\"\n", "bench");
  auto clean = make_stage("clean", StageParams(cc, "stage.1"));
  StageStats stats;
  StageContext ctx;
  ctx.stats = &stats;
  std::vector<std::string> texts;
  size_t bytes = 0;
  for (auto& d : docs) {
    Doc doc;
    doc.text = d.text;
    doc.record = Json::object();
    if (!clean->process(doc, ctx).empty()) continue;
    bytes += doc.text.size();
    texts.push_back(std::move(doc.text));
  }
  auto cld = [](std::string_view t, int flags) {
    CLD2::Language lang3[3] = {CLD2::UNKNOWN_LANGUAGE, CLD2::UNKNOWN_LANGUAGE,
                               CLD2::UNKNOWN_LANGUAGE};
    int percent3[3] = {0, 0, 0};
    double norm3[3];
    int text_bytes = 0, valid = 0;
    bool reliable = false;
    CLD2::Language top = CLD2::ExtDetectLanguageSummaryCheckUTF8(
        t.data(), static_cast<int>(t.size()), true, nullptr, flags, lang3, percent3, norm3, nullptr,
        &text_bytes, &reliable, &valid);
    LangResult r;
    r.code = CLD2::LanguageCode(top);
    for (int i = 0; i < 3; ++i)
      if (lang3[i] == top) r.score = percent3[i] / 100.0;
    if (!reliable) r.score *= 0.5;
    return r;
  };
  auto prefix = [](std::string_view t, size_t n) {
    if (t.size() <= n) return t;
    size_t e = n;
    while (e > n / 2 && t[e] != ' ' && t[e] != '\n') --e;
    if (e <= n / 2) e = n;
    while (e > 0 && (static_cast<unsigned char>(t[e]) & 0xC0) == 0x80) --e;
    return t.substr(0, e);
  };
  struct Variant {
    std::string name;
    size_t prefix = 0, sample = 4096;
    int flags = 0;
  };
  std::vector<Variant> vs = {{"default (whole <= 4096)", 0, 4096, 0}};
  for (size_t p : {512, 768, 1024, 1536, 2048, 3072})
    vs.push_back({"prefix " + std::to_string(p), p, 0, 0});
  for (size_t w : {768, 1024, 1536, 2048})
    vs.push_back({"4 windows " + std::to_string(w), 0, w, 0});
  vs.push_back({"flag Finish (no second pass)", 0, 4096, 1});
  vs.push_back({"flag BestEffort", 0, 4096, CLD2::kCLDFlagBestEffort});
  vs.push_back({"flag ScoreAsQuads", 0, 4096, CLD2::kCLDFlagScoreAsQuads});
  std::vector<LangResult> ref;
  std::printf("langid on %zu cleaned documents, %.2f MB (load %s)\n", texts.size(),
              static_cast<double>(bytes) / 1e6, load_text().c_str());
  std::printf("%-30s %9s %9s %9s %9s %9s\n", "variant", "MB/s", "decision", "language", "score",
              "read MB");
  for (int round = 0; round < 2; ++round)
    for (auto& v : vs) {
      std::vector<LangResult> got;
      std::string scratch;
      size_t read = 0;
      double t0 = cpu_now();
      for (auto& t : texts) {
        std::string_view in =
            v.prefix ? prefix(t, v.prefix) : language_sample(t, v.sample, scratch);
        read += in.size();
        got.push_back(cld(in, v.flags));
      }
      const double dt = cpu_now() - t0;
      if (ref.empty()) ref = got;
      int decision = 0, language = 0, score = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        auto keep = [](const LangResult& r) { return r.code == "en" && r.score >= 0.5; };
        decision += keep(got[i]) != keep(ref[i]);
        language += got[i].code != ref[i].code;
        score += got[i].score != ref[i].score;
      }
      if (round == 1)
        std::printf("%-30s %9.1f %9d %9d %9d %9.2f\n", v.name.c_str(),
                    static_cast<double>(bytes) / 1e6 / dt, decision, language, score,
                    static_cast<double>(read) / 1e6);
    }
  return 0;
}

// The default pipeline on short web-like documents, fast paths against reference paths.
static int bench_web(size_t ndocs, int runs, bool reference_first, uint64_t seed, int passes) {
  const std::string dir = "/tmp/loom_curate_bench_web";
  remove_all(dir);
  make_dirs(dir + "/in");
  test::WebCorpus gen(seed);
  auto docs = gen.make(ndocs);
  const std::string body = test::WebCorpus::jsonl(docs);
  write_file_atomic(dir + "/in/web.jsonl", body);
  std::map<std::string, int> kinds;
  for (auto& d : docs) ++kinds[d.kind];
  std::printf("corpus: %zu short web-like documents, %.2f MB of JSONL (seed %llu):", docs.size(),
              static_cast<double>(body.size()) / 1e6, static_cast<unsigned long long>(seed));
  for (auto& [k, n] : kinds) std::printf(" %s %d", k.c_str(), n);
  std::printf("\n\n%-4s %-9s %-5s %12s %14s %10s %8s   %s\n", "run", "path", "", "MB/s/core",
              "read MB/s/core", "CPU s", "kept", "load average");
  std::map<bool, std::vector<double>> figures, read_figures;
  std::map<bool, Json> best;
  std::map<bool, std::map<std::string, std::string>> seen;
  for (int r = 0; r < runs; ++r) {
    const bool ref = (r % 2 == 0) == reference_first;
    set_reference_paths(ref);
    Config cfg = Config::load(LOOM_SOURCE_DIR "/configs/curate/jsonl.toml");
    cfg.set("input.paths", "[\"" + dir + "/in\"]", "bench");
    const std::string out = dir + (ref ? "/out_ref" : "/out_fast");
    cfg.set("output.dir", "\"" + out + "\"", "bench");
    // The reference reads documents up to 4096 bytes whole (langid's former default).
    if (ref) cfg.set("stage.2.sample_bytes", "4096", "bench");
    Pipeline p(cfg);
    RunOptions ro;
    ro.workers = 1;
    ro.restart = true;
    ro.progress_interval = 0;
    const std::string load_before = load_text();
    Json rep = p.run(ro);
    const double mbs = rep.at("run").at("mb_per_cpu_second").as_double();
    const double cpu = rep.at("run").at("cpu_seconds").as_double();
    const double read = static_cast<double>(rep.at("run").at("bytes_read").as_int()) / 1e6 / cpu;
    std::printf("%-4d %-9s %-5s %12.1f %14.1f %10.3f %8lld   %s -> %s\n", r,
                ref ? "reference" : "fast", r == 0 ? "cold" : "warm", mbs, read, cpu,
                static_cast<long long>(rep.at("output").at("kept_docs").as_int()),
                load_before.c_str(), load_text().c_str());
    if (r > 0) {
      figures[ref].push_back(mbs);
      read_figures[ref].push_back(read);
      if (!best.count(ref) || best[ref].at("run").at("mb_per_cpu_second").as_double() < mbs)
        best[ref] = rep;
    }
    auto o = outcomes(out);
    if (seen.count(ref) && seen[ref] != o)
      std::printf("  (outcomes differ from this path's last run)\n");
    seen[ref] = std::move(o);
  }
  set_reference_paths(false);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  const double fast = median(figures[false]), ref = median(figures[true]);
  const double rfast = median(read_figures[false]), rref = median(read_figures[true]);
  std::printf(
      "\nwarm median, input MB per CPU second (the report's mb_per_cpu_second): fast %.1f, "
      "reference %.1f, ratio %.2fx (target 50: %.2fx)\n"
      "warm median, MB read by every segment (input and work/ files) per CPU second: fast "
      "%.1f, reference %.1f, ratio %.2fx (target 50: %.2fx)\n",
      fast, ref, ref > 0 ? fast / ref : 0.0, fast / 50, rfast, rref, rref > 0 ? rfast / rref : 0.0,
      rfast / 50);
  for (bool path : {false, true}) {
    if (!best.count(path)) continue;
    std::printf("\nper stage, best warm %s run (steady-clock seconds in the worker):\n",
                path ? "reference" : "fast");
    for (auto& t : best[path].at("timing").as_array())
      std::printf("  %-20s %8.3f s %8.1f MB/s of its input\n", t.at("name").as_string().c_str(),
                  t.at("seconds").as_double(), t.at("mb_per_s").as_double());
  }
  if (best.count(false)) {
    std::printf("\nkept %lld, rejected by reason:\n",
                static_cast<long long>(best[false].at("output").at("kept_docs").as_int()));
    for (auto& st : best[false].at("stages").as_array())
      if (st.contains("reasons"))
        for (auto& [why, n] : st.at("reasons").as_object())
          std::printf("  %-18s %-34s %6lld\n", st.at("name").as_string().c_str(), why.c_str(),
                      static_cast<long long>(n.as_int()));
  }
  // Per stage in CPU time (the report's stage times above are steady-clock, inflated on a
  // loaded machine): the best of several passes of each path, alternated.
  if (passes > 0) {
    std::map<bool, std::unique_ptr<Pipeline>> pipes;
    for (bool ref : {false, true}) {
      Config cfg = Config::load(LOOM_SOURCE_DIR "/configs/curate/jsonl.toml");
      cfg.set("input.paths", "[\"" + dir + "/in\"]", "bench");
      cfg.set("output.dir", "\"" + dir + "/unused\"", "bench");
      if (ref) cfg.set("stage.2.sample_bytes", "4096", "bench");
      pipes[ref] = std::make_unique<Pipeline>(cfg);
    }
    std::map<bool, StageCpu> fastest;
    for (int pass = 0; pass < 2 * passes; ++pass) {
      const bool path = pass % 2 == 1;
      set_reference_paths(path);
      StageCpu c = stage_cpu(*pipes[path], docs);
      if (!fastest.count(path)) {
        fastest[path] = c;
        continue;
      }
      for (size_t s = 0; s < c.seconds.size(); ++s)
        fastest[path].seconds[s] = std::min(fastest[path].seconds[s], c.seconds[s]);
    }
    set_reference_paths(false);
    std::printf("\nstages before dedup, CPU time, best of %d passes each (load %s):\n", passes,
                load_text().c_str());
    std::printf("  %-20s %10s %10s %8s %9s\n", "stage", "fast MB/s", "ref MB/s", "ratio",
                "input MB");
    double tf = 0, tr = 0;
    for (size_t s = 0; s < fastest[false].names.size(); ++s) {
      const double mb = static_cast<double>(fastest[false].bytes[s]) / 1e6;
      const double f = fastest[false].seconds[s], r = fastest[true].seconds[s];
      tf += f;
      tr += r;
      std::printf("  %-20s %10.1f %10.1f %7.2fx %9.2f\n", fastest[false].names[s].c_str(), mb / f,
                  static_cast<double>(fastest[true].bytes[s]) / 1e6 / r, r / f, mb);
    }
    std::printf("  %-20s %10.3f %10.3f %7.2fx  (CPU seconds)\n", "sum", tf, tr, tr / tf);
  }

  int diffs = 0, field_diffs = 0;
  if (seen.count(false) && seen.count(true)) {
    std::printf("\n");
    for (auto& [id, o] : seen[false]) {
      auto it = seen[true].find(id);
      const std::string other = it == seen[true].end() ? "(missing)" : it->second;
      if (other == o) continue;
      const bool decision = other.substr(0, other.find('|')) != o.substr(0, o.find('|'));
      (decision ? diffs : field_diffs)++;
      if (decision || field_diffs <= 10)
        std::printf("  %s %s: fast '%s' reference '%s'\n", decision ? "DECISION" : "fields  ",
                    id.c_str(), o.c_str(), other.c_str());
    }
    if (seen[true].size() != seen[false].size()) ++diffs;
    std::printf(
        "outcomes (kept, or stage/reason and duplicate_of) over %zu documents: %s (%d differ); "
        "language fields differ on %d of them\n",
        seen[false].size(), diffs ? "DIFFERENT" : "identical", diffs, field_diffs);
  }
  remove_all(dir);
  return diffs ? 1 : 0;
}

int main(int argc, char** argv) {
  size_t max_mb = 64;
  int64_t dedup_docs = 100000;
  double dedup_budget_mb = 2048;
  bool dedup_only = false, web = false, study = false, reference_first = false;
  size_t web_docs = 2700;
  int runs = 6, passes = 3;
  uint64_t seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--web")) web = std::atoi(argv[i + 1]) != 0;
    if (!std::strcmp(argv[i], "--langid-study")) study = std::atoi(argv[i + 1]) != 0;
    if (!std::strcmp(argv[i], "--web-docs"))
      web_docs = static_cast<size_t>(std::atoll(argv[i + 1]));
    if (!std::strcmp(argv[i], "--runs")) runs = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--passes")) passes = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reference-first")) reference_first = std::atoi(argv[i + 1]) != 0;
    if (!std::strcmp(argv[i], "--seed")) seed = static_cast<uint64_t>(std::atoll(argv[i + 1]));
    if (!std::strcmp(argv[i], "--dedup-budget-mb")) dedup_budget_mb = std::atof(argv[i + 1]);
    if (!std::strcmp(argv[i], "--dedup-only")) dedup_only = std::atoi(argv[i + 1]) != 0;
    if (!std::strcmp(argv[i], "--max-mb")) max_mb = static_cast<size_t>(std::atoll(argv[i + 1]));
    if (!std::strcmp(argv[i], "--dedup-docs")) dedup_docs = std::atoll(argv[i + 1]);
  }
  set_log_level(LogLevel::Warn);
  if (study) return langid_study(web_docs, seed);
  if (web) return bench_web(web_docs, runs, reference_first, seed, passes);
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
