// Levelled logging shared by the host and every plugin: plugins forward to the host's sink once the host
// has attached itself (see plugin.hpp), so -v / -q on the command line govern plugin output too.
#pragma once

#include <string_view>

#include <fmt/format.h>

namespace specula {

enum class LogLevel : int { Debug = 0, Info = 1, Warn = 2, Error = 3, Off = 4 };

using LogSink = void (*)(LogLevel level, const char* message);

void log_message(LogLevel level, std::string_view message);
bool log_enabled(LogLevel level);
// Host side: where messages go and which are shown.
void set_log_sink(LogSink sink);
void set_log_level(LogLevel level);
LogLevel log_level();

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (log_enabled(level)) log_message(level, fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void log_debug(fmt::format_string<Args...> f, Args&&... a) { log(LogLevel::Debug, f, std::forward<Args>(a)...); }
template <typename... Args>
void log_info(fmt::format_string<Args...> f, Args&&... a) { log(LogLevel::Info, f, std::forward<Args>(a)...); }
template <typename... Args>
void log_warn(fmt::format_string<Args...> f, Args&&... a) { log(LogLevel::Warn, f, std::forward<Args>(a)...); }

}  // namespace specula
