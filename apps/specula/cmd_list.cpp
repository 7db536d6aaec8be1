// `specula list`: the models the Hugging Face cache holds (specula/hub.hpp), whoever downloaded them.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "command.hpp"
#include "specula/hub.hpp"

namespace {

namespace cli = specula::cli;
namespace hub = specula::core::hub;

int run_list(const std::vector<std::string>& args) {
  bool as_json = false;
  cli::po::options_description desc(
      "usage: specula list [--json]\n\n"
      "Lists the model repositories in the Hugging Face cache ($HF_HUB_CACHE, else $HF_HOME/hub, else\n"
      "~/.cache/huggingface/hub): size on disk, and per snapshot its commit, the revisions naming it and\n"
      "its file count. Repositories fetched by huggingface_hub appear too.\n\noptions");
  desc.add_options()("help,h", "show this help")("json", cli::po::bool_switch(&as_json), "print one JSON object");
  cli::add_log_options(desc);
  cli::po::variables_map vm;
  if (!cli::parse_args(args, desc, {}, vm)) return 0;

  const hub::Settings settings = hub::Settings::from_env();
  const auto repos = hub::list_cache(settings.cache_dir);
  if (as_json) {
    nlohmann::json j = {{"cache", settings.cache_dir.string()}, {"repos", nlohmann::json::array()}};
    for (const auto& r : repos) {
      nlohmann::json snaps = nlohmann::json::array();
      for (const auto& s : r.snapshots) snaps.push_back({{"commit", s.commit}, {"refs", s.refs}, {"files", s.files}});
      j["repos"].push_back({{"repo", r.repo}, {"path", r.dir.string()}, {"bytes", r.bytes},
                            {"incomplete_bytes", r.incomplete_bytes}, {"snapshots", snaps}});
    }
    fmt::print("{}\n", j.dump());
    return 0;
  }
  if (repos.empty()) {
    fmt::print("the cache {} holds no model (`specula pull OWNER/REPO` fetches one)\n", settings.cache_dir.string());
    return 0;
  }
  fmt::print("cache {}\n\n{:<48} {:>10}  {:<14} {:<20} {:>5}\n", settings.cache_dir.string(), "REPO", "SIZE", "COMMIT",
             "REVISIONS", "FILES");
  uint64_t total = 0;
  for (const auto& r : repos) {
    total += r.bytes;
    std::string size = hub::human_bytes(r.bytes);
    if (r.incomplete_bytes) size += fmt::format(" (+{} partial)", hub::human_bytes(r.incomplete_bytes));
    if (r.snapshots.empty()) fmt::print("{:<48} {:>10}  {:<14} {:<20} {:>5}\n", r.repo, size, "-", "-", 0);
    for (size_t i = 0; i < r.snapshots.size(); ++i) {
      const auto& s = r.snapshots[i];
      std::string refs;
      for (const auto& ref : s.refs) refs += (refs.empty() ? "" : ",") + ref;
      fmt::print("{:<48} {:>10}  {:<14} {:<20} {:>5}\n", i == 0 ? r.repo : "", i == 0 ? size : "",
                 s.commit.substr(0, 12), refs.empty() ? "-" : refs, s.files);
    }
  }
  fmt::print("\n{} repositor{}, {}\n", repos.size(), repos.size() == 1 ? "y" : "ies", hub::human_bytes(total));
  return 0;
}

}  // namespace

SPECULA_COMMAND("list", "the models in the Hugging Face cache (sizes, revisions)", run_list);
