#include "standard_sampler.hpp"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <numeric>

#include "specula/error.hpp"

namespace specula::sampling {

StandardSampler::StandardSampler(const SamplingParams& p) : params_(p), rng_(p.seed) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
    fail("sampler 'standard': temperature {} must be a finite number >= 0", p.temperature);
  if (p.top_k < 0) fail("sampler 'standard': top_k {} must be >= 0 (0 = off)", p.top_k);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) fail("sampler 'standard': top_p {} must be in (0, 1]", p.top_p);
  if (!(p.repetition_penalty > 0.0f) || !std::isfinite(p.repetition_penalty))
    fail("sampler 'standard': repetition_penalty {} must be a finite number > 0", p.repetition_penalty);
  if (p.penalty_window < 0) fail("sampler 'standard': penalty_window {} must be >= 0", p.penalty_window);
  if (p.min_length < 0) fail("sampler 'standard': min_length {} must be >= 0", p.min_length);
}

float StandardSampler::next_uniform() {
  // 24 random bits: every value is exactly representable and strictly below 1.
  return static_cast<float>(rng_() >> 40) * 0x1p-24f;
}

std::vector<float> StandardSampler::adjusted_logits(std::span<const float> logits, const SamplingState& state) const {
  std::vector<float> x(logits.begin(), logits.end());
  const auto vocab = static_cast<int64_t>(x.size());
  auto in_range = [&](int32_t id) { return id >= 0 && id < vocab; };
  if (state.generated < params_.min_length)
    for (int32_t id : state.end_tokens)
      if (in_range(id)) x[id] = -FLT_MAX;
  if (params_.repetition_penalty != 1.0f && params_.penalty_window > 0) {
    const size_t n = std::min(state.history.size(), static_cast<size_t>(params_.penalty_window));
    std::vector<int32_t> ids(state.history.end() - static_cast<std::ptrdiff_t>(n), state.history.end());
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    const float p = params_.repetition_penalty;
    for (int32_t id : ids)
      if (in_range(id)) x[id] = x[id] > 0.0f ? x[id] / p : x[id] * p;
  }
  return x;
}

int32_t StandardSampler::sample(std::span<const float> logits, const SamplingState& state, float uniform) const {
  if (logits.empty()) fail("sampler 'standard': empty logits");
  const std::vector<float> x = adjusted_logits(logits, state);
  if (params_.temperature == 0.0f) {
    int32_t best = 0;
    for (int32_t i = 1; i < static_cast<int32_t>(x.size()); ++i)
      if (x[i] > x[best]) best = i;
    return best;
  }

  const auto vocab = static_cast<int64_t>(x.size());
  const int64_t k = params_.top_k > 0 ? std::min<int64_t>(params_.top_k, vocab) : vocab;
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  auto higher = [&](int32_t a, int32_t b) { return x[a] != x[b] ? x[a] > x[b] : a < b; };
  std::partial_sort(order.begin(), order.begin() + k, order.end(), higher);
  order.resize(static_cast<size_t>(k));

  // Softmax over the top-K of logits / temperature (descending, so probabilities are too).
  const double inv_t = 1.0 / params_.temperature;
  const double top = static_cast<double>(x[order[0]]) * inv_t;
  std::vector<double> prob(order.size());
  double sum = 0.0;
  for (size_t i = 0; i < order.size(); ++i) sum += prob[i] = std::exp(static_cast<double>(x[order[i]]) * inv_t - top);
  for (double& q : prob) q /= sum;

  // Shortest prefix reaching top_p.
  size_t keep = prob.size();
  if (params_.top_p < 1.0f) {
    double cum = 0.0;
    for (size_t i = 0; i < prob.size(); ++i) {
      cum += prob[i];
      if (cum >= static_cast<double>(params_.top_p)) {
        keep = i + 1;
        break;
      }
    }
  }
  double mass = 0.0;
  for (size_t i = 0; i < keep; ++i) mass += prob[i];
  const double target = static_cast<double>(std::clamp(uniform, 0.0f, 1.0f)) * mass;
  double cum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    cum += prob[i];
    if (cum > target) return order[i];
  }
  return order[keep - 1];
}

Value StandardSampler::sample_in_graph(Graph& graph, Value logits, Value, Value, const SamplingState& state) const {
  const bool penalty = params_.repetition_penalty != 1.0f && params_.penalty_window > 0 && !state.history.empty();
  const bool suppression = state.generated < params_.min_length && !state.end_tokens.empty();
  if (params_.temperature != 0.0f || penalty || suppression) return {};
  if (graph.shape(logits).size() != 1)
    fail("sampler 'standard': device logits must be F32 [vocab], got {} axes", graph.shape(logits).size());
  return graph.argmax(logits);  // ties: the lowest index, as the host's strict '>' scan
}

}  // namespace specula::sampling
