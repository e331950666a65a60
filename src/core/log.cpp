#include "core/log.h"

#include <chrono>
#include <ctime>
#include <mutex>

namespace loom {

static LogLevel g_level = LogLevel::Info;
static std::mutex g_mu;

void set_log_level(LogLevel level) {
  g_level = level;
}

void log_line(LogLevel level, const std::string& msg) {
  if (level < g_level) return;
  static const char* tags[] = {"debug", "info", "warn", "error"};
  std::time_t t = std::time(nullptr);
  char ts[32];
  std::strftime(ts, sizeof ts, "%H:%M:%S", std::localtime(&t));
  std::lock_guard<std::mutex> lock(g_mu);
  FILE* out = level >= LogLevel::Warn ? stderr : stdout;
  std::fprintf(out, "[%s %s] %s\n", ts, tags[static_cast<int>(level)], msg.c_str());
  std::fflush(out);
}

double now_seconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

}  // namespace loom
