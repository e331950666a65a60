// Machine-readable metrics: one JSON object per line, flushed as written, so a crashed run's
// log is complete up to its last step and any tool (jq, pandas) can read it.
#pragma once

#include <cstdio>
#include <string>

#include "core/json.h"

namespace loom {

class MetricsLog {
 public:
  MetricsLog() = default;
  // append=true continues an existing log (resume); otherwise starts a new one.
  MetricsLog(const std::string& path, bool append);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  void write(const Json& record);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  FILE* f_ = nullptr;
};

}  // namespace loom
