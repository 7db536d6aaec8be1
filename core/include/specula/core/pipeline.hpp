// The YAML pipeline: which plugins to load and how to wire them (docs/pipeline-yaml.md is the schema).
//
//   plugin_paths: [plugins]            # optional, relative to this file
//   backend: {plugin: cpu, options: {threads: 2}}
//   target:  {model: models/gemma4.gguf, context_length: 4096}
//   drafter: {model: models/assistant.gguf, draft_tokens: 3}       # optional
//   sampler: {plugin: standard, temperature: 0.7, top_k: 40, seed: 1, max_tokens: 256}
//   chat:    {system: "You are terse.", enable_thinking: false}
//
// Parsing checks every key and type and throws specula::Error as "FILE:LINE:COL: ..." naming the key
// (and the closest valid key for a typo). Paths resolve relative to the YAML file; ${VAR} and
// ${VAR:-default} expand from the environment in every string value.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "specula/core/generator.hpp"
#include "specula/model.hpp"
#include "specula/options.hpp"
#include "specula/sampler.hpp"

namespace specula::core {

class PluginHost;

struct BackendConfig {
  std::string plugin = "cpu";
  nlohmann::json options = nlohmann::json::object();
  OptionLocations options_at;          // where each option was written, for the host's schema check
};

// drafter.model: auto (--drafter auto): the -assistant repository of an hf:// target (specula/hub.hpp).
inline constexpr const char* kAutoDrafter = "auto";

struct TargetConfig {
  std::filesystem::path model;         // required: GGUF file, safetensors directory or hf:// id (core/model_ref.hpp)
  std::string format;                  // format plugin; "" = the first whose can_open accepts the file
  std::string plugin;                  // model plugin; "" = the first whose loader accepts the file
  std::string lm_head;                 // lm_head plugin; "" = the standard head (specula/lm_head.hpp)
  std::string attention;               // attention plugin; "" = the standard one (specula/attention.hpp)
  int64_t context_length = 0;          // 0 = the model's own
  nlohmann::json options = nlohmann::json::object();
  OptionLocations options_at;
};

struct DrafterConfig {
  std::filesystem::path model;         // required when the section is present; a path, an hf:// id or kAutoDrafter
  std::string format;
  std::string plugin;                  // drafter plugin; "" = the first whose loader accepts the file
  std::string lm_head;                 // lm_head plugin; "" = the standard head
  std::string attention;               // attention plugin; "" = the standard one
  int draft_tokens = 3;                // tokens proposed per speculative step (the first, with draft_auto)
  bool draft_auto = false;             // draft_tokens: auto: the length per step from measured costs
  int draft_max = 8;                   // the longest draft_auto may choose
  DraftConvention convention = DraftConvention::Specula;  // convention: specula | llamacpp
  nlohmann::json options = nlohmann::json::object();
  OptionLocations options_at;
};

struct SamplerConfig {
  std::string plugin = "standard";
  SamplingParams params;               // temperature, top_k, top_p, repetition_penalty, ... seed
  int max_tokens = 256;                // generation limit per reply
  std::vector<std::string> stop;       // stop strings: generation ends when the text holds one
  bool random_seed = false;            // `seed: -1`: params.seed was drawn at random (print it)
  // The sampling keys the YAML or the command line set (temperature, top_k, top_p, min_p,
  // repetition_penalty): the model's generation_config.json fills only the others.
  std::vector<std::string> given;
  nlohmann::json options = nlohmann::json::object();
  OptionLocations options_at;
};

struct ChatConfig {
  std::string system;                  // system message ("" = none)
  bool enable_thinking = false;
  bool show_thoughts = false;          // print the thought channel too
  bool drop_old_turns = true;          // `specula chat` with a full context: drop the oldest turns (else an error)
};

struct Pipeline {
  std::filesystem::path source;        // the YAML file ("" when built from command-line flags)
  std::vector<std::filesystem::path> plugin_paths;
  BackendConfig backend;
  TargetConfig target;
  std::optional<DrafterConfig> drafter;
  SamplerConfig sampler;
  ChatConfig chat;
};

// A command-line value that replaces (or adds) one key before the pipeline is checked, so that it
// passes the same checks as the YAML: {"sampler.temperature", "0.7", "--temp"}. Paths should be
// absolute (they are not relative to the YAML file). A key under `drafter` other than drafter.model
// needs a drafter section or a drafter.model override.
struct Override {
  std::string key;     // section.key or section.options.key
  std::string value;   // as it would be written in YAML (a plain scalar)
  std::string flag;    // named in messages: "command line (--temp)"
  bool append = false; // add `value` to the key's list (e.g. --stop, repeatable) instead of replacing it
};

// Reads and checks a pipeline file. Throws specula::Error naming file, line and key.
Pipeline load_pipeline(const std::filesystem::path& yaml_file, const std::vector<Override>& overrides = {});
// The same from text; `source` names it in messages and relative paths resolve against `base_dir`.
Pipeline parse_pipeline(std::string_view yaml_text, const std::filesystem::path& source,
                        const std::filesystem::path& base_dir, const std::vector<Override>& overrides = {});
// The pipeline of the command line alone (no YAML): backend cpu, sampler standard, then `overrides`
// (which must give target.model).
Pipeline default_pipeline(const std::vector<Override>& overrides);

// Expands ${VAR} and ${VAR:-default}; an unset variable without default is an error naming it and
// `where` (e.g. "pipeline.yaml:3:10").
std::string expand_env(std::string_view text, std::string_view where);

using specula::closest_match;

// The objects a pipeline describes, created through a PluginHost.
struct BuiltPipeline {
  std::shared_ptr<ComputeBackend> backend;
  std::shared_ptr<const ModelFile> target_file;
  std::shared_ptr<Model> target;
  std::shared_ptr<const ModelFile> drafter_file;    // null without a drafter section
  std::shared_ptr<Drafter> drafter;                 // null without a drafter section
  std::shared_ptr<Sampler> sampler;
  // What the sampler was built with: the pipeline's sampler section, and for the keys it leaves unset
  // (SamplerConfig::given) the target checkpoint's generation_config.json (generation_defaults).
  SamplingParams sampling;
};

// The pipeline's sampling parameters with the checkpoint's generation_config.json (Hugging Face
// semantics: do_sample false = greedy) filling the keys the pipeline leaves unset; values out of range
// are ignored. `target_file` may be null (the pipeline's params unchanged).
SamplingParams generation_defaults(const Pipeline& p, const ModelFile* target_file);

// How the builder turns the models a pipeline names (a path, an hf:// id, drafter `auto`) into the local
// paths the plugin host opens. The core resolves no id: unset, a path is used as written and an id is an
// error; the applications pass the model hub's (apps/hub: hub::model_locator()), which downloads into
// the Hugging Face cache. Called where the model is opened, inside its section's step, so that a failure
// reads "FILE: section 'target': ..." and comes after the backend's checks.
struct ModelLocator {
  // target.model, or drafter.model when it is not `auto`: the local path of a path or an id.
  std::function<std::filesystem::path(const std::filesystem::path& model)> model;
  // drafter.model auto: the local path of the -assistant drafter of the target id `target`.
  std::function<std::filesystem::path(const std::filesystem::path& target)> assistant;
};

struct BuildOptions {
  bool load_drafter = true;
  ModelLocator locate;
};

// Creates backend, opens and loads the target (and drafter), creates the sampler. Every check of the
// steps below runs before the first weight is loaded. Throws specula::Error naming the pipeline section
// that failed.
BuiltPipeline build_pipeline(const Pipeline& pipeline, const PluginHost& host, const BuildOptions& options = {});

// The steps of build_pipeline before any weight is read, one per check, so that `specula validate`
// reports each with the message `run` would give. Each throws specula::Error.
std::shared_ptr<ComputeBackend> make_backend(const Pipeline& p, const PluginHost& host);
std::shared_ptr<const ModelFile> open_target(const Pipeline& p, const PluginHost& host, const ModelLocator& locate = {});
// target.plugin (or the first model plugin accepting the file), its options checked against its schema.
std::shared_ptr<ModelLoader> target_loader(const Pipeline& p, const PluginHost& host, const ModelFile& file);
// ModelLoader::check (options, configuration, cache dtype against the backend), then the context length
// against the model's. Returns the ModelInfo the loaded model will report.
ModelInfo check_target(const Pipeline& p, const ModelLoader& loader, const ModelFile& file, const ComputeBackend& backend);
std::shared_ptr<const ModelFile> open_drafter(const Pipeline& p, const PluginHost& host, const ModelLocator& locate = {});
std::shared_ptr<DrafterLoader> drafter_loader(const Pipeline& p, const PluginHost& host, const ModelFile& file);
// DrafterLoader::check: options and the pairing with the target.
void check_drafter(const Pipeline& p, const DrafterLoader& loader, const ModelFile& file, const ComputeBackend& backend,
                   const ModelInfo& target);
std::shared_ptr<Sampler> make_sampler(const Pipeline& p, const PluginHost& host);

// The drafting part of a generation's options from the pipeline's drafter section (none: unchanged).
void apply_drafting(const Pipeline& p, GenerationOptions& o);

}  // namespace specula::core
