// Entry point of the "vulkan" plugin: the Vulkan compute backend.
#include "specula/plugin.hpp"
#include "vk_backend.hpp"

namespace {
std::unique_ptr<specula::ComputeBackend> make_backend(const nlohmann::json& options) {
  return specula::vulkan::make_vulkan_backend(options);
}
const specula::OptionSchema kOptions = {
    {"device", specula::OptionType::IntegerOrString, "device index (0, 1, ...) or a substring of its name; default: the first GPU",
     nullptr, 0, std::nullopt, {}},
    {"max_binding_bytes", specula::OptionType::Integer, "largest buffer bound at once (default: the device's limit)",
     nullptr, 4096, std::nullopt, {}},
    {"subgroups", specula::OptionType::Bool, "reduce with subgroup shuffles where the device has them", true,
     std::nullopt, std::nullopt, {}},
    {"cooperative_matrix", specula::OptionType::Bool,
     "multiply prompt-sized matrices on cooperative matrices (tensor cores) where the device has them", true,
     std::nullopt, std::nullopt, {}},
    {"profile", specula::OptionType::Bool,
     "time every dispatch with GPU timestamps; print per-op, per-weight and per-layer tables when the backend ends",
     false, std::nullopt, std::nullopt, {}},
};
const specula::PluginFactories* factories() {
  static const specula::PluginFactories f{.backend = &make_backend, .backend_options = &kOptions};
  return &f;
}
}  // namespace

SPECULA_PLUGIN("vulkan", "backend", "0.1.0", "Vulkan compute backend (one command buffer per graph)", factories)
