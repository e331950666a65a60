// A pipeline stage: reads and may rewrite a document, then keeps it or names why not.
// Stages are shared by all worker threads, so process() must not touch mutable members;
// per-call state lives on the stack and per-shard counts go to the context's stats.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/config_int32.h"
#include "core/error.h"
#include "curate/document.h"
#include "curate/stats.h"

namespace loom::comm {
class Communicator;
}

namespace loom::curate {

struct StageContext {
  StageStats* stats = nullptr;
  int shard = 0;
  int64_t doc_index = 0;  // position of the document in this segment's input shard

  void score(const std::string& name, double v, double lo, double hi) {
    auto& h = stats->histograms[name];
    if (h.bins.empty()) {
      h.lo = lo;
      h.hi = hi;
    }
    h.add(v);
  }
  void count(const std::string& name, int64_t n = 1) { stats->counters[name] += n; }
};

// What a global stage (deduplication) sees before its segment runs: every shard the previous
// segment produced, in order. In a run over several ranks, shard i belongs to rank
// i % ranks: a rank reads only its own shards and the stage decides with the others through
// `comm`; with one rank (comm null or of size 1) it decides alone.
struct GlobalInput {
  std::vector<std::string> shard_files;  // JSONL
  std::string work_dir;                  // for the stage's resumable intermediate files
  std::string text_field, id_field;
  int workers = 1;
  comm::Communicator* comm = nullptr;
  int rank = 0, ranks = 1;
  bool owns(size_t shard) const {
    return static_cast<int>(shard % static_cast<size_t>(ranks)) == rank;
  }
  bool distributed() const { return ranks > 1; }
};

// The reference implementations that the stages' fast paths are checked against
// (tests/curate, `bench_curate --web 1`): the same outputs, slower. Process-wide; set it
// between runs, not during one.
void set_reference_paths(bool on);
bool reference_paths();

class Stage {
 public:
  virtual ~Stage() = default;
  // Returns an empty string to keep the document, otherwise the rule that rejected it.
  virtual std::string process(Doc& doc, StageContext& ctx) const = 0;
  // Global stages need all documents before they can decide on any one (dedup); the
  // pipeline runs prepare() over the shards of the previous segment first.
  virtual bool global() const { return false; }
  virtual void prepare(const GlobalInput& in) {}
};

// Reads "stage.N.<key>" settings; every key read is marked used for Config::check_all_used.
class StageParams {
 public:
  StageParams(const Config& cfg, std::string prefix) : cfg_(cfg), prefix_(std::move(prefix)) {}
  std::string get_string(const std::string& k, const std::string& def) const {
    return cfg_.get_string(key(k), def);
  }
  // Numbers always come with their range: a value outside [lo, hi] is an error naming the key
  // and the file and line that set it (a stage never sees a silently narrowed setting).
  int64_t get_int(const std::string& k, int64_t def, int64_t lo, int64_t hi) const {
    return cfg_.get_int(key(k), def, lo, hi);
  }
  int get_int32(const std::string& k, int def, int lo, int hi) const {
    return loom::get_int32(cfg_, key(k), def, lo, hi);
  }
  double get_double(const std::string& k, double def, double lo, double hi) const {
    return cfg_.get_double(key(k), def, lo, hi);
  }
  bool get_bool(const std::string& k, bool def) const { return cfg_.get_bool(key(k), def); }
  // A list written as a JSON array of strings: languages = ["en", "de"].
  std::vector<std::string> get_list(const std::string& k,
                                    const std::vector<std::string>& def) const;
  bool has(const std::string& k) const { return cfg_.has(key(k)); }
  std::string key(const std::string& k) const { return prefix_ + "." + k; }
  // "file:line: 'stage.N.k'" for a stage's own checks of a value it read (or just the key when
  // the default was used).
  std::string where(const std::string& k) const {
    const std::string w = cfg_.where(key(k));
    return w.empty() ? cat("'", key(k), "'") : cat(w, ": '", key(k), "'");
  }

 private:
  const Config& cfg_;
  std::string prefix_;
};

std::vector<std::string> parse_string_list(const std::string& text, const std::string& where);

// Builds a stage of the given type ("clean", "gopher_quality", ...); throws naming the key for
// an unknown type.
std::unique_ptr<Stage> make_stage(const std::string& type, const StageParams& params);
std::vector<std::string> stage_types();

}  // namespace loom::curate
