// Entry point of the "cpu" plugin (named "onednn" before; pipelines may still say so): the CPU compute backend.
#include "cpu_backend.hpp"
#include "specula/plugin.hpp"

namespace {
std::unique_ptr<specula::ComputeBackend> make_backend(const nlohmann::json& options) {
  return specula::cpu::make_cpu_backend(options);
}
const specula::OptionSchema kOptions = {
    {"threads", specula::OptionType::Integer, "worker threads, 0 = all cores", 0, 0, 1024, {}},
    {"isa", specula::OptionType::String, "kernel set: auto = the best this CPU runs (or SPECULA_CPU_ISA)", "auto",
     std::nullopt, std::nullopt, {"auto", "avx2", "avx512"}},
    {"profile", specula::OptionType::Bool, "print time per op kind, weight and layer when the backend ends", false,
     std::nullopt, std::nullopt, {}},
    {"pack_weights", specula::OptionType::Bool,
     "copy Q8_0 / Q4_0 matrices into 16-row panels on first use (their size again in memory; faster products)",
     true, std::nullopt, std::nullopt, {}},
};
const specula::PluginFactories* factories() {
  static const specula::PluginFactories f{.backend = &make_backend, .backend_options = &kOptions};
  return &f;
}
}  // namespace

SPECULA_PLUGIN("cpu", "backend", "0.1.0", "CPU compute backend (AVX2 / AVX-512 kernels chosen at run time, oneDNN GEMM)", factories)
