// The adaptive draft length: its cost model on measured figures, its choices at the extremes, and the
// engine with draft_auto, whose greedy output must stay plain greedy's whatever lengths it picks.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>

#include "specula/core/draft_length.hpp"
#include "specula/core/generator.hpp"
#include "toy.hpp"

using specula::core::DraftLength;

namespace {

// Steps of every length 1..max whose first `accepted(n)` drafts are accepted, verify(rows) = cost(rows).
template <class Accepted, class Cost>
void feed(DraftLength& p, int max, int rounds, Accepted accepted, Cost cost, double draft_per_token = 0) {
  for (int k = 0; k < rounds; ++k)
    for (int n = 1; n <= max; ++n) p.observe_step(n, accepted(n), n * draft_per_token, cost(n + 1));
}

}  // namespace

TEST(DraftLength, StartsAtTheInitialLengthUntilAStepIsMeasured) {
  DraftLength p(8, 3);
  EXPECT_EQ(p.next(), 3);
  EXPECT_EQ(p.next(), 3);
  EXPECT_LT(p.verify_seconds(4), 0);
  EXPECT_EQ(p.tokens_per_second(3), 0);
}

TEST(DraftLength, InterpolatesAndExtrapolatesVerificationCosts) {
  DraftLength p(8, 3);
  p.observe_plain(0.100);
  p.observe_step(4, 0, 0, 0.180);  // 5 rows
  EXPECT_DOUBLE_EQ(p.verify_seconds(1), 0.100);
  EXPECT_DOUBLE_EQ(p.verify_seconds(5), 0.180);
  EXPECT_NEAR(p.verify_seconds(3), 0.140, 1e-12);              // on the line between the two
  EXPECT_NEAR(p.verify_seconds(7), 0.180 + 2 * 0.020, 1e-12);  // along the last slope
}

TEST(DraftLength, ExpectedRateFollowsTheAcceptanceChain) {
  DraftLength p(4, 2);
  // Position 1 always accepted, position 2 never: tokens(1) -> 2, tokens(2) -> 2 as well.
  for (int k = 0; k < 60; ++k) p.observe_step(2, 1, 0, 0.1);
  // Each position leans on the estimate before it (the first on the pooled acceptance, here about a half),
  // worth 4 observations against about 35 recent ones.
  const double a1 = p.acceptance(1), a2 = p.acceptance(2);
  EXPECT_GT(a1, 0.94);
  EXPECT_LT(a2, 0.1);
  EXPECT_NEAR(p.tokens_per_second(2), (1 + a1 + a1 * a2) / 0.1, 1e-9);
}

TEST(DraftLength, DraftsLongWhenDraftsAreAcceptedAndVerificationIsCheap) {
  DraftLength p(8, 3);
  p.observe_plain(0.100);
  feed(p, 8, 40, [](int n) { return n; }, [](int rows) { return 0.100 + 0.005 * (rows - 1); }, 0.002);
  EXPECT_EQ(p.best(), 8);
}

TEST(DraftLength, StopsDraftingWhenDraftsAreRejected) {
  DraftLength p(8, 3);
  p.observe_plain(0.100);
  feed(p, 8, 40, [](int) { return 0; }, [](int rows) { return 0.100 + 0.03 * (rows - 1); }, 0.002);
  EXPECT_EQ(p.best(), 0);
  // Trying one draft again costs a draft and a 2-row forward over a plain step for nothing (0.32 of a
  // step here): the tries grow rarer (every 8th step while a length pays, then 16, 32, 64) and come no
  // oftener than keeps them under 1 % of the time (every 33 steps here): at steps 33, 65, 98, 162, 226.
  int tries = 0;
  for (int k = 0; k < 256; ++k) {
    const int n = p.next();
    if (n > 0) {
      ++tries;
      p.observe_step(n, 0, 0.002, 0.130);
    } else {
      p.observe_plain(0.100);
    }
  }
  EXPECT_EQ(tries, 5);
}

TEST(DraftLength, AnExpensiveDrafterIsTriedRarelyWhenNothingIsAccepted) {
  // 26B-A4B Q4_K_M on a 2-core CPU with the dense-head drafter, acceptance 0 (a replay): a plain step 57
  // ms, a draft token 10 ms, forwards of 2 and 4 rows 82 and 107 ms. Tries at steps 8, 24 and 56 (the
  // pace for a cheap drafter) made 96 tokens 0.95x plain; the budget allows the first step and one try.
  DraftLength p(8, 3);
  double spent = 0, plain_time = 0;
  int drafted = 0;
  for (int k = 0; k < 96; ++k) {
    const int n = p.next();
    const double verify = n == 0 ? 0.057 : n == 1 ? 0.082 : 0.057 + 0.0167 * n;
    if (n > 0) {
      ++drafted;
      p.observe_step(n, 0, 0.010 * n, verify);
    } else {
      p.observe_plain(verify);
    }
    spent += verify + 0.010 * n;
    plain_time += 0.057;
  }
  EXPECT_LE(drafted, 2) << "the first step and at most one try";
  EXPECT_GE(plain_time / spent, 0.97) << "drafting that never pays costs at most 3 %";
  EXPECT_EQ(p.best(), 0);
}

TEST(DraftLength, OneEarlyRejectionDoesNotShortenTheDrafts) {
  // The E2B replay at vLLM's profile: its first step (3 drafts) accepted one. Read as "position 2 is
  // rejected", that made one draft the best for a dozen steps (1.9x against 2.2x for a fixed 3).
  DraftLength p(8, 3);
  ASSERT_EQ(p.next(), 3);
  p.observe_step(3, 1, 0.0017, 0.038);
  EXPECT_EQ(p.next(), 3);
  EXPECT_GT(p.acceptance(2), 0.4);
}

TEST(DraftLength, NearTheBestFixedLengthAtVllmsAcceptance) {
  // 100 runs of 128 tokens at vLLM's 26B-A4B profile with E2B Q4_K_M's measured costs (the 2-core Zen 5
  // VM): forwards of 1..9 rows, a draft token 0.55 ms. `auto` starts knowing nothing each run; it must
  // come within 4 % of the best fixed length chosen with hindsight (it gave 0.946 of it before the
  // acceptance estimates leaned on each other and the first steps kept the initial length; now 0.968).
  const double verify[] = {0, 31.5, 32.5, 34.5, 38.5, 41.0, 45.0, 49.0, 60.0, 61.6};
  const double profile[] = {0.844, 0.599, 0.385, 0.271};
  auto conditional = [&](int i) {
    i = std::min(i, 4);
    return profile[i - 1] / (i == 1 ? 1 : profile[i - 2]);
  };
  std::mt19937 rng(35);
  auto uniform = [&] { return rng() / 4294967296.0; };  // the raw engine: the same draws on every library
  auto rate = [&](int fixed) {  // tokens per second; fixed < 0: auto
    double tokens = 0, seconds = 0;
    for (int r = 0; r < 100; ++r) {
      DraftLength p(8, 3);
      for (int made = 0; made < 128;) {
        const int n = fixed < 0 ? p.next() : fixed;
        int accepted = 0;
        while (accepted < n && uniform() < conditional(accepted + 1)) ++accepted;
        const double draft = 0.00055 * n, v = verify[n + 1] / 1000;
        if (n == 0) p.observe_plain(v);
        else p.observe_step(n, accepted, draft, v);
        made += accepted + 1, tokens += accepted + 1, seconds += draft + v;
      }
    }
    return tokens / seconds;
  };
  double best = 0;
  for (int k = 1; k <= 8; ++k) best = std::max(best, rate(k));
  EXPECT_GT(best * verify[1] / 1000, 2.2) << "the best fixed length: over 2.2x a plain step";
  EXPECT_GE(rate(-1) / best, 0.96);
}

TEST(DraftLength, ASlowFirstPlainStepDoesNotMakeDraftingLookFree) {
  // Seen on the E2B Q4_K_M replay at profile 0 (every draft rejected): the first plain step took 40 ms,
  // the later ones 32, a forward of 2 rows 35. Believing plain steps cost 40 ms, one draft looked
  // cheaper than none and ran for most of the 128 steps (0.93x plain speed).
  DraftLength p(8, 3);
  int drafted = 0, plain = 0;
  for (int k = 0; k < 128; ++k) {
    const int n = p.next();
    if (n > 0) {
      ++drafted;
      p.observe_step(n, 0, 0.0006 * n, 0.032 + 0.003 * n);
    } else {
      p.observe_plain(plain++ == 0 ? 0.040 : 0.032);
    }
  }
  EXPECT_LE(drafted, 8) << "the tries of a rejected length: the first step, then at growing intervals";
  EXPECT_NEAR(p.verify_seconds(1), 0.032, 0.0005);
  EXPECT_EQ(p.best(), 0);
}

TEST(DraftLength, VerificationCostsNeverFallWithMoreRows) {
  DraftLength p(8, 3);
  p.observe_plain(0.050);          // slower than the 3-row forward below: capped by it
  p.observe_step(2, 0, 0, 0.040);  // 3 rows
  p.observe_step(5, 0, 0, 0.060);  // 6 rows
  EXPECT_DOUBLE_EQ(p.verify_seconds(1), 0.040);
  EXPECT_DOUBLE_EQ(p.verify_seconds(2), 0.040);
  EXPECT_DOUBLE_EQ(p.verify_seconds(3), 0.040);
  EXPECT_NEAR(p.verify_seconds(4), 0.040 + 0.020 / 3, 1e-12);
  EXPECT_EQ(p.next(), 0) << "the plain step's timing is suspect: it is timed again";
}

TEST(DraftLength, PicksTheLengthWithTheBestExpectedRate) {
  // Acceptance 1, 1, 0 at positions 1, 2, 3 and verification that grows steeply past 3 rows: 2 drafts
  // give 3 tokens for 0.11 s; 1 draft 2 for 0.105; 3 drafts 3 for 0.2.
  DraftLength p(6, 1);
  p.observe_plain(0.100);
  feed(p, 6, 40, [](int n) { return n < 2 ? n : 2; },
       [](int rows) { return rows <= 3 ? 0.100 + 0.005 * (rows - 1) : 0.200 + 0.05 * (rows - 4); });
  EXPECT_EQ(p.best(), 2);
  // Every eighth pick tries a neighbour; the others take the best.
  int best = 0, neighbours = 0;
  for (int k = 0; k < 32; ++k) {
    const int n = p.next();
    best += n == 2;
    neighbours += n == 1 || n == 3;
  }
  EXPECT_EQ(best + neighbours, 32);
  EXPECT_EQ(neighbours, 4);
}

TEST(DraftLength, RefusesAMaximumOutOfRange) {
  EXPECT_THROW(DraftLength(0, 1), std::exception);
  EXPECT_THROW(DraftLength(DraftLength::kMax + 1, 1), std::exception);
}

TEST(Generator, AdaptiveDraftLengthKeepsGreedyOutput) {
  toy::Config c;
  c.end_tokens = {};
  const std::vector<int32_t> prompt = {5, 9, 17, 3, 22};
  auto generate = [&](bool drafter, bool adaptive, int error_every) {
    auto model = std::make_shared<toy::Model>(c);
    specula::core::Generator gen(model, std::make_shared<toy::Sampler>(specula::SamplingParams{}),
                                 drafter ? std::make_shared<toy::Drafter>(c, error_every) : nullptr);
    specula::core::GenerationOptions o;
    o.max_tokens = 80;
    o.draft_auto = adaptive;
    o.draft_max = 6;
    return gen.generate(prompt, o);
  };
  const auto plain = generate(false, false, 0);
  for (int error_every : {0, 2, 5}) {
    SCOPED_TRACE(testing::Message() << "error_every=" << error_every);
    const auto r = generate(true, true, error_every);
    EXPECT_EQ(r.tokens, plain.tokens);
    const auto& st = r.stats;
    // The statistics add up: steps by length, drafts by position.
    int64_t spec = 0, drafted = 0;
    for (size_t n = 1; n < st.steps_by_draft_length.size(); ++n) {
      spec += st.steps_by_draft_length[n];
      drafted += static_cast<int64_t>(n) * st.steps_by_draft_length[n];
    }
    EXPECT_EQ(spec, st.speculative_steps);
    EXPECT_EQ(drafted, st.drafted_tokens);
    EXPECT_LE(st.steps_by_draft_length.size(), 7u) << "never beyond draft_max";
    EXPECT_EQ(std::accumulate(st.drafted_by_position.begin(), st.drafted_by_position.end(), int64_t{0}), drafted);
    EXPECT_EQ(std::accumulate(st.accepted_by_position.begin(), st.accepted_by_position.end(), int64_t{0}),
              st.accepted_tokens);
    for (size_t i = 1; i < st.accepted_by_position.size(); ++i)
      EXPECT_LE(st.accepted_by_position[i], st.accepted_by_position[i - 1]) << "a draft follows accepted ones";
    if (error_every == 0) {
      EXPECT_EQ(st.accepted_tokens, st.drafted_tokens);
    }
  }
}
