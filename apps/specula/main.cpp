#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "command.hpp"
#include "specula/error.hpp"
#include "specula/log.hpp"

namespace specula::cli {
std::vector<Command>& commands() {
  static std::vector<Command> all;
  return all;
}
}  // namespace specula::cli

namespace {
void print_usage() {
  auto cmds = specula::cli::commands();
  std::sort(cmds.begin(), cmds.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  fmt::print("usage: specula <command> [options]\n\ncommands:\n");
  for (const auto& c : cmds) fmt::print("  {:<10} {}\n", c.name, c.summary);
  fmt::print("\n`specula <command> --help` or `specula help <command>` describes a command's options;\n"
             "`specula --version` prints the version.\n"
             "-v / -q before or after the command: debug logging / warnings only.\n");
}
}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  // Global log flags before the command: `specula -v run ...`.
  while (!args.empty() && (args[0] == "-v" || args[0] == "--verbose" || args[0] == "-q" || args[0] == "--quiet")) {
    bool verbose = args[0] == "-v" || args[0] == "--verbose";
    specula::set_log_level(verbose ? specula::LogLevel::Debug : specula::LogLevel::Warn);
    args.erase(args.begin());
  }
  if (!args.empty() && (args[0] == "--version" || args[0] == "-V")) args = {"version"};
  if (args.size() >= 2 && args[0] == "help") args = {args[1], "--help"};  // `specula help run`
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    print_usage();
    return args.empty() ? 2 : 0;
  }
  for (const auto& c : specula::cli::commands()) {
    if (c.name != args[0]) continue;
    int status = 1;
    try {
      status = c.run(std::vector<std::string>(args.begin() + 1, args.end()));
    } catch (const std::exception& e) {
      std::fflush(stdout);
      std::fputs(fmt::format("specula {}: error: {}\n", c.name, e.what()).c_str(), stderr);  // never throws
      return 1;
    }
    // A full disk or a closed pipe must not look like success (`specula run ... > /dev/full`).
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
      std::fputs(fmt::format("specula {}: error: writing to stdout failed: {}\n", c.name, std::strerror(errno)).c_str(), stderr);
      return 1;
    }
    return status;
  }
  fmt::print(stderr, "specula: unknown command '{}'. Run `specula --help` for the list.\n", args[0]);
  return 2;
}
