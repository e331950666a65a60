#include "curate/pipeline.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "comm/communicator.h"
#include "core/config_int32.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "core/parallel.h"
#include "curate/collective.h"
#include "curate/text.h"
#include "curate/writer.h"

namespace loom::curate {
namespace fsys = std::filesystem;

static std::string shard_name(int i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "shard-%05d", i);
  return buf;
}

// Input size caps are held as size_t and a line or document up to the cap is held in memory:
// 1 TiB is past any machine's memory, and far from overflowing the arithmetic on them.
constexpr int64_t kMaxBytes = int64_t{1} << 40;

Pipeline::Pipeline(const Config& cfg) {
  // "file:line: 'key'" (or just the key when it was not set) for errors about a value read.
  auto where = [&](const std::string& key) {
    const std::string w = cfg.where(key);
    return w.empty() ? cat("'", key, "'") : cat(w, ": '", key, "'");
  };
  reader_.format = cfg.get_string("input.format", "jsonl");
  LOOM_CHECK(reader_.format == "jsonl" || reader_.format == "text" || reader_.format == "html" ||
                 reader_.format == "warc",
             where("input.format"), " must be jsonl, text, html or warc, got '", reader_.format,
             "'");
  LOOM_CHECK(cfg.has("input.paths"),
             "config: input.paths is required (a JSON list of files, "
             "directories or glob patterns)");
  input_paths_ = parse_string_list(cfg.get_string("input.paths", ""), "input.paths");
  reader_.text_field = cfg.get_string("input.text_field", "text");
  reader_.id_field = cfg.get_string("input.id_field", "id");
  reader_.max_line_bytes =
      static_cast<size_t>(cfg.get_int("input.max_line_bytes", 64 << 20, 1, kMaxBytes));
  reader_.max_doc_bytes =
      static_cast<size_t>(cfg.get_int("input.max_doc_bytes", 64 << 20, 1, kMaxBytes));
  std::string on_error = cfg.get_string("input.on_error", "reject");
  LOOM_CHECK(on_error == "reject" || on_error == "fail", where("input.on_error"),
             " must be 'reject' or 'fail', got '", on_error, "'");
  reader_.fail_on_error = on_error == "fail";
  files_per_shard_ = get_int32(cfg, "input.files_per_shard", 1000, 1, 1 << 30);

  out_dir_ = cfg.get_string("output.dir", "");
  LOOM_CHECK(!out_dir_.empty(), "config: output.dir is required");
  std::string comp = cfg.get_string("output.compression", "none");
  LOOM_CHECK(comp == "none" || comp == "zstd", where("output.compression"),
             " must be none or zstd, got '", comp, "'");
  zstd_ = comp == "zstd";
  zstd_level_ = get_int32(cfg, "output.zstd_level", 3, -(1 << 17), 22);
  workers_ = get_int32(cfg, "pipeline.workers", 0, 0, 4096);

  // Stages: [stage.N] sections, run in increasing N.
  std::set<int64_t> ids;
  for (auto& k : cfg.keys()) {
    if (!starts_with(k, "stage.")) continue;
    std::string rest = k.substr(6);
    std::string num = rest.substr(0, rest.find('.'));
    char* end = nullptr;
    long long n = std::strtoll(num.c_str(), &end, 10);
    LOOM_CHECK(!num.empty() && *end == 0, "config key '", k,
               "': stages are sections named [stage.N] with N an integer");
    ids.insert(n);
  }
  std::map<std::string, int> type_count;
  std::vector<std::pair<int64_t, std::string>> order;
  for (int64_t n : ids) {
    std::string prefix = cat("stage.", n);
    LOOM_CHECK(
        cfg.has(prefix + ".type"), "config: [", prefix, "] has no 'type' (one of ",
        [] {
          std::string s;
          for (auto& t : stage_types()) s += (s.empty() ? "" : ", ") + t;
          return s;
        }(),
        ")");
    order.push_back({n, cfg.get_string(prefix + ".type", "")});
    ++type_count[order.back().second];
  }
  std::set<std::string> names;
  for (auto& [n, type] : order) {
    std::string prefix = cat("stage.", n);
    StageSpec s;
    s.type = type;
    s.name = cfg.get_string(prefix + ".name", type_count[type] > 1 ? cat(type, "_", n) : type);
    LOOM_CHECK(names.insert(s.name).second, "config: two stages are named '", s.name, "'");
    s.stage = make_stage(type, StageParams(cfg, prefix));
    stages_.push_back(std::move(s));
  }
  cfg.check_all_used();

  // Segments: a global stage starts a new one.
  size_t begin = 0;
  for (size_t i = 0; i < stages_.size(); ++i) {
    if (!stages_[i].stage->global()) continue;
    segments_.push_back({begin, i});
    begin = i;
  }
  segments_.push_back({begin, stages_.size()});

  const std::string dump = cfg.dump();
  for (auto& line : split_lines(dump))
    if (!line.empty() && !starts_with(line, "pipeline.")) identity_ += std::string(line) + "\n";
}

struct Progress {
  std::atomic<int64_t> docs{0}, bytes{0}, shards_done{0};
  int64_t total_bytes = 0, total_shards = 0;
  std::atomic<int64_t> crash_counter{0};
};

namespace {

// Prints progress lines from a background thread until stopped.
class ProgressPrinter {
 public:
  ProgressPrinter(Progress& p, double interval, std::string label)
      : p_(p), interval_(interval), label_(std::move(label)) {
    if (interval_ > 0) th_ = std::thread([this] { loop(); });
  }
  ~ProgressPrinter() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (th_.joinable()) th_.join();
  }

 private:
  void loop() {
    double t0 = now_seconds();
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::duration<double>(interval_), [&] { return stop_; })) {
      double dt = std::max(1e-9, now_seconds() - t0);
      double docs = static_cast<double>(p_.docs.load()),
             bytes = static_cast<double>(p_.bytes.load());
      double rate = bytes / dt;
      double left = std::max(0.0, static_cast<double>(p_.total_bytes) - bytes);
      log_info("curate ", label_, ": ", static_cast<int64_t>(docs), " docs, ",
               static_cast<int64_t>(docs / dt), " docs/s, ", rate / 1e6, " MB/s, shards ",
               p_.shards_done.load(), "/", p_.total_shards, ", ETA ",
               rate > 0 ? static_cast<int64_t>(left / rate) : -1, " s");
    }
  }
  Progress& p_;
  double interval_;
  std::string label_;
  std::thread th_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};

void remove_stale_temps(const std::string& dir) {
  if (!fsys::exists(dir)) return;
  for (auto& e : fsys::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename().string().find(".tmp.") != std::string::npos)
      fsys::remove(e.path());
}

}  // namespace

struct Pipeline::ShardResult {
  Json stats;  // what stats/sK-shard-N.json holds
};

std::string Pipeline::kept_path(int shard, bool last, size_t seg) const {
  if (last) return cat(out_dir_, "/kept/", shard_name(shard), ".jsonl", zstd_ ? ".zst" : "");
  return cat(out_dir_, "/work/s", seg, "/", shard_name(shard), ".jsonl");
}

Pipeline::ShardResult Pipeline::run_shard(size_t seg, const InputShard& shard,
                                          const std::string& in_file, bool last, Progress& progress,
                                          int64_t crash_after) {
  double t0 = now_seconds();
  const Segment& sg = segments_[seg];
  std::unique_ptr<DocReader> reader;
  if (seg == 0) {
    reader = open_reader(shard, reader_);
  } else {
    ReaderOptions ro = reader_;
    ro.format = "jsonl";
    ro.fail_on_error = true;  // our own intermediate files: any damage is a hard error
    InputShard s;
    s.files = {in_file};
    reader = open_reader(s, ro);
  }
  JsonlWriter kept(kept_path(shard.index, last, seg), last && zstd_, zstd_level_);
  JsonlWriter rejected(cat(out_dir_, "/rejected/", shard_name(shard.index), ".s", seg, ".jsonl",
                           zstd_ ? ".zst" : ""),
                       zstd_, zstd_level_);
  StageStats reader_stats;
  std::vector<StageStats> stats(sg.end - sg.begin);
  // Seconds this worker spent in the reader, in each stage and in the writers: steady-clock
  // reads (tens of nanoseconds) around each call, cheap enough for millions of short documents.
  std::vector<double> stage_seconds(sg.end - sg.begin);
  double reader_seconds = 0, writer_seconds = 0;
  StageContext ctx;
  ctx.shard = shard.index;
  Doc doc;
  std::string reject;
  int64_t index = 0, local_docs = 0;
  uint64_t last_pos = 0;
  auto write = [&](JsonlWriter& w, Doc& d, const std::string* stage, const std::string* reason) {
    if (!d.record.is_object()) d.record = Json::object();
    d.record[reader_.id_field] = d.id;
    if (!d.text.empty() || !stage || *stage != "reader")
      d.record[reader_.text_field] = std::move(d.text);
    if (stage) {
      d.record["rejected_stage"] = *stage;
      d.record["rejected_reason"] = *reason;
    }
    double w0 = now_seconds();
    w.write_line(d.record.dump());
    writer_seconds += now_seconds() - w0;
  };
  static const std::string kReader = "reader";
  for (double r0 = now_seconds(); reader->next(doc, reject); r0 = now_seconds()) {
    reader_seconds += now_seconds() - r0;
    ++reader_stats.docs_in;
    reader_stats.bytes_in += doc.input_bytes;
    if (!reject.empty()) {
      ++reader_stats.reasons[reject];
      write(rejected, doc, &kReader, &reject);
    } else {
      ++reader_stats.docs_out;
      reader_stats.bytes_out += static_cast<int64_t>(doc.text.size());
      ctx.doc_index = index++;
      bool keep = true;
      for (size_t s = sg.begin; s < sg.end; ++s) {
        StageStats& st = stats[s - sg.begin];
        ++st.docs_in;
        st.bytes_in += static_cast<int64_t>(doc.text.size());
        ctx.stats = &st;
        double s0 = now_seconds();
        std::string why = stages_[s].stage->process(doc, ctx);
        stage_seconds[s - sg.begin] += now_seconds() - s0;
        if (!why.empty()) {
          ++st.reasons[why];
          write(rejected, doc, &stages_[s].name, &why);
          keep = false;
          break;
        }
        ++st.docs_out;
        st.bytes_out += static_cast<int64_t>(doc.text.size());
      }
      if (keep) write(kept, doc, nullptr, nullptr);
    }
    if ((++local_docs & 63) == 0) {
      uint64_t pos = reader->position();
      progress.bytes += static_cast<int64_t>(pos - last_pos);
      last_pos = pos;
      progress.docs += 64;
    }
    if (crash_after >= 0 && progress.crash_counter.fetch_add(1) + 1 >= crash_after) {
      // Simulated kill for the resume tests: no commit, no cleanup, temporaries stay behind.
      std::fflush(nullptr);
      ::_exit(86);
    }
  }
  progress.bytes += static_cast<int64_t>(reader->position() - last_pos);
  progress.docs += local_docs & 63;
  if (reader->non_document_records > 0) {
    reader_stats.counters["non_document_records"] += reader->non_document_records;
    reader_stats.counters["non_document_bytes"] += reader->non_document_bytes;
  }

  kept.commit();
  rejected.commit();
  ShardResult r;
  r.stats = Json::object();
  r.stats["shard"] = shard.index;
  r.stats["segment"] = static_cast<int64_t>(seg);
  if (seg == 0) r.stats["reader"] = reader_stats.to_json();
  Json st = Json::object();
  for (size_t s = sg.begin; s < sg.end; ++s) st[stages_[s].name] = stats[s - sg.begin].to_json();
  r.stats["stages"] = st;
  Json errs = Json::array();
  for (size_t i = 0; i < reader->errors.size() && i < 100; ++i) {
    Json e = Json::object();
    e["where"] = reader->errors[i].where;
    e["message"] = reader->errors[i].message;
    errs.push_back(e);
  }
  r.stats["errors"] = errs;
  r.stats["error_count"] = static_cast<int64_t>(reader->errors.size());
  r.stats["unread_bytes"] = static_cast<int64_t>(reader->unread_bytes);
  r.stats["stream_errors"] = reader->stream_errors;
  r.stats["kept"] = static_cast<int64_t>(kept.lines());
  r.stats["rejected"] = static_cast<int64_t>(rejected.lines());
  r.stats["seconds"] = now_seconds() - t0;
  Json secs = Json::object();
  if (seg == 0) secs["reader"] = reader_seconds;
  for (size_t s = sg.begin; s < sg.end; ++s) secs[stages_[s].name] = stage_seconds[s - sg.begin];
  secs["writer"] = writer_seconds;
  r.stats["stage_seconds"] = secs;
  for (auto& e : reader->errors) log_warn("curate: ", e.where, ": ", e.message);
  // Written last: its presence is what marks the shard finished.
  write_file_atomic(cat(out_dir_, "/stats/s", seg, "-", shard_name(shard.index), ".json"),
                    r.stats.dump(1));
  ++progress.shards_done;
  return r;
}

Json Pipeline::run(const RunOptions& opt) {
  double t0 = now_seconds(), cpu0 = process_cpu_seconds();
  comm::Communicator& c = opt.comm ? *opt.comm : comm::world();
  const int ranks = c.size(), me = c.rank();
  auto owns = [&](size_t i) { return static_cast<int>(i % static_cast<size_t>(ranks)) == me; };
  int workers = opt.workers > 0 ? opt.workers : workers_;
  if (workers <= 0 && ranks > 1)  // `loom launch` gives each rank its share of the cores
    if (const char* t = std::getenv("OMP_NUM_THREADS")) workers = std::atoi(t);
  if (workers <= 0) workers = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<InputShard> shards = plan_shards(input_paths_, reader_.format, files_per_shard_);

  // Run identity: the config (minus run-time knobs) and the shard list.
  Json run = Json::object();
  run["config"] = identity_;
  Json sl = Json::array();
  for (auto& s : shards) {
    Json f = Json::array();
    for (auto& p : s.files) f.push_back(p);
    sl.push_back(f);
  }
  run["shards"] = sl;
  std::string run_path = out_dir_ + "/run.json";
  if (opt.restart && me == 0) remove_all(out_dir_);
  c.barrier();
  if (file_exists(run_path)) {
    Json prev = Json::parse(read_file(run_path), run_path);
    LOOM_CHECK(prev.at("config").as_string() == identity_ && prev.at("shards").dump() == sl.dump(),
               out_dir_,
               " holds a run with a different config or input; use --restart to "
               "discard it or choose another output.dir");
    if (me == 0) log_info("curate: resuming the run in ", out_dir_);
  }
  c.barrier();  // every rank has read run.json before rank 0 rewrites it
  if (me == 0) {
    for (const char* d : {"kept", "rejected", "stats", "work"}) make_dirs(cat(out_dir_, "/", d));
    for (size_t seg = 0; seg + 1 < segments_.size(); ++seg) {
      make_dirs(cat(out_dir_, "/work/s", seg));
      make_dirs(cat(out_dir_, "/work/", stages_[segments_[seg + 1].begin].name));
    }
    remove_stale_temps(out_dir_);  // temporaries of a killed run are never outputs
    write_file_atomic(run_path, run.dump(1));
  }
  c.barrier();  // directories exist and no rank writes a temporary before the cleanup is over

  int64_t total_bytes = 0;
  for (auto& s : shards) total_bytes += static_cast<int64_t>(s.bytes);
  RunTotals this_run;
  this_run.workers = workers;
  this_run.ranks = ranks;
  this_run.prepare_seconds.assign(stages_.size(), 0);
  std::vector<std::vector<Json>> seg_stats(segments_.size(), std::vector<Json>(shards.size()));

  for (size_t seg = 0; seg < segments_.size(); ++seg) {
    bool last = seg + 1 == segments_.size();
    std::vector<std::string> in_files(shards.size());
    if (seg > 0) {
      for (size_t i = 0; i < shards.size(); ++i)
        in_files[i] = kept_path(static_cast<int>(i), false, seg - 1);
      const StageSpec& g = stages_[segments_[seg].begin];
      GlobalInput gi;
      gi.shard_files = in_files;
      gi.work_dir = cat(out_dir_, "/work/", g.name);
      gi.text_field = reader_.text_field;
      gi.id_field = reader_.id_field;
      gi.workers = workers;
      gi.comm = &c;
      gi.rank = me;
      gi.ranks = ranks;
      if (me == 0)
        log_info("curate: ", g.name, ": preparing over ", shards.size(), " shards",
                 ranks > 1 ? cat(" on ", ranks, " ranks") : std::string());
      double p0 = now_seconds();
      g.stage->prepare(gi);
      this_run.prepare_seconds[segments_[seg].begin] = now_seconds() - p0;
    }
    Progress progress;
    std::vector<size_t> todo;
    for (size_t i = 0; i < shards.size(); ++i) {
      if (!owns(i)) continue;
      ++progress.total_shards;
      std::string sp =
          cat(out_dir_, "/stats/s", seg, "-", shard_name(static_cast<int>(i)), ".json");
      if (file_exists(sp) && file_exists(kept_path(static_cast<int>(i), last, seg))) {
        seg_stats[seg][i] = Json::parse(read_file(sp), sp);
        ++progress.shards_done;
      } else {
        todo.push_back(i);
        progress.total_bytes += seg == 0 ? static_cast<int64_t>(shards[i].bytes) : 0;
      }
    }
    std::string label = ranks > 1 ? cat("segment ", seg, " rank ", me) : cat("segment ", seg);
    if (static_cast<int64_t>(todo.size()) < progress.total_shards)
      log_info("curate: ", label, ": ", progress.total_shards - static_cast<int64_t>(todo.size()),
               " shards already finished, ", todo.size(), " to run");
    {
      ProgressPrinter printer(progress, opt.progress_interval, label);
      parallel_for(todo.size(), workers, [&](size_t k) {
        size_t i = todo[k];
        seg_stats[seg][i] =
            run_shard(seg, shards[i], in_files[i], last, progress, opt.crash_after_docs).stats;
      });
    }
    // The run's rates are of its input: what segment 0 read. Later segments re-read the kept
    // documents from work/ (counted apart, in bytes_read).
    if (seg == 0) {
      this_run.docs += progress.docs;
      this_run.bytes += progress.bytes;
    }
    this_run.bytes_read += progress.bytes;
    this_run.shards += static_cast<int64_t>(todo.size());  // shard runs of every segment
  }

  if (ranks > 1) {
    // Rank 0 gathers every rank's shard stats and writes the report; the others get it back.
    // Times travel as microseconds: the ranks' CPU and prepare seconds add up.
    auto us = [](double sec) { return static_cast<int64_t>(sec * 1e6); };
    std::vector<int64_t> counts = {this_run.docs, this_run.bytes, this_run.shards,
                                   us(process_cpu_seconds() - cpu0), this_run.bytes_read};
    for (double p : this_run.prepare_seconds) counts.push_back(us(p));
    sum_i64(c, counts);
    this_run.docs = counts[0];
    this_run.bytes = counts[1];
    this_run.shards = counts[2];
    this_run.cpu_seconds = static_cast<double>(counts[3]) * 1e-6;
    this_run.bytes_read = counts[4];
    for (size_t i = 0; i < stages_.size(); ++i)
      this_run.prepare_seconds[i] = static_cast<double>(counts[5 + i]) * 1e-6;
    std::string mine;
    for (size_t seg = 0; seg < segments_.size(); ++seg)
      for (size_t i = 0; i < shards.size(); ++i)
        if (owns(i)) {
          Json e = Json::object();
          e["segment"] = static_cast<int64_t>(seg);
          e["shard"] = static_cast<int64_t>(i);
          e["stats"] = seg_stats[seg][i];
          mine += e.dump() + "\n";
        }
    auto all = gather_bytes(c, std::move(mine), 0);
    std::string report_json;
    if (me == 0) {
      for (auto& block : all)
        for (auto line : split_lines(block)) {
          if (line.empty()) continue;
          Json e = Json::parse(std::string(line), "rank stats");
          seg_stats[static_cast<size_t>(e.at("segment").as_int())]
                   [static_cast<size_t>(e.at("shard").as_int())] = e.at("stats");
        }
      this_run.seconds = now_seconds() - t0;
      report_json = make_report(seg_stats, shards.size(), total_bytes, this_run).dump(1);
    }
    report_json = broadcast_bytes(c, std::move(report_json), 0);
    return Json::parse(report_json, out_dir_ + "/report.json");
  }
  this_run.seconds = now_seconds() - t0;
  this_run.cpu_seconds = process_cpu_seconds() - cpu0;
  return make_report(seg_stats, shards.size(), total_bytes, this_run);
}

// Merges per-shard stats in shard order into the report and writes it.
Json Pipeline::make_report(const std::vector<std::vector<Json>>& seg_stats, size_t nshards,
                           int64_t total_bytes, const RunTotals& this_run) const {
  StageStats reader_total;
  std::vector<StageStats> totals(stages_.size());
  Json errors = Json::array();
  int64_t error_count = 0, kept = 0, rejected = 0, unread = 0, cut = 0;
  std::map<std::string, double> busy;  // seconds per stage name, "reader", "writer"
  for (size_t seg = 0; seg < segments_.size(); ++seg) {
    for (auto& js : seg_stats[seg]) {
      if (js.contains("stage_seconds"))  // absent in stats of shards run by older versions
        for (auto& [name, sec] : js.at("stage_seconds").as_object()) busy[name] += sec.as_double();
      if (seg == 0) reader_total.merge(StageStats::from_json(js.at("reader")));
      for (size_t s = segments_[seg].begin; s < segments_[seg].end; ++s)
        totals[s].merge(StageStats::from_json(js.at("stages").at(stages_[s].name)));
      error_count += js.at("error_count").as_int();
      if (js.contains("unread_bytes")) unread += js.at("unread_bytes").as_int();
      if (js.contains("stream_errors")) cut += js.at("stream_errors").as_int();
      for (auto& e : js.at("errors").as_array())
        if (errors.size() < 1000) errors.push_back(e);
      rejected += js.at("rejected").as_int();
      if (seg + 1 == segments_.size()) kept += js.at("kept").as_int();
    }
  }
  Json report = Json::object();
  Json in = Json::object();
  in["format"] = reader_.format;
  in["shards"] = static_cast<int64_t>(nshards);
  in["bytes"] = total_bytes;
  report["input"] = in;
  Json out = Json::object();
  out["dir"] = out_dir_;
  out["kept_docs"] = kept;
  out["rejected_docs"] = rejected;
  // Every document read is kept or rejected, never lost; and every input byte was read (into
  // a document, malformed input rejected with its reason, or a non-document WARC record)
  // unless a stream error cut a file short.
  out["all_docs_accounted"] = kept + rejected == reader_total.docs_in;
  out["unread_bytes"] = unread;
  out["stream_errors"] = cut;
  out["all_input_accounted"] = kept + rejected == reader_total.docs_in && unread == 0 && cut == 0;
  report["output"] = out;
  Json runj = Json::object();
  const double elapsed = std::max(1e-9, this_run.seconds);
  runj["seconds"] = this_run.seconds;
  runj["workers"] = this_run.workers;
  if (this_run.ranks > 1) runj["ranks"] = this_run.ranks;
  runj["shards_processed"] = this_run.shards;
  runj["docs_per_s"] = static_cast<double>(this_run.docs) / elapsed;
  runj["mb_per_s"] = static_cast<double>(this_run.bytes) / 1e6 / elapsed;
  // Per core: the input this run read over the CPU seconds of every thread (and rank) it used.
  runj["cpu_seconds"] = this_run.cpu_seconds;
  runj["mb_per_cpu_second"] =
      static_cast<double>(this_run.bytes) / 1e6 / std::max(1e-9, this_run.cpu_seconds);
  // Every segment's reads: the input, then the kept documents again from work/ per dedup stage.
  runj["bytes_read"] = this_run.bytes_read;
  report["run"] = runj;
  Json stages = Json::array();
  Json rj = reader_total.to_json();
  rj["name"] = "reader";
  rj["type"] = reader_.format;
  stages.push_back(rj);
  for (size_t s = 0; s < stages_.size(); ++s) {
    Json j = totals[s].to_json();
    j["name"] = stages_[s].name;
    j["type"] = stages_[s].type;
    stages.push_back(j);
  }
  report["stages"] = stages;
  // Where the time went: worker seconds per stage over all shards (resumed ones included, as
  // their stats recorded them) plus a global stage's prepare() in this run, and the MB/s of the
  // stage's own input per second of it.
  Json timing = Json::array();
  auto add_timing = [&](const std::string& name, int64_t bytes, double prepare) {
    Json t = Json::object();
    double sec = busy[name] + prepare;
    t["name"] = name;
    t["seconds"] = sec;
    if (prepare > 0) t["prepare_seconds"] = prepare;
    t["mb_per_s"] = static_cast<double>(bytes) / 1e6 / std::max(1e-9, sec);
    timing.push_back(t);
  };
  add_timing("reader", reader_total.bytes_in, 0);
  for (size_t s = 0; s < stages_.size(); ++s)
    add_timing(stages_[s].name, totals[s].bytes_in, this_run.prepare_seconds[s]);
  add_timing("writer", reader_total.bytes_in, 0);
  report["timing"] = timing;
  Json ej = Json::object();
  ej["count"] = error_count;
  ej["first"] = errors;
  report["errors"] = ej;
  write_file_atomic(out_dir_ + "/report.json", report.dump(1));
  write_file_atomic(out_dir_ + "/report.txt", report_text(report));
  write_file_atomic(out_dir_ + "/report.html", report_html(report));
  return report;
}

}  // namespace loom::curate
