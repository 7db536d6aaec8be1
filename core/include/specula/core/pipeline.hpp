// The YAML pipeline: which plugins to load and how to wire them (docs/pipeline-yaml.md is the schema).
//
//   plugin_paths: [plugins]            # optional, relative to this file
//   backend: {plugin: onednn, options: {threads: 2}}
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
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "specula/model.hpp"
#include "specula/sampler.hpp"

namespace specula::core {

class PluginHost;

struct BackendConfig {
  std::string plugin = "onednn";
  nlohmann::json options = nlohmann::json::object();
};

struct TargetConfig {
  std::filesystem::path model;         // required: GGUF file or safetensors directory
  std::string format;                  // format plugin; "" = the first whose can_open accepts the file
  std::string plugin;                  // model plugin; "" = the first whose loader accepts the file
  int64_t context_length = 0;          // 0 = the model's own
  nlohmann::json options = nlohmann::json::object();
};

struct DrafterConfig {
  std::filesystem::path model;         // required when the section is present
  std::string format;
  std::string plugin;                  // drafter plugin; "" = the first whose loader accepts the file
  int draft_tokens = 3;                // tokens proposed per speculative step
  nlohmann::json options = nlohmann::json::object();
};

struct SamplerConfig {
  std::string plugin = "standard";
  SamplingParams params;               // temperature, top_k, top_p, repetition_penalty, ... seed
  int max_tokens = 256;                // generation limit per reply
  nlohmann::json options = nlohmann::json::object();
};

struct ChatConfig {
  std::string system;                  // system message ("" = none)
  bool enable_thinking = false;
  bool show_thoughts = false;          // print the thought channel too
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

// Reads and checks a pipeline file. Throws specula::Error naming file, line and key.
Pipeline load_pipeline(const std::filesystem::path& yaml_file);
// The same from text; `source` names it in messages and relative paths resolve against `base_dir`.
Pipeline parse_pipeline(std::string_view yaml_text, const std::filesystem::path& source,
                        const std::filesystem::path& base_dir);

// Expands ${VAR} and ${VAR:-default}; an unset variable without default is an error naming it and
// `where` (e.g. "pipeline.yaml:3:10").
std::string expand_env(std::string_view text, std::string_view where);

// The candidate closest to `word` by edit distance, or "" when none is reasonably close.
std::string closest_match(std::string_view word, const std::vector<std::string>& candidates);

// The objects a pipeline describes, created through a PluginHost.
struct BuiltPipeline {
  std::shared_ptr<ComputeBackend> backend;
  std::shared_ptr<const ModelFile> target_file;
  std::shared_ptr<Model> target;
  std::shared_ptr<const ModelFile> drafter_file;    // null without a drafter section
  std::shared_ptr<Drafter> drafter;                 // null without a drafter section
  std::shared_ptr<Sampler> sampler;
};

struct BuildOptions {
  bool load_drafter = true;
};

// Creates backend, opens and loads the target (and drafter), creates the sampler.
// Throws specula::Error naming the pipeline section that failed.
BuiltPipeline build_pipeline(const Pipeline& pipeline, const PluginHost& host, const BuildOptions& options = {});

}  // namespace specula::core
