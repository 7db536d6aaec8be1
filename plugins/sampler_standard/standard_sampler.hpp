// The standard sampler (plugin "standard"): the rules of ../shared/seeds/gemma4-chat.md, applied in
// this order to a copy of the logits:
//   1. end-token suppression: while state.generated < min_length every end token gets -FLT_MAX;
//   2. repetition penalty over the distinct ids among the last `penalty_window` of the history:
//      a positive logit is divided by the penalty, any other multiplied by it;
//   3. greedy (temperature 0): the highest logit, the lowest index among equal maxima;
//   4. otherwise logits / temperature, top-K by logit (ties: lower index first), softmax over those,
//      the shortest prefix (by probability, then index) whose cumulative probability reaches top_p,
//      and an inverse-CDF draw: the first candidate whose cumulative probability exceeds
//      uniform * (mass kept).
// sample() is a pure function of (logits, state, uniform); next_uniform() is the seeded generator.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "specula/sampler.hpp"

namespace specula::sampling {

class StandardSampler final : public Sampler {
 public:
  explicit StandardSampler(const SamplingParams& params);
  const SamplingParams& params() const override { return params_; }
  int32_t sample(std::span<const float> logits, const SamplingState& state, float uniform) const override;
  float next_uniform() override;
  // Device form, for the steps where the rules reduce to an argmax of the raw logits (greedy, no
  // penalty, no suppression in force); Value{} otherwise, and the engine samples on the host. The
  // graph ops have no cumulative sum, select or scatter for the rest (see docs/sampling.md).
  Value sample_in_graph(Graph& graph, Value logits, Value history_ids, Value uniform,
                        const SamplingState& state) const override;

  // Steps 1-2 on a copy: what the sampler ranks. Exposed for tests and the device form's reference.
  std::vector<float> adjusted_logits(std::span<const float> logits, const SamplingState& state) const;

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace specula::sampling
