// Entry point of the "onednn" plugin: the CPU compute backend.
#include "cpu_backend.hpp"
#include "specula/plugin.hpp"

namespace {
std::unique_ptr<specula::ComputeBackend> make_backend(const nlohmann::json& options) {
  return specula::cpu::make_cpu_backend(options);
}
const specula::PluginFactories* factories() {
  static const specula::PluginFactories f{.backend = &make_backend};
  return &f;
}
}  // namespace

SPECULA_PLUGIN("onednn", "backend", "0.1.0", "CPU compute backend (threaded AVX2 kernels, oneDNN GEMM)", factories)
