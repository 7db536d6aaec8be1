// `specula plugins`: every plugin found (kind, name, version, file) and every candidate rejected.
#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "command.hpp"
#include "specula/core/version.hpp"
#include "specula/error.hpp"

namespace {

// `specula plugins --options NAME`: the schema of each kind the plugin provides.
int print_options(const specula::core::PluginHost& host, const std::string& name, bool as_json) {
  const auto* info = host.find(name);
  if (!info) {
    std::vector<std::string> names;
    for (const auto& p : host.plugins()) names.push_back(p.name);
    const std::string hint = specula::closest_match(name, names);
    specula::fail("no plugin named '{}'{}; `specula plugins` lists them", name,
                  hint.empty() ? std::string() : fmt::format(" (did you mean '{}'?)", hint));
  }
  nlohmann::json j = nlohmann::json::object();
  for (const auto& kind : info->kinds) {
    if (!specula::core::kind_takes_options(kind)) continue;  // format, converter: a pipeline has no options for these
    const specula::OptionSchema* schema = host.option_schema(name, kind);
    if (as_json) {
      if (!schema) {
        j[kind] = nullptr;
        continue;
      }
      j[kind] = nlohmann::json::array();
      for (const auto& o : *schema)
        j[kind].push_back({{"name", o.name}, {"type", specula::describe_option_type(o)}, {"default", o.default_value},
                           {"doc", o.doc}});
      continue;
    }
    const char* section = kind == "model" ? "target" : kind.c_str();
    fmt::print("{} plugin '{}' ({}.options):\n", kind, name, section);
    if (!schema) {
      fmt::print("  (no schema declared: the plugin checks its options itself)\n");
    } else if (schema->empty()) {
      fmt::print("  (no options)\n");
    }
    for (const auto& o : schema ? *schema : specula::OptionSchema{}) {
      fmt::print("  {:<18} {}{}\n", o.name, specula::describe_option_type(o),
                 o.default_value.is_null() ? std::string() : ", default " + o.default_value.dump());
      if (!o.doc.empty()) fmt::print("  {:<18} {}\n", "", o.doc);
    }
  }
  if (as_json) fmt::print("{}\n", j.dump(2));
  return 0;
}

int run_plugins(const std::vector<std::string>& args) {
  namespace cli = specula::cli;
  std::vector<std::string> plugin_paths;
  std::string pipeline;
  bool as_json = false;
  std::string options_of;
  cli::po::options_description desc(
      "usage: specula plugins [--plugin-path DIR]... [--pipeline PIPELINE.yaml] [--json]\n\n"
      "Lists the plugins found in the search path (--plugin-path, the pipeline's plugin_paths,\n"
      "SPECULA_PLUGIN_PATH, the build and install plugin directories, in that order) and every\n"
      "candidate library that was rejected, with the reason.\n\noptions");
  desc.add_options()("help,h", "show this help")(
      "plugin-path", cli::po::value(&plugin_paths)->composing(), "directory searched first (repeatable)")(
      "pipeline", cli::po::value(&pipeline), "also search the plugin_paths of this pipeline")(
      "json", cli::po::bool_switch(&as_json), "print JSON")(
      "options", cli::po::value(&options_of), "print the options plugin NAME takes (per kind: type, default, doc)");
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
  if (!options_of.empty()) return print_options(host, options_of, as_json);

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
  auto kinds_of = [](const specula::core::PluginInfo& pl) {
    std::string kinds;
    for (const auto& k : pl.kinds) kinds += (kinds.empty() ? "" : ",") + k;
    return kinds;
  };
  size_t width = 10;
  for (const auto& pl : host.plugins()) width = std::max(width, kinds_of(pl).size());
  for (const auto& pl : host.plugins()) {
    fmt::print("  {:<{}} {:<20} {:<8} {}\n", kinds_of(pl), width, pl.name, pl.version, pl.file.string());
    if (!pl.description.empty()) fmt::print("  {:<{}} {}\n", "", width, pl.description);
  }
  if (!host.rejected().empty()) {
    fmt::print("\nrejected ({}):\n", host.rejected().size());
    for (const auto& r : host.rejected()) fmt::print("  {}\n", r.reason);
  }
  return 0;
}

}  // namespace

SPECULA_COMMAND("plugins", "list the plugins found and the candidates rejected, with reasons", run_plugins);
