#include "train/metrics.h"

#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/error.h"

namespace loom {

MetricsLog::MetricsLog(const std::string& path, bool append, const std::string& tensorboard_dir)
    : path_(path) {
  f_ = std::fopen(path.c_str(), append ? "a" : "w");
  LOOM_CHECK(f_, path, ": cannot open metrics log (", std::strerror(errno), ")");
  if (!tensorboard_dir.empty()) tensorboard_ = std::make_unique<TfEventsWriter>(tensorboard_dir);
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);
}

void MetricsLog::write(const Json& record) {
  if (!f_) return;
  std::string line = record.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), f_);
  std::fflush(f_);
  if (!tensorboard_ || !record.contains("step")) return;
  std::vector<std::pair<std::string, double>> scalars;
  for (auto& [name, v] : record.as_object())
    if (name != "step" && v.is_number()) scalars.emplace_back(name, v.as_double());
  double wall =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  tensorboard_->scalars(record.at("step").as_int(), wall, scalars);
}

}  // namespace loom
