// The template plugin: a greedy sampler. It shows the three parts every plugin has:
//   1. an implementation of an SDK interface (here specula::Sampler),
//   2. a factory function per kind the plugin provides, collected in a PluginFactories table,
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

// `options` is the sampler section's `options:` mapping from the pipeline YAML, as JSON. Reject keys
// you do not know so that typos are errors, not silently ignored settings.
std::unique_ptr<specula::Sampler> make_sampler(const specula::SamplingParams& params, const nlohmann::json& options) {
  for (const auto& [key, value] : options.items()) {
    specula::fail("template-greedy: unknown option '{}' (this sampler has no options)", key);
  }
  if (params.temperature > 0) specula::log_warn("template-greedy ignores temperature {}", params.temperature);
  return std::make_unique<GreedySampler>(params);
}

const specula::PluginFactories* factories() {
  static const specula::PluginFactories table = [] {
    specula::PluginFactories f;
    f.sampler = &make_sampler;
    return f;
  }();
  return &table;
}

}  // namespace

SPECULA_PLUGIN("template-greedy", "sampler", "0.1.0", "template plugin: greedy sampler built out of tree", factories)
