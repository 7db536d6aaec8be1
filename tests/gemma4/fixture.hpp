// The Gemma 4 test fixtures (tools/gemma4_fixture.py, generated on first use and cached in the build
// dir), the plugin host, the CPU backend and loaded models, shared by the gemma4 test files.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "specula/core/plugin_host.hpp"
#include "specula/model.hpp"

namespace gemma4_test {

namespace fs = std::filesystem;
using json = nlohmann::json;
using specula::core::PluginHost;

// Formats each variant's fixture provides (kept small: the vocab is the real 262144 tokens).
inline const std::map<std::string, std::string> kFormats = {
    {"e2b", "f32,f16,q8_0,hf,mlx4"}, {"e4b", "f32,q8_0"}, {"31b", "f32,f16,hf"}, {"26b", "f32,q8_0,hf,mlx4"}};

// The fixture directory of a variant, generated on first use.
inline fs::path fixture(const std::string& variant) {
  static std::mutex mu;
  static std::set<std::string> done;
  const fs::path dir = fs::path(SPECULA_BINARY_DIR) / "gemma4-fixtures" / variant;
  std::lock_guard<std::mutex> lock(mu);
  if (!done.count(variant)) {
    const std::string cmd = std::string(SPECULA_PYTHON) + " " + SPECULA_SOURCE_DIR + "/tools/gemma4_fixture.py --variant " +
                            variant + " --formats " + kFormats.at(variant) + " --out " + dir.string() +
                            " --vocab " + SPECULA_SHARED_DIR + "/gemma4-vocab/ggml-vocab-gemma-4.gguf";
    const int rc = std::system(cmd.c_str());
    if (rc != 0) throw std::runtime_error("fixture generation failed: " + cmd);
    done.insert(variant);
  }
  return dir;
}

inline PluginHost& host() {
  static PluginHost* h = [] {
    auto* p = new PluginHost();
    p->discover({fs::path(SPECULA_PLUGIN_DIR)});
    return p;
  }();
  return *h;
}

inline std::shared_ptr<specula::ComputeBackend> backend() {
  static auto b = host().make_backend("onednn");
  return b;
}

// Models are immutable once loaded (contexts hold the state), so tests share them.
inline std::shared_ptr<specula::Model> load(const fs::path& path, const json& options = json::object()) {
  static std::map<std::string, std::shared_ptr<specula::Model>> loaded;
  auto& m = loaded[path.string() + options.dump()];
  if (!m) {
    auto file = host().open_model(path);
    m = host().find_model_loader(*file)->load(file, backend(), options);
  }
  return m;
}

}  // namespace gemma4_test
