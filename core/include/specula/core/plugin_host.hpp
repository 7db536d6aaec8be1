// The plugin host: finds plugin libraries, checks their ABI before any C++ object crosses the boundary,
// and hands out plugin objects that keep their library loaded for as long as they live.
//
//   specula::core::PluginHost host;
//   host.discover(specula::core::plugin_search_path(yaml_plugin_paths));
//   for (auto& p : host.plugins()) ...;          // accepted plugins, first in search order wins
//   for (auto& r : host.rejected()) ...;         // every candidate refused, with the reason
//   auto backend = host.make_backend("cpu", {});
//   auto file = host.open_model("model.gguf");   // a local path; asks every format plugin's can_open
//   host.make_writer("gguf")->write(path, metadata, tensors);  // a format plugin that writes GGUF
//   auto loader = host.find_model_loader(*file); // the model plugin whose loader accepts the file
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "specula/plugin.hpp"

namespace specula::core {

// One plugin that passed every check.
struct PluginInfo {
  std::string name;
  std::vector<std::string> kinds;   // "format", "backend", "model", ... (the host's table of kinds)
  std::string version;
  std::string description;
  std::filesystem::path file;
  bool has_kind(std::string_view kind) const;
};

// One candidate library that was refused (wrong ABI, not a plugin, corrupt, shadowed, ...).
struct Rejection {
  std::filesystem::path file;
  std::string reason;   // a full sentence naming the file
};

// The directories to scan, in order: `first` (a pipeline's plugin_paths or --plugin-path), then
// SPECULA_PLUGIN_PATH (colon-separated), then this build's plugin directory and the install one.
// Directories that do not exist are kept (discover() skips them silently).
std::vector<std::filesystem::path> plugin_search_path(const std::vector<std::filesystem::path>& first = {});

// Whether plugins of `kind` take options a pipeline gives (and a schema may describe): not format or
// converter, nor a kind the host does not know.
bool kind_takes_options(std::string_view kind);

class PluginHost {
 public:
  PluginHost();
  ~PluginHost();
  PluginHost(const PluginHost&) = delete;
  PluginHost& operator=(const PluginHost&) = delete;

  // Scans every `libspecula-*.so` / `*.so` in each directory, in order (files sorted by name within a
  // directory). May be called more than once; a plugin name already accepted shadows later copies,
  // which are reported in rejected(). Never throws for a bad library: it becomes a Rejection.
  void discover(const std::vector<std::filesystem::path>& dirs);
  // Loads one library file as discover() would; returns whether it was accepted.
  bool add_library(const std::filesystem::path& file);

  const std::vector<PluginInfo>& plugins() const;
  const std::vector<Rejection>& rejected() const;
  const PluginInfo* find(std::string_view name) const;   // nullptr when absent
  // Accepted plugins of one kind, in search order.
  std::vector<const PluginInfo*> of_kind(std::string_view kind) const;

  // Factories, one per kind, all through one generic path (the host's table of kinds: plugin_host.cpp).
  // `name` is a plugin name; errors (unknown name, wrong kind) are specula::Error that list
  // the plugins of that kind that were found. `options` are checked against the plugin's schema for
  // that kind first (specula/options.hpp; `where` locates each key in messages). The returned objects
  // pin their plugin's library.
  std::shared_ptr<ModelFormat> make_format(std::string_view name, const nlohmann::json& options = {}) const;
  std::shared_ptr<ComputeBackend> make_backend(std::string_view name, const nlohmann::json& options = {},
                                               const OptionLocations& where = {}) const;
  std::shared_ptr<ModelLoader> make_model_loader(std::string_view name, const nlohmann::json& options = {},
                                                 const OptionLocations& where = {}) const;
  std::shared_ptr<DrafterLoader> make_drafter_loader(std::string_view name, const nlohmann::json& options = {},
                                                     const OptionLocations& where = {}) const;
  std::shared_ptr<Sampler> make_sampler(std::string_view name, const SamplingParams& params,
                                        const nlohmann::json& options = {}, const OptionLocations& where = {}) const;
  std::shared_ptr<const LmHead> make_lm_head(std::string_view name, const nlohmann::json& options = {},
                                             const OptionLocations& where = {}) const;
  std::shared_ptr<const Attention> make_attention(std::string_view name, const nlohmann::json& options = {},
                                                  const OptionLocations& where = {}) const;
  // The option schema plugin `name` declares for `kind`; nullptr when it declares none. Throws as the
  // factories do for an unknown name or a wrong kind.
  const OptionSchema* option_schema(std::string_view name, std::string_view kind) const;

  // Opens a checkpoint with the first format plugin whose can_open accepts it, or with the named
  // format plugin when `format` is not empty. When none accepts it, throws naming the path and, for each
  // format plugin, why it declined (the error its open() gives). `path` is a local path: an hf:// id is
  // refused (the applications resolve ids with the model hub first, specula/hub.hpp).
  std::shared_ptr<const ModelFile> open_model(const std::filesystem::path& path, std::string_view format = {}) const;
  // The first format plugin whose ModelFormat is named `format` ("gguf") and can_write: what
  // `specula convert` and `specula quantize` write through. Throws naming the format plugins found.
  std::shared_ptr<const ModelFormat> make_writer(std::string_view format) const;
  // The first model (drafter) plugin whose loader accepts `file`, made with `options`; throws naming the
  // file's architecture (general.architecture / config.json model_type when present) and the plugins tried.
  std::shared_ptr<ModelLoader> find_model_loader(const ModelFile& file, const nlohmann::json& options = {},
                                                 const OptionLocations& where = {}) const;
  std::shared_ptr<DrafterLoader> find_drafter_loader(const ModelFile& file, const nlohmann::json& options = {},
                                                     const OptionLocations& where = {}) const;
  // The first converter plugin that accepts `file` (specula convert); throws naming the architecture the
  // file declares (config.json architectures and model_type) and the converters tried.
  std::shared_ptr<Converter> find_converter(const ModelFile& file) const;

 private:
  struct Library;
  struct Entry;
  const Entry& entry(std::string_view name, std::string_view kind) const;
  // The generic path behind the factories: K is a row of the table of kinds.
  template <const auto& K, typename... Args>
  auto make(std::string_view name, const nlohmann::json& options, const OptionLocations& where, Args&&... args) const;
  template <const auto& K>
  auto find_accepting(const ModelFile& file, const nlohmann::json& options, const OptionLocations& where) const;
  std::vector<Entry> entries_;
  std::vector<PluginInfo> plugins_;
  std::vector<Rejection> rejected_;
};

}  // namespace specula::core
