#include "round_policy.hpp"

#include <algorithm>

#include "specula/error.hpp"

namespace specula::core {

namespace {

// The whole prompt is prefilled and its last row gives the first token; a round drafts at most what
// max_tokens leaves besides its own correction or bonus token; generation ends at max_tokens exactly.
class SpeculaRounds final : public RoundPolicy {
 public:
  void check(int64_t, const GenerationOptions&) const override {}
  int64_t prefilled(int64_t prompt_tokens) const override { return prompt_tokens; }
  int64_t draft_length(int64_t want, int64_t room, int64_t left) const override {
    return std::min<int64_t>({want, room - 1, left - 1});
  }
  bool samples_drafts() const override { return true; }
  bool rounds_on_backend() const override { return true; }
  bool ends(int64_t produced, int max_tokens, bool at_emit) const override { return at_emit && produced >= max_tokens; }
};

// llama.cpp's draft-mtp loop (examples/speculative-simple with common/speculative.cpp).
class LlamaCppRounds final : public RoundPolicy {
 public:
  void check(int64_t context_tokens, const GenerationOptions& options) const override {
    if (context_tokens < 2)
      fail("the llamacpp drafting convention drafts from the target's hidden state of the token before the "
           "prompt's last one: the context needs at least 2 tokens, got {}", context_tokens);
    if (options.draft_auto)
      fail("the llamacpp drafting convention drafts a fixed number of tokens per round as llama.cpp does; "
           "draft_tokens: auto is not available with it");
  }
  // Every prompt id but the last; the first round verifies [last prompt id, drafts].
  int64_t prefilled(int64_t prompt_tokens) const override { return prompt_tokens - 1; }
  // llama.cpp caps the draft only by a positive limit (common_speculative_draft); the context bound is
  // kept whatever it says, where llama.cpp would overflow its context.
  int64_t draft_length(int64_t want, int64_t room, int64_t left) const override {
    const int64_t limit = std::min(room - 2, left - 1);
    return std::min(limit > 0 ? std::min(want, limit) : want, room - 1);
  }
  // llama.cpp's draft sampler takes the top candidate at any temperature.
  bool samples_drafts() const override { return false; }
  // Rounds are decided from the target's logits, as llama.cpp does.
  bool rounds_on_backend() const override { return false; }
  // The round completes; generation stops after the round in which more than max_tokens were produced.
  bool ends(int64_t produced, int max_tokens, bool at_emit) const override { return !at_emit && produced > max_tokens; }
};

}  // namespace

std::unique_ptr<RoundPolicy> RoundPolicy::make(DraftConvention convention, bool drafter) {
  if (drafter && convention == DraftConvention::LlamaCpp) return std::make_unique<LlamaCppRounds>();
  return std::make_unique<SpeculaRounds>();
}

}  // namespace specula::core
