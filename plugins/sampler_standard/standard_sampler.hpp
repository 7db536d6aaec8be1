// The standard sampler (plugin "standard"): the rules of ../shared/seeds/gemma4-chat.md, applied in
// this order to a copy of the logits:
//   1. end-token suppression: while state.generated < min_length every end token gets -FLT_MAX;
//   2. repetition penalty over the distinct ids among the last `penalty_window` of the history:
//      a positive logit is divided by the penalty, any other multiplied by it;
//   2b. presence / frequency penalties over this completion's tokens (the last state.generated ids):
//      logit -= presence * (count > 0) + frequency * count (OpenAI's, as vLLM applies them);
//   2c. logit_bias added (a suppressed end token stays suppressed);
//   3. greedy (temperature 0): the highest logit, the lowest index among equal maxima;
//   4. otherwise logits / temperature, top-K by logit (ties: lower index first), softmax over those;
//      with min_p > 0 the candidates below min_p times the highest probability are dropped and the
//      rest renormalised (llama.cpp's min-p);
//      the shortest prefix (by probability, then index) whose cumulative probability reaches top_p,
//      and an inverse-CDF draw: the first candidate whose cumulative probability exceeds
//      uniform * (mass kept).
// sample() is a pure function of (logits, state, uniform); next_uniform() is the seeded generator.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <span>
#include <vector>

#include "specula/sampler.hpp"
#include "specula/sampling_rule.hpp"

namespace specula::sampling {

class StandardSampler final : public Sampler {
 public:
  explicit StandardSampler(const SamplingParams& params);
  const SamplingParams& params() const override { return params_; }
  int32_t sample(std::span<const float> logits, const SamplingState& state, float uniform) const override;
  float next_uniform() override;
  // What sample() draws from: the kept candidates (top-K, min-p, top-P), renormalised.
  std::vector<TokenProbability> distribution(std::span<const float> logits, const SamplingState& state) const override;
  // Device form: the same rules as graph ops (Scatter, Clamp, Div, TopK, TopPDraw; docs/sampling.md),
  // equal to sample() token for token on the CPU backend.
  Value sample_in_graph(Graph& graph, Value logits, Value ids, Value uniform, const SamplingState& state,
                        const ComputeBackend& backend, std::string* why = nullptr) const override;
  // The speculative verdict of a sampled round: TopK of both logit sets and AcceptDrafts, the rule
  // accept_draft computes on the host (core/speculative.hpp).
  Value verify_in_graph(Graph& graph, Value target, Value draft, Value drafts, Value uniforms,
                        const SamplingState& state, const ComputeBackend& backend,
                        std::string* why = nullptr) const override;
  // The penalty window (padded to a fixed length, see window_slots) followed by the end tokens while
  // they are suppressed.
  std::vector<int32_t> device_ids(const SamplingState& state) const override;
  std::string device_key(const SamplingState& state) const override;

  // Steps 1-2c on a copy: what the sampler ranks. Exposed for tests and the device form's reference.
  std::vector<float> adjusted_logits(std::span<const float> logits, const SamplingState& state) const;

 private:
  // Steps 1-4 up to the draw: candidates by probability (then index), their probabilities (after
  // min-p, before top-P) and how many top-P keeps. Greedy: the one best candidate.
  // The top-K ids by logit and their kept set under the SDK's sampling rule (greedy: the argmax alone).
  struct Candidates {
    std::vector<int32_t> order;
    TopPSet set;
  };
  Candidates candidates(std::span<const float> logits, const SamplingState& state) const;
  // Windows up to this many ids keep one graph shape while the history is shorter than the window.
  static constexpr int64_t kPaddedWindow = 1024;
  bool penalty_active(const SamplingState& state) const;
  bool suppression_active(const SamplingState& state) const;
  bool history_penalties_active(const SamplingState& state) const;
  std::string host_only_reason() const;  // empty when the device forms can apply every rule
  int64_t window_slots(const SamplingState& state) const;

  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace specula::sampling
