#include "specula/core/draft_length.hpp"

#include <algorithm>
#include <cmath>

#include "specula/error.hpp"

namespace specula::core {

namespace {
constexpr double kDecay = 0.98;       // weight of the past per new observation (about the last 50 steps)
constexpr double kPooledPrior = 2;    // observations the even-chance prior of the pooled acceptance is worth
constexpr double kChainPrior = 4;     // observations the estimate of the position before is worth to a position
constexpr int kHoldSteps = 4;         // steps that keep the initial length while drafting looks like it pays
constexpr double kRowSlope = 0.15;   // extra cost per verified row, relative to a step, before two are measured
constexpr double kFirstTiming = 0.25; // the weight of a length's first timing: often a warm-up, slower than the rest
constexpr double kTryShare = 0.01;    // while drafting does not pay, the most of the time its tries may cost
constexpr int64_t kTryEveryMax = 256; // ... yet one try in this many steps at least, to notice a change
}  // namespace

void DraftLength::Mean::add(double x, double first) {
  const double past = weight * kDecay, now = weight > 0 ? 1 : first;
  value = (value * past + x * now) / (past + now);
  weight = past + now;
}

DraftLength::DraftLength(int max_tokens, int initial) : max_(max_tokens), initial_(initial) {
  if (max_tokens < 1 || max_tokens > kMax) fail("adaptive draft length: draft_max must be in [1, {}], got {}", kMax, max_tokens);
  initial_ = std::clamp(initial, 0, max_);
}

double DraftLength::acceptance(int position) const {
  // Few rounds reach the later positions: each position's estimate leans on the one before it, the first
  // on the acceptance of all positions pooled (itself on an even chance). A drafter's acceptance changes
  // slowly along the draft (vLLM's 26B-A4B profile: 0.84, 0.71, 0.64, 0.70), and without the lean one
  // early rejection at position 2 made one draft look best for the next dozen steps (E2B replay, 1.9x
  // where a fixed length gave 2.2x).
  double seen = 0, accepted = 0;
  for (int i = 1; i <= max_; ++i) seen += accepted_[i].weight, accepted += accepted_[i].value * accepted_[i].weight;
  double prior = (accepted + 0.5 * kPooledPrior) / (seen + kPooledPrior);
  for (int i = 1; i <= position && i <= max_; ++i) {
    const Mean& m = accepted_[i];
    prior = (m.value * m.weight + prior * kChainPrior) / (m.weight + kChainPrior);
  }
  return prior;
}

double DraftLength::estimate(int rows) const {
  // The measured lengths nearest below and above `rows`.
  int lo = -1, hi = -1;
  for (int r = rows; r >= 1 && lo < 0; --r)
    if (verify_[r].weight > 0) lo = r;
  for (int r = rows; r <= max_ + 1 && hi < 0; ++r)
    if (verify_[r].weight > 0) hi = r;
  if (lo == rows) return verify_[rows].value;
  if (lo > 0 && hi > 0)
    return verify_[lo].value + (verify_[hi].value - verify_[lo].value) * (rows - lo) / (hi - lo);
  const int near = lo > 0 ? lo : hi;
  if (near < 0) return -1;
  // Outside the measured range: the slope between the two nearest measured lengths on that side, or
  // the prior slope with one; never below a tenth of the nearest.
  int other = -1;
  for (int r = near + (lo > 0 ? -1 : 1); r >= 1 && r <= max_ + 1 && other < 0; r += lo > 0 ? -1 : 1)
    if (verify_[r].weight > 0) other = r;
  const double v = verify_[near].value;
  double slope = other > 0 ? (v - verify_[other].value) / (near - other) : kRowSlope * v / (1 + kRowSlope * (near - 1));
  slope = std::max(slope, 0.0);
  return std::max(0.1 * v, v + slope * (rows - near));
}

double DraftLength::verify_seconds(int rows) const {
  // A forward over more rows never costs less than over fewer: a measurement above one of more rows (a
  // slow first step, a noisy neighbour) is capped by it, else drafting would look free until it decays.
  double v = estimate(rows);
  for (int r = rows + 1; r <= max_ + 1; ++r)
    if (verify_[r].weight > 0 && (v < 0 || verify_[r].value < v)) v = verify_[r].value;
  return v;
}

double DraftLength::tokens_per_second(int n) const {
  const double verify = verify_seconds(n + 1);
  if (verify <= 0) return 0;
  double tokens = 1, chain = 1;
  for (int i = 1; i <= n; ++i) tokens += chain *= acceptance(i);
  const double time = verify + n * (draft_per_token_.weight > 0 ? draft_per_token_.value : 0);
  return tokens / time;
}

int DraftLength::best() const {
  int best = initial_;
  double rate = tokens_per_second(best);
  for (int n = 0; n <= max_; ++n) {
    const double r = tokens_per_second(n);
    if (r > rate) best = n, rate = r;
  }
  return best;
}

int64_t DraftLength::try_pace() const {
  // A try of one draft costs a draft token and a 2-row forward over a plain step.
  const double step = verify_seconds(1), two = verify_seconds(2);
  if (step <= 0 || two <= 0) return 0;
  const double cost = draft_per_token_.value + std::max(0.0, two - step);
  return std::min<int64_t>(kTryEveryMax, static_cast<int64_t>(std::ceil(cost / (kTryShare * step))));
}

int DraftLength::next() {
  ++steps_;
  const int n = pick();
  if (n > 0) last_draft_ = steps_;
  return n;
}

int DraftLength::pick() {
  bool measured = false;
  for (const Mean& m : verify_) measured = measured || m.weight > 0;
  if (!measured) return initial_;
  // A plain step timed slower than a longer forward (a warm-up, a noisy neighbour) is timed again, a
  // couple of times, rather than left to decay while the cap above makes one draft look free.
  if (verify_[1].weight > 0 && verify_[1].weight < 2 && verify_[1].value > verify_seconds(1)) return 0;
  const int b = best();
  // The first steps' acceptance is a handful of draws: the initial length is kept for a few steps unless
  // drafting already looks like it does not pay (an expensive drafter at low acceptance stops at once).
  if (drafted_steps_ < kHoldSteps && b > 0) return initial_;
  // While drafting does not pay (b = 0) each try of one draft costs about a step's verification for
  // nothing, so the tries grow rarer (every 8, 16, ... 64 steps); a length that pays resets the pace.
  explore_every_ = b > 0 ? 8 : explore_every_;
  if (steps_ < next_explore_) return b;
  if (b == 0) {
    // ... and no oftener than keeps their cost under kTryShare of the time: with a drafter that costs a
    // sixth of a step a token and a 2-row forward 1.4 steps (26B-A4B on a CPU, the dense head), tries at
    // steps 8, 24 and 56 cost 4 % of a 96-token run at acceptance 0. A postponed try is not yet a try.
    const int64_t earliest = last_draft_ + try_pace();
    if (steps_ < earliest) {
      next_explore_ = earliest;
      return 0;
    }
    explore_every_ = std::min(2 * explore_every_, 64);
  }
  next_explore_ = steps_ + explore_every_;
  explore_up_ = !explore_up_;
  const int n = explore_up_ ? b + 1 : b - 1;
  return n < 0 ? std::min(1, max_) : n > max_ ? b - 1 : n;  // at an end of the range, its one neighbour
}

void DraftLength::observe_step(int n, int accepted, double draft_seconds, double verify_seconds) {
  if (n < 1 || n > max_ || accepted < 0 || accepted > n) return;
  ++drafted_steps_;
  verify_[n + 1].add(verify_seconds, kFirstTiming);
  draft_per_token_.add(draft_seconds / n, kFirstTiming);
  for (int i = 1; i <= n && i <= accepted + 1; ++i) accepted_[i].add(i <= accepted ? 1.0 : 0.0);
}

void DraftLength::observe_plain(double seconds) { verify_[1].add(seconds, kFirstTiming); }

}  // namespace specula::core
