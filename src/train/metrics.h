// Machine-readable metrics: one JSON object per line, flushed as written, so a crashed run's
// log is complete up to its last step and any tool (jq, pandas) can read it; and, optionally,
// the same numbers as TensorBoard scalars.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "core/json.h"
#include "core/tfevents.h"

namespace loom {

class MetricsLog {
 public:
  MetricsLog() = default;
  // append=true continues an existing log (resume); otherwise starts a new one. With a
  // tensorboard_dir, every numeric field of a record that has a "step" is also a scalar of
  // that name in a new event file there.
  // keep_through_step >= 0 (a resume from that step): rows of later steps, written before a
  // crash, are dropped first (and a cut last line), so readers see one row per step.
  MetricsLog(const std::string& path, bool append, const std::string& tensorboard_dir = "",
             int64_t keep_through_step = -1);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  void write(const Json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  FILE* f_ = nullptr;
  std::unique_ptr<TfEventsWriter> tensorboard_;
};

}  // namespace loom
