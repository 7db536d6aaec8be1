// The acceptance replay (core/include/specula/core/acceptance_replay.hpp) on the toy target: the drafts it
// plants are accepted exactly as its profile says (every round at 0 and at 1, per position within the
// binomial bounds over a few thousand rounds at 0.8,0.5), the output is always plain greedy decoding's,
// the draws are the seed's, and what it cannot do (sampled decoding, a greedy run that is not the
// target's) is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "specula/core/acceptance_replay.hpp"
#include "specula/core/generator.hpp"
#include "specula/error.hpp"
#include "toy.hpp"

using specula::core::AcceptanceReplay;
using specula::core::GenerationOptions;
using specula::core::GenerationResult;
using specula::core::Generator;
using specula::core::RoundTrace;

namespace {

const std::vector<int32_t> kReplayPrompt = {5, 9, 17, 3, 22};

toy::Config replay_config() {
  toy::Config c;
  c.end_tokens = {};  // runs go to max_tokens
  c.context_length = 8192;
  return c;
}

// The prompt, then plain greedy decoding's tokens: what the replay plants from.
std::vector<int32_t> greedy_run(const toy::Config& c, int max_tokens) {
  auto model = std::make_shared<toy::Model>(c);
  GenerationOptions o;
  o.max_tokens = max_tokens;
  const GenerationResult r = Generator(model, std::make_shared<toy::Sampler>(specula::SamplingParams{})).generate(kReplayPrompt, o);
  std::vector<int32_t> run = kReplayPrompt;
  run.insert(run.end(), r.tokens.begin(), r.tokens.end());
  return run;
}

struct Replayed {
  GenerationResult result;
  std::vector<RoundTrace> rounds;
};

// A replayed generation with the toy drafter (which errs every `error_every`-th position: its own drafts
// would be accepted at another rate than the profile's).
Replayed replay(const toy::Config& c, const std::vector<double>& profile, const std::vector<int32_t>& greedy,
                GenerationOptions o, uint64_t seed = 1, specula::SamplingParams sp = {}) {
  auto model = std::make_shared<toy::Model>(c);
  AcceptanceReplay r(profile, greedy, seed);
  o.draft_hook = &r;
  Replayed out;
  o.on_round = [&](const RoundTrace& t) { out.rounds.push_back(t); };
  out.result = Generator(model, std::make_shared<toy::Sampler>(sp), std::make_shared<toy::Drafter>(c, 3))
                   .generate(kReplayPrompt, o);
  return out;
}

std::vector<int32_t> generated(const std::vector<int32_t>& greedy, size_t n) {
  return {greedy.begin() + static_cast<std::ptrdiff_t>(kReplayPrompt.size()),
          greedy.begin() + static_cast<std::ptrdiff_t>(kReplayPrompt.size() + n)};
}

// k successes in n trials of probability p, within 4.5 standard deviations (exact at p = 0 and 1).
void expect_binomial(int64_t k, int64_t n, double p, const std::string& what) {
  ASSERT_GT(n, 0) << what;
  const double bound = 4.5 * std::sqrt(p * (1 - p) / static_cast<double>(n));
  EXPECT_NEAR(static_cast<double>(k) / static_cast<double>(n), p, bound) << what << ": " << k << " of " << n;
}

}  // namespace

TEST(AcceptanceReplay, ParsesProfilesAndNamesTheEntryAtFault) {
  EXPECT_EQ(AcceptanceReplay::parse_profile("0.844,0.599,0.385,0.271"), (std::vector<double>{0.844, 0.599, 0.385, 0.271}));
  EXPECT_EQ(AcceptanceReplay::parse_profile("0"), std::vector<double>{0.0});
  EXPECT_EQ(AcceptanceReplay::parse_profile("1, 1,1"), (std::vector<double>{1, 1, 1}));
  const std::pair<const char*, const char*> bad[] = {
      {"0.5,0.6", "entry 2 (0.6) is above entry 1 (0.5)"},
      {"1.2", "entry 1 is 1.2, outside [0, 1]"},
      {"0.8,-0.1", "entry 2 is -0.1, outside [0, 1]"},
      {"0.8,,0.2", "entry 2 ('') is not a number"},
      {"0.8,x", "entry 2 ('x') is not a number"},
      {"", "entry 1 ('') is not a number"},
      {"nan", "entry 1 ('nan') is not a number"},
  };
  for (const auto& [text, want] : bad) {
    try {
      AcceptanceReplay::parse_profile(text);
      ADD_FAILURE() << "'" << text << "' was accepted";
    } catch (const specula::Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
  EXPECT_DOUBLE_EQ(AcceptanceReplay::expected_tokens(std::vector<double>{0.8, 0.5}, 3), 2.3);
  EXPECT_DOUBLE_EQ(AcceptanceReplay::expected_tokens(std::vector<double>{0.8, 0.5}, 1), 1.8);
  EXPECT_DOUBLE_EQ(AcceptanceReplay::expected_tokens(std::vector<double>{0.8, 0.5}, 0), 1.0);
}

// Profile 0 rejects every planted draft, profile 1 accepts every one, whatever the drafter would have
// proposed; the tokens are plain greedy decoding's either way.
TEST(AcceptanceReplay, ProfilesZeroAndOneRejectAndAcceptEveryDraft) {
  const toy::Config c = replay_config();
  const int max = 60;
  const std::vector<int32_t> greedy = greedy_run(c, max);
  for (int k : {1, 3, 5}) {
    GenerationOptions o;
    o.max_tokens = max;
    o.draft_tokens = k;
    const Replayed none = replay(c, {0}, greedy, o);
    EXPECT_EQ(none.result.tokens, generated(greedy, max)) << "K = " << k;
    EXPECT_GT(none.result.stats.drafted_tokens, 0) << "K = " << k;
    EXPECT_EQ(none.result.stats.accepted_tokens, 0) << "K = " << k;
    ASSERT_FALSE(none.rounds.empty());
    for (const RoundTrace& t : none.rounds) {
      EXPECT_EQ(t.accepted, 0) << "K = " << k << " round " << t.round;
      EXPECT_NE(t.draft[0], t.target_greedy[0]) << "K = " << k << " round " << t.round;
    }
    const Replayed all = replay(c, {1, 1, 1, 1, 1}, greedy, o);
    EXPECT_EQ(all.result.tokens, generated(greedy, max)) << "K = " << k;
    EXPECT_EQ(all.result.stats.accepted_tokens, all.result.stats.drafted_tokens) << "K = " << k;
    for (const RoundTrace& t : all.rounds) {
      EXPECT_EQ(t.accepted, static_cast<int64_t>(t.draft.size())) << "K = " << k << " round " << t.round;
      EXPECT_EQ(t.draft, std::vector<int32_t>(t.target_greedy.begin(), t.target_greedy.end() - 1));
    }
    // Past the profile's last entry a_i = 0: the (K + 1)-th draft is always rejected.
    const Replayed short_profile = replay(c, std::vector<double>(static_cast<size_t>(k - 1), 1.0), greedy, o);
    EXPECT_EQ(short_profile.result.tokens, generated(greedy, max));
    for (const RoundTrace& t : short_profile.rounds)
      EXPECT_EQ(t.accepted, std::min<int64_t>(k - 1, static_cast<int64_t>(t.draft.size()))) << "K = " << k;
  }
}

// Per position: a_i of the rounds that drafted an i-th token accepted it, within binomial bounds, over a
// few thousand rounds; the seed decides the draws; plain greedy decoding's tokens throughout.
TEST(AcceptanceReplay, EmpiricalAcceptanceFollowsTheProfile) {
  const toy::Config c = replay_config();
  const int max = 6000;
  const std::vector<int32_t> greedy = greedy_run(c, max);
  GenerationOptions o;
  o.max_tokens = max;
  o.draft_tokens = 3;
  const std::vector<double> profile{0.8, 0.5};
  const Replayed r = replay(c, profile, greedy, o, 7);
  const auto& s = r.result.stats;
  EXPECT_EQ(r.result.tokens, generated(greedy, max));
  ASSERT_EQ(s.drafted_by_position.size(), 3u);
  ASSERT_GT(s.speculative_steps, 2000);
  expect_binomial(s.accepted_by_position[0], s.drafted_by_position[0], 0.8, "first drafts accepted");
  expect_binomial(s.accepted_by_position[1], s.drafted_by_position[1], 0.5, "first two drafts accepted");
  EXPECT_EQ(s.accepted_by_position[2], 0) << "the profile ends at 2: a third draft is always rejected";
  // The conditional draw itself: the second draft after an accepted first one, with a_2 / a_1.
  expect_binomial(s.accepted_by_position[1], s.accepted_by_position[0], 0.5 / 0.8, "second given the first");
  // Drafts accepted per round: 0, 1 or 2 with probabilities 0.2, 0.3, 0.5 (mean 1.3, variance 0.61).
  EXPECT_NEAR(static_cast<double>(s.accepted_tokens) / s.speculative_steps, 1.3,
              4.5 * std::sqrt(0.61 / static_cast<double>(s.speculative_steps)));

  // The same seed draws the same rounds; another draws others.
  GenerationOptions shorter = o;
  shorter.max_tokens = 300;
  const auto accepted = [](const Replayed& x) {
    std::vector<int64_t> v;
    for (const RoundTrace& t : x.rounds) v.push_back(t.accepted);
    return v;
  };
  const Replayed a = replay(c, profile, greedy, shorter, 11), b = replay(c, profile, greedy, shorter, 11),
                 d = replay(c, profile, greedy, shorter, 12);
  EXPECT_EQ(accepted(a), accepted(b));
  EXPECT_NE(accepted(a), accepted(d));
}

// With the adaptive length and in llama.cpp's loop (which may run a draft past max_tokens) the replay
// plants the same way, and the tokens stay plain greedy decoding's.
TEST(AcceptanceReplay, CombinesWithTheAdaptiveLengthAndLlamaCppsLoop) {
  const toy::Config c = replay_config();
  const int max = 400;
  const std::vector<int32_t> greedy = greedy_run(c, max + 9);
  GenerationOptions o;
  o.max_tokens = max;
  o.draft_auto = true;
  o.draft_max = 8;
  const Replayed a = replay(c, {0.9, 0.8, 0.7, 0.6}, greedy, o);
  EXPECT_EQ(a.result.tokens, generated(greedy, max));
  EXPECT_GT(a.result.stats.accepted_tokens, 0);
  for (const RoundTrace& t : a.rounds) EXPECT_LE(t.accepted, 4) << "round " << t.round;

  GenerationOptions l;
  l.max_tokens = 40;
  l.draft_tokens = 3;
  l.convention = specula::core::DraftConvention::LlamaCpp;
  const Replayed b = replay(c, {1, 1, 1}, greedy, l);
  ASSERT_GT(b.result.tokens.size(), 40u);
  EXPECT_EQ(b.result.tokens, generated(greedy, b.result.tokens.size()));
  EXPECT_EQ(b.result.stats.accepted_tokens, b.result.stats.drafted_tokens);
}

TEST(AcceptanceReplay, RefusesSampledDecodingAndAGreedyRunThatIsNotTheTargets) {
  const toy::Config c = replay_config();
  const std::vector<int32_t> greedy = greedy_run(c, 40);
  GenerationOptions o;
  o.max_tokens = 40;
  o.draft_tokens = 2;
  specula::SamplingParams sampled;
  sampled.temperature = 0.7f;
  try {
    replay(c, {0.5}, greedy, o, 1, sampled);
    ADD_FAILURE() << "a sampled replay ran";
  } catch (const specula::Error& e) {
    EXPECT_NE(std::string(e.what()).find("greedy decoding only (temperature 0, got 0.7)"), std::string::npos) << e.what();
  }
  // A greedy run with one token changed: the round that plants it is rejected there, the target's own
  // token is emitted, and the next round names the position.
  std::vector<int32_t> wrong = greedy;
  wrong[kReplayPrompt.size() + 10] = (wrong[kReplayPrompt.size() + 10] + 1) % static_cast<int32_t>(c.vocab);
  try {
    replay(c, {1, 1}, wrong, o);
    ADD_FAILURE() << "a replay of another sequence ran";
  } catch (const specula::Error& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format("token {} of the sequence (prompt included) is {} where the plain "
                                                     "greedy run of the same prompt has {}",
                                                     kReplayPrompt.size() + 10, greedy[kReplayPrompt.size() + 10],
                                                     wrong[kReplayPrompt.size() + 10])),
              std::string::npos)
        << e.what();
  }
  // A greedy run shorter than the generation.
  try {
    replay(c, {1, 1}, std::vector<int32_t>(greedy.begin(), greedy.begin() + 20), o);
    ADD_FAILURE() << "a replay past its greedy run ran";
  } catch (const specula::Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than the 20 of the plain greedy run"), std::string::npos) << e.what();
  }
  EXPECT_THROW(AcceptanceReplay({0.5, 0.6}, greedy, 1), specula::Error);
}
