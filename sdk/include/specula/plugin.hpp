// The plugin ABI. A plugin is a shared library exporting exactly one extern "C" symbol,
// `specula_plugin_entry`, which returns a SpeculaPluginDescriptor. The host reads the plain-C fields
// (ABI version, fingerprint, name, kinds, version) first and touches no C++ object until both the ABI
// version and the compiler/standard-library fingerprint match its own.
#pragma once

#include <cstdint>
#include <memory>

#include <nlohmann/json.hpp>

#include "specula/abi_hash.hpp"
#include "specula/compute.hpp"
#include "specula/convert.hpp"
#include "specula/attention.hpp"
#include "specula/lm_head.hpp"
#include "specula/log.hpp"
#include "specula/model.hpp"
#include "specula/model_file.hpp"
#include "specula/options.hpp"
#include "specula/sampler.hpp"

// The layout of SpeculaPluginDescriptor and its checks. Interface changes are caught by the interface
// hash in the fingerprint (SPECULA_INTERFACE_HASH, computed from the headers); the number is bumped for
// releases that change interfaces, so that messages can name them.
// 3: option schemas in PluginFactories, ModelLoader::check and DrafterLoader::check
// 4: Drafter::draft(target, DraftRequest) returns DraftSteps (token + logits); Sampler::distribution;
//    TopPDraw's min_p; plugin kind "converter" (specula/convert.hpp) and PluginFactories::converter
//    metadata.hpp: limits::*, require_range, range-checked GgufKeys / JsonFields integer reads
// 5: Model::forward_batch, ModelContext::max_rollback, kv_cache.hpp (KvCache, BatchGraph), shape_str;
//    the interface hash joins the fingerprint
// 6: plugin kinds "lm_head" and "attention" (specula/lm_head.hpp, specula/attention.hpp); ModelParts in
//    ModelLoader::load and DrafterLoader::load
// 7: ComputeBackend::compile → CompiledGraph (run, read) replaces run(Graph) / read(Graph, ...);
//    ModelContext::forward_sample declines instead of sampling on the host (no require_device)
// 8: the GGUF / safetensors readers and writers leave the SDK for their plugins: specula/gguf_metadata.hpp
//    (gguf::Metadata, the value types) replaces gguf.hpp and safetensors.hpp; ModelFile::gguf_metadata;
//    ModelFormat::can_write / write(path, metadata, TensorSpecs); Converter::plan fills a gguf::Metadata
// 9: sampled speculative rounds on the backend: Op::AcceptDrafts, TokenProbability::weight,
//    Sampler::verify_in_graph, ModelContext::draft_logits / verify_sampled, DraftRequest's device sampling
// 10: one round protocol: ModelContext::prepare_round and Model::verify (a batch of rounds in one graph)
//    replace forward_sample, draft_tokens / verify_greedy and draft_logits / verify_sampled; DraftRequest
//    carries RoundBuffers and a RoundRule instead of device_tokens / device_logits / sampler / state
// 11: tool calling: ChatMessage gains tool_calls / tool_call_id / name; ChatFormat::render_chat_tools;
//    SamplingParams gains presence_penalty / frequency_penalty / logit_bias
// 12: ComputeBackend::profile (the OpProfile of option `profile`; its ExpertReads of MatMulId nodes)
#define SPECULA_PLUGIN_ABI_VERSION 12u
#define SPECULA_PLUGIN_ENTRY_SYMBOL "specula_plugin_entry"

// Compiler, standard library, language standard and the SDK's interface hash: C++ objects cross the
// boundary only between binaries that agree on all four.
#define SPECULA_STRINGIFY2(x) #x
#define SPECULA_STRINGIFY(x) SPECULA_STRINGIFY2(x)
#if defined(__clang__)
#define SPECULA_COMPILER_ID "clang-" SPECULA_STRINGIFY(__clang_major__)
#elif defined(__GNUC__)
#define SPECULA_COMPILER_ID "gcc-" SPECULA_STRINGIFY(__GNUC__)
#else
#define SPECULA_COMPILER_ID "unknown"
#endif
#if defined(_LIBCPP_VERSION)
#define SPECULA_STDLIB_ID "libc++-" SPECULA_STRINGIFY(_LIBCPP_VERSION)
#elif defined(_GLIBCXX_RELEASE)
#define SPECULA_STDLIB_ID "libstdc++-" SPECULA_STRINGIFY(_GLIBCXX_RELEASE) "-cxx11abi" SPECULA_STRINGIFY(_GLIBCXX_USE_CXX11_ABI)
#else
#define SPECULA_STDLIB_ID "stdlib-unknown"
#endif
#define SPECULA_ABI_FINGERPRINT \
  SPECULA_COMPILER_ID "/" SPECULA_STDLIB_ID "/c++" SPECULA_STRINGIFY(__cplusplus) "/sdk-" SPECULA_INTERFACE_HASH

namespace specula {

// Services the host lends to every plugin when it loads it.
struct HostServices {
  LogSink log_sink = nullptr;
  LogLevel log_level = LogLevel::Info;
};

// Factories of one plugin; a plugin fills those of the kinds it provides and leaves the rest null.
// `options` is the plugin's section of the pipeline YAML, as JSON.
struct PluginFactories {
  std::unique_ptr<ModelFormat> (*format)(const nlohmann::json& options) = nullptr;
  std::unique_ptr<ComputeBackend> (*backend)(const nlohmann::json& options) = nullptr;
  std::unique_ptr<ModelLoader> (*model)(const nlohmann::json& options) = nullptr;
  std::unique_ptr<DrafterLoader> (*drafter)(const nlohmann::json& options) = nullptr;
  std::unique_ptr<Sampler> (*sampler)(const SamplingParams& params, const nlohmann::json& options) = nullptr;
  std::unique_ptr<Converter> (*converter)() = nullptr;  // checkpoint -> GGUF (specula convert)
  std::unique_ptr<LmHead> (*lm_head)(const nlohmann::json& options) = nullptr;        // specula/lm_head.hpp
  std::unique_ptr<Attention> (*attention)(const nlohmann::json& options) = nullptr;  // specula/attention.hpp
  // The options each kind takes (specula/options.hpp). The host checks a pipeline's options section
  // against them before calling the factory; null = no schema: the options reach the factory unchecked
  // and the plugin must refuse unknown keys itself.
  const OptionSchema* backend_options = nullptr;
  const OptionSchema* model_options = nullptr;
  const OptionSchema* drafter_options = nullptr;
  const OptionSchema* sampler_options = nullptr;
  const OptionSchema* lm_head_options = nullptr;
  const OptionSchema* attention_options = nullptr;
};

}  // namespace specula

extern "C" {
// Plain C so that a host can read it from a plugin built by any compiler.
struct SpeculaPluginDescriptor {
  uint32_t abi_version;        // SPECULA_PLUGIN_ABI_VERSION the plugin was built with
  const char* fingerprint;     // SPECULA_ABI_FINGERPRINT the plugin was built with
  const char* name;            // unique plugin name, e.g. "gguf"
  const char* kinds;           // comma-separated: "format", "backend", "model", "drafter", "sampler", "converter",
                               // "lm_head", "attention"
  const char* version;         // semantic version of the plugin, "1.2.0"
  const char* description;     // one line for `specula plugins`
  // Only called after the checks pass.
  void (*attach)(const specula::HostServices* host);
  const specula::PluginFactories* (*factories)();
};
}

namespace specula::detail {
void attach_host(const HostServices* host);  // installs the host's log sink in this plugin
}

// Defines the entry symbol. Use once per plugin:
//   SPECULA_PLUGIN("gguf", "format", "1.0.0", "GGUF v3 reader", make_factories)
// where `make_factories` is a function returning `const specula::PluginFactories*`.
#define SPECULA_PLUGIN(NAME, KINDS, VERSION, DESCRIPTION, FACTORIES)                              \
  extern "C" __attribute__((visibility("default"))) const SpeculaPluginDescriptor*                \
  specula_plugin_entry() {                                                                        \
    static const SpeculaPluginDescriptor descriptor{SPECULA_PLUGIN_ABI_VERSION,                   \
                                                    SPECULA_ABI_FINGERPRINT,                      \
                                                    NAME,                                         \
                                                    KINDS,                                        \
                                                    VERSION,                                      \
                                                    DESCRIPTION,                                  \
                                                    &specula::detail::attach_host,                \
                                                    &FACTORIES};                                  \
    return &descriptor;                                                                           \
  }
