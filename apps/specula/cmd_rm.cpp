// `specula rm`: delete a model repository from the Hugging Face cache (specula/hub.hpp).
#include <fmt/format.h>

#include "cli_common.hpp"
#include "command.hpp"
#include "specula/hub.hpp"
#include "specula/error.hpp"

namespace {

namespace cli = specula::cli;
namespace hub = specula::core::hub;

int run_rm(const std::vector<std::string>& args) {
  std::vector<std::string> repos;
  cli::po::options_description desc(
      "usage: specula rm OWNER/REPO [OWNER/REPO ...]\n\n"
      "Deletes each repository (every snapshot, revision and blob) from the Hugging Face cache\n"
      "($HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub); `specula list` shows what it\n"
      "holds. The id may also be written hf://OWNER/REPO.\n\noptions");
  desc.add_options()("help,h", "show this help")("repo", cli::po::value(&repos)->composing(), "repositories (positional)");
  cli::add_log_options(desc);
  cli::po::positional_options_description pos;
  pos.add("repo", -1);
  cli::po::variables_map vm;
  if (!cli::parse_args(args, desc, pos, vm)) return 0;
  if (repos.empty()) specula::fail("rm: give the repository to delete, e.g. `specula rm OWNER/REPO` (`specula list` shows them)");
  const hub::Settings settings = hub::Settings::from_env();
  for (const auto& repo : repos) {
    const uint64_t freed = hub::remove_repo(settings.cache_dir, repo);
    fmt::print("removed {} ({}) from {}\n", hub::parse_ref(repo, true).repo, hub::human_bytes(freed),
               settings.cache_dir.string());
  }
  return 0;
}

}  // namespace

SPECULA_COMMAND("rm", "delete a model from the Hugging Face cache (OWNER/REPO)", run_rm);
