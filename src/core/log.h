// Terminal logging with a wall-clock prefix. Machine-readable metrics go through MetricsLog.
#pragma once

#include <cstdio>
#include <string>

#include "core/error.h"

namespace loom {

enum class LogLevel { Debug, Info, Warn, Error };
void set_log_level(LogLevel level);
void log_line(LogLevel level, const std::string& msg);

template <typename... Args>
void log_info(const Args&... a) {
  log_line(LogLevel::Info, cat(a...));
}
template <typename... Args>
void log_warn(const Args&... a) {
  log_line(LogLevel::Warn, cat(a...));
}
template <typename... Args>
void log_debug(const Args&... a) {
  log_line(LogLevel::Debug, cat(a...));
}

// Seconds since an arbitrary fixed point (steady clock).
double now_seconds();
// CPU seconds used by this process, all threads: a load-independent companion to wall time on
// a shared machine, where other processes steal the cores.
double process_cpu_seconds();

}  // namespace loom
