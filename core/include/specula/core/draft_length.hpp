// The adaptive draft length (`draft_tokens: auto`): before each speculative step, picks how many tokens
// to draft (0 = a plain decode step) from what the steps so far measured: the time of a target forward
// over n positions, the drafter's time per token, and the acceptance of each draft position given that
// the drafts before it were accepted. The pick maximises expected tokens per second:
//   tokens(K) = 1 + a1 + a1 a2 + ... + a1 ... aK,   time(K) = K draft + verify(K + 1),
// with verify(1) the plain decode step. Unmeasured costs are interpolated (or extrapolated along the
// last measured slope) and capped by any measured longer forward; a length's first timing counts a
// quarter (often a warm-up), and a plain step timed slower than a longer forward is timed again at once.
// Each position's acceptance leans on the position before it (the first on all positions pooled), and
// the first four steps keep the initial length unless drafting looks like it does not pay at all.
// Every eighth step tries a neighbour of the best length so its estimates stay
// current (while plain decoding is the best, every 16th, 32nd, then 64th, and no oftener than keeps the
// tries under 1 % of the time: an expensive drafter is tried more rarely, at least once in 256 steps).
// The choice never changes greedy output: verification decides every token.
#pragma once

#include <array>
#include <cstdint>

namespace specula::core {

class DraftLength {
 public:
  static constexpr int kMax = 16;
  // Draft lengths in [0, max_tokens]; `initial` until a step has been measured.
  explicit DraftLength(int max_tokens = 8, int initial = 3);

  int next();
  // A speculative step: n drafts, the first `accepted` accepted; its drafting and verification times.
  void observe_step(int n, int accepted, double draft_seconds, double verify_seconds);
  // A plain decode step (one target forward and sampling).
  void observe_plain(double seconds);

  // The current estimates (exposed for tests and statistics).
  double acceptance(int position) const;  // P(draft `position` accepted | the ones before were), 1-based
  double verify_seconds(int rows) const;  // a forward over `rows` positions; < 0 while nothing is measured
  double tokens_per_second(int n) const;  // expected, with n drafts; 0 while nothing is measured
  int best() const;                       // the length tokens_per_second favours

 private:
  struct Mean {
    double value = 0, weight = 0;  // exponentially weighted: recent steps count more
    void add(double x, double first = 1);  // `first`: the weight of the first observation
  };
  double estimate(int rows) const;  // verify_seconds before the cap by longer forwards
  int pick();                       // next()'s choice
  int64_t try_pace() const;         // the fewest steps between tries while plain decoding is the best
  int max_, initial_;
  int64_t steps_ = 0;
  int64_t next_explore_ = 8;  // the step that tries a neighbour of the best length
  int64_t last_draft_ = 0;    // the last step that drafted
  int64_t drafted_steps_ = 0; // speculative steps observed
  int explore_every_ = 8;
  bool explore_up_ = true;
  std::array<Mean, kMax + 2> verify_{};     // by forward rows (1 = plain step)
  Mean draft_per_token_;
  std::array<Mean, kMax + 1> accepted_{};   // by position: 1 if accepted, 0 if rejected (when reached)
};

}  // namespace specula::core
