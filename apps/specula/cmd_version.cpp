#include <fmt/format.h>

#include "command.hpp"
#include "specula/core/version.hpp"

SPECULA_COMMAND("version", "print the version and plugin ABI of this build", [](const std::vector<std::string>& args) {
  if (!args.empty() && (args[0] == "--help" || args[0] == "-h")) {
    fmt::print("usage: specula version\n\nPrints the Specula version, the plugin ABI version and the ABI fingerprint\n"
               "(compiler/standard library/C++ standard) that plugins must match.\n");
    return 0;
  }
  fmt::print("specula {}\nplugin ABI {}\nABI fingerprint {}\n", specula::core::version(),
             specula::core::plugin_abi_version(), specula::core::abi_fingerprint());
  return 0;
});
