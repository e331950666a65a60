#include "train/metrics.h"

#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "core/fs.h"

namespace loom {

MetricsLog::MetricsLog(const std::string& path, bool append, const std::string& tensorboard_dir,
                       int64_t keep_through_step)
    : path_(path) {
  if (append && keep_through_step >= 0 && file_exists(path)) {
    const std::string old = read_file(path);
    std::string kept;
    for (size_t pos = 0; pos < old.size();) {
      size_t end = old.find('\n', pos);
      if (end == std::string::npos) break;  // a cut last line
      const std::string line = old.substr(pos, end - pos);
      pos = end + 1;
      try {
        const Json j = Json::parse(line, path);
        if (j.is_object() && j.contains("step") && j.at("step").as_int() > keep_through_step)
          continue;
      } catch (const Error&) {
        continue;  // not a record (a torn write)
      }
      kept += line + "\n";
    }
    write_file_atomic(path, kept);
  }
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
  // A record that cannot be written (a full disk) stops the run, as the TensorBoard writer
  // does: training on with its metrics lost would leave a run nobody can judge.
  LOOM_CHECK(std::fwrite(line.data(), 1, line.size(), f_) == line.size() && std::fflush(f_) == 0,
             path_, ": cannot write the metrics log (", std::strerror(errno),
             "): stopping the run rather than training on without its metrics");
  if (!tensorboard_ || !record.contains("step")) return;
  std::vector<std::pair<std::string, double>> scalars;
  for (auto& [name, v] : record.as_object())
    if (name != "step" && v.is_number()) scalars.emplace_back(name, v.as_double());
  double wall =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  tensorboard_->scalars(record.at("step").as_int(), wall, scalars);
}

}  // namespace loom
