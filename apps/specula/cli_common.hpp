// Helpers shared by the CLI subcommands: logging flags, the model/pipeline flags, sampling flags, and
// turning them into loaded host objects. A typical command:
//
//   SPECULA_COMMAND("mycmd", "one line", [](const std::vector<std::string>& args) {
//     namespace po = boost::program_options;
//     specula::cli::ModelArgs model;
//     specula::cli::SamplingArgs sampling;
//     po::options_description desc("specula mycmd [PIPELINE.yaml] [options]");
//     desc.add_options()("help,h", "show this help");
//     specula::cli::add_log_options(desc);
//     specula::cli::add_model_options(desc, model);
//     specula::cli::add_sampling_options(desc, sampling);
//     po::positional_options_description pos;
//     pos.add("pipeline", 1);
//     po::variables_map vm;
//     if (!specula::cli::parse_args(args, desc, pos, vm)) return 0;   // printed --help
//     specula::cli::Session s = specula::cli::open_session(model, &sampling);
//     // s.pipeline (the resolved config), s.host, s.built.{backend,target,drafter,sampler}
//   });
//
// Every function throws specula::Error with a message for people; main() prints it and exits 1.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/program_options.hpp>

#include "specula/core/pipeline.hpp"
#include "specula/core/plugin_host.hpp"

namespace specula::cli {

namespace po = boost::program_options;

// Parses `args` with `desc` (and positional `pos`). Prints `desc` and returns false on --help/-h;
// applies -v/-q when add_log_options was used. Throws specula::Error on a bad flag.
bool parse_args(const std::vector<std::string>& args, const po::options_description& desc,
                const po::positional_options_description& pos, po::variables_map& vm);

// -v/--verbose (debug messages) and -q/--quiet (warnings and errors only).
void add_log_options(po::options_description& desc);
void apply_log_options(const po::variables_map& vm);

// Where the model comes from: a pipeline YAML, or --model (+ --backend, --drafter) without one.
// Flags given together with a pipeline override its values.
struct ModelArgs {
  std::string pipeline;                    // PIPELINE.yaml ("" = none); also the first positional
  std::string model;                       // --model PATH: target checkpoint
  std::string backend;                     // --backend NAME (default onednn without a pipeline)
  std::string drafter;                     // --drafter PATH: speculative drafter checkpoint
  std::string sampler;                     // --sampler NAME: sampler plugin (default standard)
  std::vector<std::string> plugin_paths;   // --plugin-path DIR (repeatable): searched first
  int64_t context_length = 0;              // --context-length N (0 = pipeline's or model's)
  int draft_tokens = 0;                    // --draft-tokens N (0 = pipeline's, default 3)
};
// Adds --pipeline, --model, --backend, --drafter, --sampler, --plugin-path, --context-length,
// --draft-tokens. Add the positional yourself (`pos.add("pipeline", 1)`) if the command takes one.
void add_model_options(po::options_description& desc, ModelArgs& args);

// Sampling flags: --temperature, --top-k, --top-p, --repeat-penalty, --seed, --max-tokens.
struct SamplingArgs {
  std::optional<float> temperature;
  std::optional<int32_t> top_k;
  std::optional<float> top_p;
  std::optional<float> repeat_penalty;
  std::optional<uint64_t> seed;
  std::optional<int> max_tokens;
};
void add_sampling_options(po::options_description& desc, SamplingArgs& args);
// Copies the flags that were given into the pipeline's sampler section.
void apply_sampling_args(const SamplingArgs& args, core::SamplerConfig& sampler);

// The pipeline the flags describe: the YAML (if any) with flag overrides applied. Throws when
// neither a pipeline nor --model was given.
core::Pipeline resolve_pipeline(const ModelArgs& args);

// A plugin host that has scanned --plugin-path dirs, then the pipeline's plugin_paths, then
// SPECULA_PLUGIN_PATH and the build/install plugin directories.
std::unique_ptr<core::PluginHost> make_host(const core::Pipeline& pipeline, const std::vector<std::string>& plugin_paths);

// Everything a command needs to generate.
struct Session {
  core::Pipeline pipeline;                 // resolved configuration
  std::unique_ptr<core::PluginHost> host;
  core::BuiltPipeline built;               // backend, target (file + model), drafter, sampler
};
// resolve_pipeline + make_host + build_pipeline. `sampling` (optional) overrides the sampler section.
Session open_session(const ModelArgs& args, const SamplingArgs* sampling = nullptr, bool load_drafter = true);

// "1,2,3" or "1 2 3" -> ids. Throws naming the bad entry.
std::vector<int32_t> parse_token_list(const std::string& text);

}  // namespace specula::cli
