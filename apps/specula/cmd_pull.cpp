// `specula pull`: download a model from the Hugging Face Hub into the Hugging Face cache (specula/hub.hpp),
// so that a later `specula run --model hf://...` (or HF_HUB_OFFLINE=1) finds it there.
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_common.hpp"
#include "command.hpp"
#include "specula/hub.hpp"
#include "specula/error.hpp"

namespace {

namespace cli = specula::cli;
namespace hub = specula::core::hub;

nlohmann::json describe(const hub::Resolved& r) {
  return {{"id", r.ref.str()}, {"repo", r.ref.repo}, {"revision", r.ref.revision}, {"commit", r.commit},
          {"path", r.path.string()}, {"files", r.files}, {"bytes", r.bytes}, {"downloaded", r.downloaded}};
}

void print(const hub::Resolved& r) {
  fmt::print("{}: {} file{}, {} ({}), commit {}\n  {}\n", r.ref.str(), r.files.size(), r.files.size() == 1 ? "" : "s",
             hub::human_bytes(r.bytes), r.downloaded ? hub::human_bytes(r.downloaded) + " downloaded" : "all cached",
             r.commit.substr(0, 12), r.path.string());
}

int run_pull(const std::vector<std::string>& args) {
  std::string id;
  bool assistant = false, as_json = false;
  cli::po::options_description desc(
      "usage: specula pull OWNER/REPO[@REVISION][:FILE-or-QUANT] [--assistant] [--json]\n\n"
      "Downloads a model from the Hugging Face Hub into the Hugging Face cache ($HF_HUB_CACHE, else\n"
      "$HF_HOME/hub, else ~/.cache/huggingface/hub), laid out as huggingface_hub lays it out. The id may\n"
      "also be written hf://OWNER/REPO...; :QUANT picks a GGUF by quantization (Q4_K_M, q8_0, ...), :FILE\n"
      "one file. Without it: the safetensors checkpoint (config, tokenizer, weights), else the one GGUF.\n"
      "Interrupted downloads resume; every file is checked against the Hub's sha256 before use.\n"
      "Environment: HF_TOKEN (gated repositories), HF_ENDPOINT (a mirror), HF_HUB_CACHE, HF_HOME,\n"
      "HF_HUB_OFFLINE=1 (the cache only). Prints where the model is.\n\noptions");
  desc.add_options()("help,h", "show this help")("id", cli::po::value(&id), "the model id (positional)")(
      "assistant", cli::po::bool_switch(&assistant), "also pull the drafter OWNER/REPO-assistant (what --drafter auto uses)")(
      "json", cli::po::bool_switch(&as_json), "print one JSON object: id, commit, path, files, bytes, downloaded");
  cli::add_log_options(desc);
  cli::po::positional_options_description pos;
  pos.add("id", 1);
  cli::po::variables_map vm;
  if (!cli::parse_args(args, desc, pos, vm)) return 0;
  if (id.empty()) specula::fail("pull: give a model id, e.g. `specula pull ggml-org/gemma-4-E2B-it-GGUF:Q8_0` (see --help)");

  const hub::Settings settings = hub::Settings::from_env();
  const hub::ModelRef ref = hub::parse_ref(id, true);
  const hub::Resolved model = hub::resolve(ref, settings);
  std::optional<hub::Resolved> drafter;
  if (assistant) drafter = hub::resolve_assistant(ref, settings);
  if (as_json) {
    nlohmann::json j = describe(model);
    if (drafter) j["assistant"] = describe(*drafter);
    fmt::print("{}\n", j.dump());
    return 0;
  }
  print(model);
  if (drafter) print(*drafter);
  fmt::print("run it: specula run --model {}{}\n", model.ref.str(), drafter ? " --drafter auto" : "");
  return 0;
}

}  // namespace

SPECULA_COMMAND("pull", "download a model from the Hugging Face Hub into the HF cache (OWNER/REPO[:QUANT])", run_pull);
