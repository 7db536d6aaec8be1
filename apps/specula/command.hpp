// Subcommands of the `specula` CLI. Each cmd_<name>.cpp defines one Command and registers it with
// SPECULA_COMMAND; main() dispatches on the first argument.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace specula::cli {

struct Command {
  std::string name;
  std::string summary;  // one line for `specula --help`
  // Receives the arguments after the subcommand name; returns the process exit code.
  std::function<int(const std::vector<std::string>& args)> run;
};

std::vector<Command>& commands();

struct Registrar {
  explicit Registrar(Command c) { commands().push_back(std::move(c)); }
};

}  // namespace specula::cli

#define SPECULA_COMMAND_CAT2(a, b) a##b
#define SPECULA_COMMAND_CAT(a, b) SPECULA_COMMAND_CAT2(a, b)
#define SPECULA_COMMAND(...) \
  static const ::specula::cli::Registrar SPECULA_COMMAND_CAT(specula_command_, __LINE__){::specula::cli::Command{__VA_ARGS__}}
