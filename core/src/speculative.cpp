#include "specula/core/speculative.hpp"

#include <unordered_map>

#include "specula/error.hpp"
#include "specula/sampling_rule.hpp"

namespace specula::core {

namespace {

// A candidate's float32 weight: the sampler's, else its probability rounded (TokenProbability::weight).
float weight_of(const TokenProbability& c) {
  return c.weight > 0.0f ? c.weight : static_cast<float>(c.probability);
}

struct Weights {
  std::vector<float> w;
  float mass = 0.0f;  // left to right, as the rule sums
};

Weights weights(const Distribution& d) {
  Weights out;
  out.w.reserve(d.size());
  for (const TokenProbability& c : d) {
    out.w.push_back(weight_of(c));
    out.mass += out.w.back();
  }
  return out;
}

}  // namespace

int32_t draw(const Distribution& d, float u) {
  if (d.empty()) fail("speculative sampling: a draw from an empty distribution");
  const Weights w = weights(d);
  return d[pick_by_weight(w.w, w.mass, u)].token;
}

double probability(const Distribution& d, int32_t token) {
  for (const TokenProbability& c : d)
    if (c.token == token) return c.probability;
  return 0;
}

Verdict accept_draft(const Distribution& p, const Distribution& q, int32_t draft, float u_accept, float u_residual) {
  if (p.empty()) fail("speculative sampling: the target's distribution is empty");
  // q's weights by token; an empty q is a point mass on the draft (weight 1, mass 1).
  std::unordered_map<int32_t, float> qw;
  float q_mass = 1.0f;
  if (q.empty()) {
    qw[draft] = 1.0f;
  } else {
    const Weights w = weights(q);
    for (size_t i = 0; i < q.size(); ++i) qw.emplace(q[i].token, w.w[i]);
    q_mass = w.mass;
  }
  const auto q_of = [&](int32_t t) {
    const auto it = qw.find(t);
    return it == qw.end() ? 0.0f : it->second;
  };
  const float qd = q_of(draft);
  if (!(qd > 0.0f))
    fail("speculative sampling: the draft {} has probability 0 in the drafter's own distribution", draft);
  const Weights pw = weights(p);
  std::vector<float> q_of_p(p.size());
  float pd = 0.0f;
  for (size_t k = 0; k < p.size(); ++k) {
    q_of_p[k] = q_of(p[k].token);
    if (p[k].token == draft && pd == 0.0f) pd = pw.w[k];
  }
  const int64_t v = speculative_verdict(pw.w, pw.mass, q_of_p, pd, qd, q_mass, u_accept, u_residual);
  if (v < 0) return {true, draft};
  return {false, p[static_cast<size_t>(v)].token};
}

}  // namespace specula::core
