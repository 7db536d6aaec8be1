// Entry point of the "vulkan" plugin: the Vulkan compute backend.
#include "specula/plugin.hpp"
#include "vk_backend.hpp"

namespace {
std::unique_ptr<specula::ComputeBackend> make_backend(const nlohmann::json& options) {
  return specula::vulkan::make_vulkan_backend(options);
}
const specula::PluginFactories* factories() {
  static const specula::PluginFactories f{.backend = &make_backend};
  return &f;
}
}  // namespace

SPECULA_PLUGIN("vulkan", "backend", "0.1.0", "Vulkan compute backend (one command buffer per graph)", factories)
