// Sampler: picks the next token from logits. Host and device implementations apply the same rules
// and are pure functions of (logits, history, uniform), so they can be compared token for token.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "specula/compute.hpp"
#include "specula/error.hpp"

namespace specula {

// Where the engine samples plain decode steps: auto = in the model's graph when the model and the
// backend can (Sampler::sample_in_graph, ModelContext::prepare_round), else on the host; on = in the
// graph or an error naming what is missing; off = always on the host.
enum class SamplingDevice { Auto, On, Off };

struct SamplingParams {
  float temperature = 0.0f;        // 0 = greedy
  int32_t top_k = 0;               // 0 = off
  float top_p = 1.0f;              // 1 = off
  float min_p = 0.0f;              // 0 = off; keeps candidates with p >= min_p * p(most likely)
  float repetition_penalty = 1.0f; // 1 = off
  int32_t penalty_window = 64;     // last ids the penalty looks at
  int32_t min_length = 0;          // end tokens suppressed while fewer tokens were generated
  // OpenAI's penalties on the tokens generated so far (the last state.generated ids of the history, not
  // the prompt), as vLLM applies them: logit -= presence * (count > 0) + frequency * count. 0 = off.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<std::pair<int32_t, float>> logit_bias = {};  // (token id, bias) added to the logits
  uint64_t seed = 0;
  SamplingDevice device = SamplingDevice::Auto;  // engine setting; the rules ignore it
};

// One candidate of a sampling distribution. The speculative rule computes in float32 from `weight`, the
// candidate's unnormalised float32 weight (the standard sampler's w_k, sampling_rule.hpp), so that the
// host and a backend's AcceptDrafts decide alike; a sampler that leaves it 0 gets the probability rounded
// to float32 instead.
struct TokenProbability {
  int32_t token = -1;
  double probability = 0;
  float weight = 0;
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
  // The distribution sample() draws from for these logits and state: every token with a nonzero
  // probability, most likely first (ties: lower id), the probabilities summing to 1; greedy: the token
  // sample() picks, with probability 1. Speculative sampling needs it (the engine accepts a draft d
  // with min(1, p(d) / q(d)), p from the target's logits, q from the drafter's, and otherwise samples
  // from norm(max(0, p - q))). The default serves greedy samplers only.
  virtual std::vector<TokenProbability> distribution(std::span<const float> logits, const SamplingState& state) const {
    if (params().temperature == 0.0f) return {{sample(logits, state, 0.0f), 1.0}};
    fail("this sampler plugin reports no distribution (Sampler::distribution), which speculative decoding at "
         "temperature {} needs; use temperature 0 or the standard sampler", params().temperature);
  }
  // Device form: appends the same rules to `graph` after `logits` (F32 [vocab]) and returns the token
  // as I32 [1], so that only the id leaves the backend. The graph reads two inputs the caller creates
  // and fills before each run: `ids`, I32 [n] holding device_ids(state) (Value{} when that is empty),
  // and `uniform`, F32 [1]. Graphs built for states with equal device_key() are the same graph and
  // may be run again with the new step's inputs. When `backend` lacks an op the rules need, returns
  // Value{} without touching `graph` and, if `why` is given, says which op.
  virtual Value sample_in_graph(Graph& graph, Value logits, Value ids, Value uniform, const SamplingState& state,
                                const ComputeBackend& backend, std::string* why = nullptr) const {
    (void)graph; (void)logits; (void)ids; (void)uniform; (void)state; (void)backend;
    if (why) *why = "the sampler has no device form";
    return {};
  }
  // Device form of a sampled speculative round's verdict (docs/sampling.md, "Speculative sampling"):
  // appends to `graph` the decision of `drafts` (I32 [n]) given the target's logits at [last, d_1..d_n]
  // (`target`, F32 [n + 1, vocab]) and the drafter's logits each draft was drawn from (`draft`, F32
  // [n, vocab], drawn by sample_in_graph with `state`), with `uniforms` (F32 [2n + 1]: acceptance and
  // residual per draft, then the bonus); returns I32 [n + 2] = [accepted a, the a + 1 tokens emitted,
  // -1 ...] (Op::AcceptDrafts). Every row is sampled under `state` (the rules must not depend on the
  // drafts: no penalty window, no end-token suppression). When it cannot (those rules in force, greedy, a
  // missing op), returns Value{} without touching `graph` and says why.
  virtual Value verify_in_graph(Graph& graph, Value target, Value draft, Value drafts, Value uniforms,
                                const SamplingState& state, const ComputeBackend& backend,
                                std::string* why = nullptr) const {
    (void)graph; (void)target; (void)draft; (void)drafts; (void)uniforms; (void)state; (void)backend;
    if (why) *why = "the sampler has no device form of the speculative verdict";
    return {};
  }
  // Host data of the `ids` input for this step (may be empty).
  virtual std::vector<int32_t> device_ids(const SamplingState& state) const {
    (void)state;
    return {};
  }
  // Everything the device graph's structure depends on for this state (parameters included).
  virtual std::string device_key(const SamplingState& state) const {
    (void)state;
    return {};
  }
};

}  // namespace specula
