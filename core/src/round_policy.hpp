// The conventions a speculative loop can follow (GenerationOptions::convention): Specula's own and
// llama.cpp's draft-mtp loop. The generation asks its RoundPolicy at the few points where they differ
// (docs/gemma4-assistant.md, "Conventions", lists them) and runs one code path otherwise.
#pragma once

#include <cstdint>
#include <memory>

#include "specula/core/generator.hpp"

namespace specula::core {

class RoundPolicy {
 public:
  virtual ~RoundPolicy() = default;
  // The policy of `convention` for a generation with (or without) a drafter; without one, Specula's.
  static std::unique_ptr<RoundPolicy> make(DraftConvention convention, bool drafter);

  // Throws when the options cannot run under this convention; `context_tokens`: what the context will
  // hold after the prompt.
  virtual void check(int64_t context_tokens, const GenerationOptions& options) const = 0;
  // Prompt tokens the prefill processes. The rest (at most the last one) the first round verifies, and
  // then the prefill samples no first token.
  virtual int64_t prefilled(int64_t prompt_tokens) const = 0;
  // The drafts a round asks for: `want` (the draft length's choice), bounded by the positions the context
  // can still take (`room` >= 1) and the tokens max_tokens still allows (`left`).
  virtual int64_t draft_length(int64_t want, int64_t room, int64_t left) const = 0;
  // Drafts sampled from the drafter's distribution at temperature > 0 (else greedy drafts at any).
  virtual bool samples_drafts() const = 0;
  // Rounds may keep their drafts and verdict on the backend (ModelContext::prepare_round, Model::verify).
  virtual bool rounds_on_backend() const = 0;
  // Whether max_tokens ends generation once `produced` tokens were emitted: asked as each token is emitted
  // (`at_emit`) and after each speculative round.
  virtual bool ends(int64_t produced, int max_tokens, bool at_emit) const = 0;
};

}  // namespace specula::core
