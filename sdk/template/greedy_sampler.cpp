// The template plugin: a greedy sampler. It shows the three parts every plugin has:
//   1. an implementation of an SDK interface (here specula::Sampler),
//   2. a factory function per kind the plugin provides, collected in a PluginFactories table, with the
//      option schema of each kind (specula/options.hpp) the host checks the pipeline's options against,
//   3. one SPECULA_PLUGIN(...) line defining the entry symbol the host reads.
#include <cmath>
#include <limits>

#include "specula/error.hpp"
#include "specula/log.hpp"
#include "specula/plugin.hpp"

namespace {

// Picks the most likely token; end tokens are suppressed until `min_length` tokens were generated.
class GreedySampler final : public specula::Sampler {
 public:
  explicit GreedySampler(const specula::SamplingParams& p) : params_(p) {}
  const specula::SamplingParams& params() const override { return params_; }

  int32_t sample(std::span<const float> logits, const specula::SamplingState& state, float) const override {
    int32_t best = -1;
    float best_value = -std::numeric_limits<float>::infinity();
    for (size_t i = 0; i < logits.size(); ++i) {
      if (state.generated < params_.min_length && is_end(static_cast<int32_t>(i), state)) continue;
      if (best < 0 || logits[i] > best_value) {  // ties: the lower id
        best = static_cast<int32_t>(i);
        best_value = logits[i];
      }
    }
    if (best < 0) specula::fail("template-greedy: no token to choose from ({} logits)", logits.size());
    return best;
  }
  float next_uniform() override { return 0.0f; }  // greedy needs no randomness

 private:
  static bool is_end(int32_t id, const specula::SamplingState& state) {
    for (int32_t e : state.end_tokens) {
      if (e == id) return true;
    }
    return false;
  }
  specula::SamplingParams params_;
};

// The options this sampler takes: the host refuses any other key of the sampler section's `options:`
// mapping (with its line and the closest valid name) and checks types and ranges before the factory runs.
// An entry: {name, type, one-line doc, default, min, max, choices}.
const specula::OptionSchema kOptions = {
    {"warn_on_temperature", specula::OptionType::Bool, "log a warning when the pipeline asks for temperature > 0",
     true, std::nullopt, std::nullopt, {}},
};

// `options` is that mapping, as JSON, already checked against kOptions.
std::unique_ptr<specula::Sampler> make_sampler(const specula::SamplingParams& params, const nlohmann::json& options) {
  const bool warn = options.is_object() ? options.value("warn_on_temperature", true) : true;
  if (warn && params.temperature > 0) specula::log_warn("template-greedy ignores temperature {}", params.temperature);
  return std::make_unique<GreedySampler>(params);
}

const specula::PluginFactories* factories() {
  static const specula::PluginFactories table = [] {
    specula::PluginFactories f;
    f.sampler = &make_sampler;
    f.sampler_options = &kOptions;
    return f;
  }();
  return &table;
}

}  // namespace

SPECULA_PLUGIN("template-greedy", "sampler", "0.1.0", "template plugin: greedy sampler built out of tree", factories)
