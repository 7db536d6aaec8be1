// Helpers shared by the CLI subcommands: logging flags, the model/pipeline flags, sampling flags, and
// turning them into loaded host objects. A typical command:
//
//   SPECULA_COMMAND("mycmd", "one line", [](const std::vector<std::string>& args) {
//     namespace po = boost::program_options;
//     specula::cli::ModelArgs model;
//     po::options_description desc("specula mycmd [PIPELINE.yaml] [options]");
//     desc.add_options()("help,h", "show this help");
//     specula::cli::add_log_options(desc);
//     specula::cli::add_model_options(desc, model);
//     specula::cli::add_sampling_options(desc, model);
//     po::positional_options_description pos;
//     pos.add("pipeline", 1);
//     po::variables_map vm;
//     if (!specula::cli::parse_args(args, desc, pos, vm)) return 0;   // printed --help
//     specula::cli::Session s = specula::cli::open_session(model);
//     // s.pipeline (the resolved config), s.host, s.built.{backend,target,drafter,sampler}
//   });
//
// Every function throws specula::Error with a message for people; main() prints it and exits 1.
#pragma once

#include <atomic>
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

// Where the model comes from: a pipeline YAML, a model file or directory in its place (run with the
// default pipeline: backend cpu, sampler standard), or --model without one. Every flag that sets a
// pipeline key becomes a core::Override, so it passes the same checks as the YAML key (range, type,
// plugin option schema) and errors name the flag.
struct ModelArgs {
  std::string pipeline;                    // PIPELINE.yaml or a model path ("" = none); also the first positional
  std::vector<core::Override> overrides;   // the pipeline keys the flags set
  std::vector<std::string> plugin_paths;   // --plugin-path DIR (repeatable): searched first
};
// Adds --pipeline, -m/--model, -b/--backend, --drafter, --sampler, --plugin-path, -c/--ctx-size
// (--context-length), --draft-max (--draft-tokens), --mtp-convention, -t/--threads. Add the positional yourself
// (`pos.add("pipeline", 1)`) if the command takes one.
void add_model_options(po::options_description& desc, ModelArgs& args);

// Sampling flags, named as llama.cpp names them: --temp (--temperature), --top-k, --top-p, --min-p,
// --repeat-penalty, --seed (-1 = random), -n/--n-predict (--max-tokens).
void add_sampling_options(po::options_description& desc, ModelArgs& args);

// What every command that runs a model does with its flags: adds the model options (with `sampling`, the
// sampling options too) and the log options to `desc`, takes the pipeline as the first positional
// argument, parses, and turns --system (for a command that declares it) into the chat.system override.
// Returns false after --help.
bool parse_model_command(const std::vector<std::string>& args, po::options_description& desc, ModelArgs& model,
                         po::variables_map& vm, bool sampling = true);

// The pipeline the flags describe: the YAML (if any) with the flag overrides applied and checked.
// Throws when neither a pipeline nor a model was given.
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
// resolve_pipeline + make_host + build_pipeline; logs the seed when it was drawn at random.
Session open_session(const ModelArgs& args, bool load_drafter = true);

// The whole file as text; throws naming `flag` and the path.
std::string read_text_file(const std::string& path, const std::string& flag);

// Ctrl+C: the first SIGINT sets interrupt_flag() (the Generator stops at the next token, the command
// prints what it has); a second one exits at once with status 130. Commands that continue after an
// interruption (chat) call clear_interrupt().
void install_interrupt_handler();
const std::atomic<bool>* interrupt_flag();
void clear_interrupt();

// "1,2,3" or "1 2 3" -> ids. Throws naming the bad entry.
std::vector<int32_t> parse_token_list(const std::string& text);

}  // namespace specula::cli
