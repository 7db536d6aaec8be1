// The speculative sampling rule (Leviathan et al. 2023, Chen et al. 2023). With p the target's
// distribution at a position and q the drafter's, a draft d drawn from q is accepted with probability
// min(1, p(d) / q(d)); a rejected draft is replaced by a draw from norm(max(0, p - q)). Whatever q is,
// the emitted token is then distributed exactly as p, so drafting never changes what is generated in
// distribution. Greedy decoding is the case of one-hot p and q: accept when d is the target's choice,
// else emit that choice. docs/sampling.md, "Speculative sampling".
#pragma once

#include <cstdint>
#include <vector>

#include "specula/sampler.hpp"

namespace specula::core {

// Candidates with their probabilities (Sampler::distribution); need not sum to 1 where noted.
using Distribution = std::vector<TokenProbability>;

// The first candidate, in order, whose cumulative weight exceeds u * (the total): an inverse-CDF draw
// for u in [0, 1), in float32 over TokenProbability::weight (specula::pick_by_weight, as the device's
// TopPDraw draws). Throws when `d` is empty.
int32_t draw(const Distribution& d, float u);

// The probability of `token` in `d` (0 when absent).
double probability(const Distribution& d, int32_t token);

struct Verdict {
  bool accepted = false;
  int32_t token = -1;  // the draft when accepted, else the replacement
};

// Decides one draft: accepted when u_accept * q(d) < p(d), else the replacement drawn with u_residual
// from max(0, p - q) (from p when that is empty, i.e. p = q up to rounding). An empty `q` is a point
// mass on `draft` (a drafter without a distribution, or greedy drafting). Computed in float32 over the
// candidates' weights by specula::speculative_verdict, the rule a backend's AcceptDrafts follows, so a
// round decided on the host and one decided on the backend emit the same tokens.
Verdict accept_draft(const Distribution& p, const Distribution& q, int32_t draft, float u_accept, float u_residual);

}  // namespace specula::core
