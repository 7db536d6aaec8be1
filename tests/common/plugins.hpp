// The plugin host over the build's plugins, the CPU backend and loaded models: one of each per test
// process, shared by the suites that run real plugins.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "specula/core/plugin_host.hpp"
#include "specula/model.hpp"

namespace specula_test {

inline specula::core::PluginHost& host() {
  static specula::core::PluginHost* h = [] {
    auto* p = new specula::core::PluginHost();
    p->discover({std::filesystem::path(SPECULA_PLUGIN_DIR)});
    return p;
  }();
  return *h;
}

inline std::shared_ptr<specula::ComputeBackend> backend() {
  static auto b = host().make_backend("cpu");
  return b;
}

// The CPU backend with its weights left as the file holds them (pack_weights: false): MLX weights then
// multiply in float tiles, MLX's own numerics.
inline std::shared_ptr<specula::ComputeBackend> unpacked_backend() {
  static auto b = host().make_backend("cpu", {{"pack_weights", false}});
  return b;
}

// Models are immutable once loaded (contexts hold the state), so tests share them.
inline std::shared_ptr<specula::Model> load(const std::filesystem::path& path,
                                            const nlohmann::json& options = nlohmann::json::object(),
                                            bool packed = true) {
  static std::map<std::string, std::shared_ptr<specula::Model>> loaded;
  auto& m = loaded[path.string() + options.dump() + (packed ? "" : " unpacked")];
  if (!m) {
    auto file = host().open_model(path);
    m = host().find_model_loader(*file)->load(file, packed ? backend() : unpacked_backend(), options);
  }
  return m;
}

}  // namespace specula_test
