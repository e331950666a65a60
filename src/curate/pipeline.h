// The curation pipeline: a reader, then stages in config order, run over input shards by N
// worker threads, streaming one document at a time. Deduplication stages are global (they
// must see every document first), so they split the stage list into segments: each segment
// runs over all shards and hands its kept documents to the next through work/ files.
//
// Output directory:
//   kept/shard-NNNNN.jsonl[.zst]          documents that passed every stage
//   rejected/shard-NNNNN.sK.jsonl[.zst]   documents removed in segment K, with stage and reason
//   stats/sK-shard-NNNNN.json             per-shard stats; its presence marks the shard done
//   work/                                 intermediate shards and dedup signatures
//   report.json, report.txt, report.html  per-stage docs/bytes in and out, reasons, histograms
//   run.json                              what was run (config, shards): resume must match it
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/json.h"
#include "curate/readers.h"
#include "curate/stage.h"

namespace loom {

namespace comm {
class Communicator;
}

namespace curate {

struct Progress;

// Several ranks (mpirun, `loom launch`): shard i belongs to rank i % ranks, which reads it and
// writes its kept/rejected/stats outputs (the output directory is shared); dedup stages decide
// together (dedup_dist.h) with the same results as one process; rank 0 writes run.json and the
// report from every rank's shard stats.
struct RunOptions {
  int workers = 0;                     // 0: from the config (pipeline.workers), else all cores
  bool restart = false;                // discard a previous run in the output directory
  double progress_interval = 5;        // seconds between progress lines; <= 0 for none
  int64_t crash_after_docs = -1;       // testing: _exit after this many documents (simulated kill)
  comm::Communicator* comm = nullptr;  // the ranks of the run; null: comm::world()
};

struct StageSpec {
  std::string name, type;
  std::unique_ptr<Stage> stage;
};

class Pipeline {
 public:
  // Reads every setting (input.*, output.*, pipeline.*, stage.N.*) and fails on unknown keys.
  explicit Pipeline(const Config& cfg);
  // Runs (or resumes) the pipeline and returns the report, also written to the output dir.
  Json run(const RunOptions& opt);

  const std::vector<StageSpec>& stages() const { return stages_; }
  const std::string& out_dir() const { return out_dir_; }

 private:
  struct Segment {
    size_t begin, end;  // stage indices [begin, end)
  };
  struct ShardResult;
  ShardResult run_shard(size_t seg, const InputShard& shard, const std::string& in_file, bool last,
                        Progress& progress, int64_t crash_after);
  // What this run (not the resumed part before it) did, summed over ranks.
  struct RunTotals {
    double seconds = 0, cpu_seconds = 0;
    int workers = 1, ranks = 1;
    int64_t shards = 0, docs = 0, bytes = 0;  // of the input (segment 0)
    int64_t bytes_read = 0;                   // by every segment, work/ files included
    std::vector<double> prepare_seconds;      // per stage: a global stage's prepare()
  };
  Json make_report(const std::vector<std::vector<Json>>& seg_stats, size_t shards,
                   int64_t total_bytes, const RunTotals& this_run) const;
  std::string kept_path(int shard, bool last, size_t seg) const;

  ReaderOptions reader_;
  std::vector<std::string> input_paths_;
  int files_per_shard_ = 1000;
  std::string out_dir_;
  bool zstd_ = false;
  int zstd_level_ = 3;
  int workers_ = 0;
  std::vector<StageSpec> stages_;
  std::vector<Segment> segments_;
  std::string identity_;  // config minus run-time knobs: a resumed run must match it
};

// Report rendering (report.cpp).
std::string report_text(const Json& report);
std::string report_html(const Json& report);

}  // namespace curate
}  // namespace loom
