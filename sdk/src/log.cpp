#include "specula/log.hpp"

#include <atomic>
#include <cstdio>
#include <string>

#include "specula/plugin.hpp"

namespace specula {
namespace {
std::atomic<LogSink> g_sink{nullptr};
std::atomic<int> g_level{static_cast<int>(LogLevel::Info)};

const char* level_tag(LogLevel level) {
  switch (level) {
    case LogLevel::Debug: return "debug";
    case LogLevel::Info: return "info";
    case LogLevel::Warn: return "warning";
    case LogLevel::Error: return "error";
    default: return "";
  }
}
}  // namespace

void log_message(LogLevel level, std::string_view message) {
  std::string text(message);
  if (LogSink sink = g_sink.load()) {
    sink(level, text.c_str());
  } else {
    std::fprintf(stderr, "specula %s: %s\n", level_tag(level), text.c_str());
  }
}

bool log_enabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }
void set_log_sink(LogSink sink) { g_sink.store(sink); }
void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel log_level() { return static_cast<LogLevel>(g_level.load()); }

namespace detail {
void attach_host(const HostServices* host) {
  if (!host) return;
  set_log_sink(host->log_sink);
  set_log_level(host->log_level);
}
}  // namespace detail

}  // namespace specula
