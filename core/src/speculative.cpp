#include "specula/core/speculative.hpp"

#include <unordered_map>

#include "specula/error.hpp"

namespace specula::core {

int32_t draw(const Distribution& d, double u) {
  if (d.empty()) fail("speculative sampling: a draw from an empty distribution");
  double total = 0;
  for (const TokenProbability& c : d) total += c.probability;
  const double target = u * total;
  double cum = 0;
  for (const TokenProbability& c : d) {
    cum += c.probability;
    if (cum > target) return c.token;
  }
  return d.back().token;
}

double probability(const Distribution& d, int32_t token) {
  for (const TokenProbability& c : d)
    if (c.token == token) return c.probability;
  return 0;
}

Verdict accept_draft(const Distribution& p, const Distribution& q, int32_t draft, double u_accept, double u_residual) {
  const double pd = probability(p, draft);
  const double qd = q.empty() ? 1.0 : probability(q, draft);
  if (!(qd > 0))
    fail("speculative sampling: the draft {} has probability 0 in the drafter's own distribution", draft);
  if (u_accept * qd < pd) return {true, draft};
  std::unordered_map<int32_t, double> qs;
  if (q.empty()) qs[draft] = 1.0;
  for (const TokenProbability& c : q) qs[c.token] = c.probability;
  Distribution residual;
  for (const TokenProbability& c : p) {
    const auto it = qs.find(c.token);
    const double r = c.probability - (it == qs.end() ? 0.0 : it->second);
    if (r > 0) residual.push_back({c.token, r});
  }
  return {false, draw(residual.empty() ? p : residual, u_residual)};
}

}  // namespace specula::core
