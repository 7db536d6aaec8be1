// Sampler: picks the next token from logits. Host and device implementations apply the same rules
// and are pure functions of (logits, history, uniform), so they can be compared token for token.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <nlohmann/json.hpp>

#include "specula/compute.hpp"

namespace specula {

struct SamplingParams {
  float temperature = 0.0f;        // 0 = greedy
  int32_t top_k = 0;               // 0 = off
  float top_p = 1.0f;              // 1 = off
  float repetition_penalty = 1.0f; // 1 = off
  int32_t penalty_window = 64;     // last ids the penalty looks at
  int32_t min_length = 0;          // end tokens suppressed while fewer tokens were generated
  uint64_t seed = 0;
};

struct SamplingState {
  std::span<const int32_t> history;     // ids so far (prompt and generated), oldest first
  int32_t generated = 0;                // tokens generated so far
  std::span<const int32_t> end_tokens;  // suppressed while generated < min_length
};

// Plugin kind "sampler".
class Sampler {
 public:
  virtual ~Sampler() = default;
  virtual const SamplingParams& params() const = 0;
  // Host form. `uniform` in [0, 1) drives the inverse-CDF draw; ignored when greedy.
  virtual int32_t sample(std::span<const float> logits, const SamplingState& state, float uniform) const = 0;
  // Next uniform of the seeded generator.
  virtual float next_uniform() = 0;
  // Device form: appends the same rules to `graph` after `logits` (F32 [vocab]) and returns an I32 [1]
  // value; `history_ids` is an I32 input holding the penalty window. Returns Value{} when unsupported.
  virtual Value sample_in_graph(Graph& graph, Value logits, Value history_ids, Value uniform,
                                const SamplingState& state) const {
    (void)graph; (void)logits; (void)history_ids; (void)uniform; (void)state;
    return {};
  }
};

}  // namespace specula
