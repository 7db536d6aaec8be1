// The acceptance replay (`specula bench --acceptance-profile`): what a speculative round costs at a chosen
// acceptance, on any target file, without weights that accept anything. The round runs as it always does
// (the drafter's graphs, the verification forward, rollback, host work), but its drafts are replaced
// before verification: draft i (1-based) is the target's own next token with probability a_i / a_(i-1)
// when drafts 1..i-1 were (a_0 = 1), else a token the target rejects. The profile a_1..a_K is the
// fraction of rounds whose first i drafts are all accepted (vLLM's and llama-server's per-position
// counts); past its last entry a_i = 0.
//
// The target's next tokens come from a plain greedy run of the same prompt (`greedy`): greedy
// speculative decoding emits exactly those tokens, so a planted token is accepted and any other is
// rejected, and the output stays plain greedy decoding's. A rejected draft is the reference token
// minus one (plus one for id 0). Greedy decoding only; a benchmark, which no pipeline key enables.
// The engine consults it once per round, after drafting, as its GenerationOptions::draft_hook.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "specula/compute.hpp"
#include "specula/core/generator.hpp"

namespace specula::core {

class AcceptanceReplay final : public DraftHook {
 public:
  // "0.844,0.599,0.385,0.271", or "0" (every draft rejected): each entry in [0, 1], none above the one
  // before. Throws specula::Error naming the entry at fault.
  static std::vector<double> parse_profile(std::string_view text);

  // `greedy`: the tokens of a plain greedy run of the same prompt, prompt first (the end token it stopped
  // on included), as long as the replayed generation may go. `backend` writes drafts the drafter kept
  // on the backend (DraftRequest::buffers); null when the drafts stay on the host.
  AcceptanceReplay(std::vector<double> profile, std::vector<int32_t> greedy, uint64_t seed,
                   ComputeBackend* backend = nullptr);

  // Replaces a round's drafts. `history`: the tokens so far, prompt first; its last one is the token the
  // round verifies first. Throws when `history` has left the greedy run (then the target's verification
  // did not reproduce its own plain greedy tokens, and no draft can be planted).
  void replace(std::span<const int32_t> history, std::span<int32_t> drafts);
  // The same for n drafts held on the backend (rows 0..n-1 of `held`, an I32 [N >= n, 1] tensor).
  void replace(std::span<const int32_t> history, int64_t n, BackendTensor& held);
  // Throws when `history` has left the greedy run (what replace() checks first).
  void check(std::span<const int32_t> history);

  // As the generation's DraftHook: greedy decoding only; each round's drafts replaced; the last round
  // too must have left plain greedy's tokens alone.
  void check(const SamplingParams& params) const override;
  void drafted(std::span<const int32_t> history, std::span<int32_t> drafts) override { replace(history, drafts); }
  void drafted(std::span<const int32_t> history, int64_t n, BackendTensor& held) override { replace(history, n, held); }
  void finished(std::span<const int32_t> history) override { check(history); }

  // Tokens a round of k drafts makes on average at `profile`: 1 + a_1 + ... + a_k.
  static double expected_tokens(std::span<const double> profile, int k);

 private:
  std::vector<int32_t> plan(std::span<const int32_t> history, int64_t n);
  double uniform();

  std::vector<double> profile_;
  std::vector<int32_t> greedy_;
  uint64_t state_;
  ComputeBackend* backend_;
};

}  // namespace specula::core
