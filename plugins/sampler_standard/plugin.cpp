// Plugin "standard", kind sampler. Options in the pipeline's sampler section are the SamplingParams the
// host passes; no extra options are read.
#include "specula/plugin.hpp"
#include "standard_sampler.hpp"

namespace {

std::unique_ptr<specula::Sampler> make_sampler(const specula::SamplingParams& params, const nlohmann::json&) {
  return std::make_unique<specula::sampling::StandardSampler>(params);
}

const specula::PluginFactories* factories() {
  static const specula::PluginFactories f = [] {
    specula::PluginFactories x;
    x.sampler = &make_sampler;
    static const specula::OptionSchema none;  // every setting is a key of the sampler section itself
    x.sampler_options = &none;
    return x;
  }();
  return &f;
}

}  // namespace

SPECULA_PLUGIN("standard", "sampler", "1.0.0",
               "greedy / temperature / top-K / top-P sampler with repetition penalty and end-token suppression",
               factories)
