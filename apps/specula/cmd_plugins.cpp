// `specula plugins`: every plugin found (kind, name, version, file) and every candidate rejected.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "command.hpp"
#include "specula/core/version.hpp"

namespace {

int run_plugins(const std::vector<std::string>& args) {
  namespace cli = specula::cli;
  std::vector<std::string> plugin_paths;
  std::string pipeline;
  bool as_json = false;
  cli::po::options_description desc(
      "usage: specula plugins [--plugin-path DIR]... [--pipeline PIPELINE.yaml] [--json]\n\n"
      "Lists the plugins found in the search path (--plugin-path, the pipeline's plugin_paths,\n"
      "SPECULA_PLUGIN_PATH, the build and install plugin directories, in that order) and every\n"
      "candidate library that was rejected, with the reason.\n\noptions");
  desc.add_options()("help,h", "show this help")(
      "plugin-path", cli::po::value(&plugin_paths)->composing(), "directory searched first (repeatable)")(
      "pipeline", cli::po::value(&pipeline), "also search the plugin_paths of this pipeline")(
      "json", cli::po::bool_switch(&as_json), "print JSON");
  cli::add_log_options(desc);
  cli::po::positional_options_description pos;
  cli::po::variables_map vm;
  if (!cli::parse_args(args, desc, pos, vm)) return 0;

  specula::core::Pipeline p;
  if (!pipeline.empty()) p = specula::core::load_pipeline(pipeline);
  std::vector<std::filesystem::path> first(plugin_paths.begin(), plugin_paths.end());
  first.insert(first.end(), p.plugin_paths.begin(), p.plugin_paths.end());
  const auto search = specula::core::plugin_search_path(first);
  specula::core::PluginHost host;
  host.discover(search);

  if (as_json) {
    nlohmann::json j;
    j["abi_version"] = specula::core::plugin_abi_version();
    j["fingerprint"] = specula::core::abi_fingerprint();
    j["search_path"] = nlohmann::json::array();
    for (const auto& d : search) j["search_path"].push_back(d.string());
    j["plugins"] = nlohmann::json::array();
    for (const auto& pl : host.plugins()) {
      j["plugins"].push_back({{"name", pl.name}, {"kinds", pl.kinds}, {"version", pl.version},
                              {"description", pl.description}, {"file", pl.file.string()}});
    }
    j["rejected"] = nlohmann::json::array();
    for (const auto& r : host.rejected()) j["rejected"].push_back({{"file", r.file.string()}, {"reason", r.reason}});
    fmt::print("{}\n", j.dump(2));
    return 0;
  }
  fmt::print("plugin ABI {} ({})\nsearch path:\n", specula::core::plugin_abi_version(), specula::core::abi_fingerprint());
  for (const auto& d : search) fmt::print("  {}\n", d.string());
  fmt::print("\nplugins ({}):\n", host.plugins().size());
  for (const auto& pl : host.plugins()) {
    std::string kinds;
    for (const auto& k : pl.kinds) kinds += (kinds.empty() ? "" : ",") + k;
    fmt::print("  {:<10} {:<20} {:<8} {}\n", kinds, pl.name, pl.version, pl.file.string());
    if (!pl.description.empty()) fmt::print("  {:<10} {}\n", "", pl.description);
  }
  if (!host.rejected().empty()) {
    fmt::print("\nrejected ({}):\n", host.rejected().size());
    for (const auto& r : host.rejected()) fmt::print("  {}\n", r.reason);
  }
  return 0;
}

}  // namespace

SPECULA_COMMAND("plugins", "list the plugins found and the candidates rejected, with reasons", run_plugins);
