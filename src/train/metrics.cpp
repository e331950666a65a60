#include "train/metrics.h"

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace loom {

MetricsLog::MetricsLog(const std::string& path, bool append) : path_(path) {
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  LOOM_CHECK(f_, path, ": cannot open metrics log (", std::strerror(errno), ")");
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

void MetricsLog::write(const Json& record) {
  if (!f_) return;
  std::string line = record.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), f_);
  std::fflush(f_);
}

}  // namespace loom
