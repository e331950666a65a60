// Per-stage counts for the report: documents and bytes in and out, rejection reasons,
// free-form counters (PII found, lines dropped) and fixed-bin score histograms. Stats of one
// shard are saved with its outputs and merged in shard order for the run's report.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/json.h"

namespace loom::curate {

struct Histogram {
  double lo = 0, hi = 1;
  std::vector<int64_t> bins;  // kBins equal-width bins over [lo, hi]; values outside clamp
  int64_t count = 0;
  double sum = 0;
  static constexpr int kBins = 20;

  void add(double v);
  void merge(const Histogram& o);
  Json to_json() const;
  static Histogram from_json(const Json& j);
};

struct StageStats {
  int64_t docs_in = 0, docs_out = 0, bytes_in = 0, bytes_out = 0;
  std::map<std::string, int64_t> reasons;
  std::map<std::string, int64_t> counters;
  std::map<std::string, Histogram> histograms;

  void merge(const StageStats& o);
  Json to_json() const;
  static StageStats from_json(const Json& j);
};

}  // namespace loom::curate
