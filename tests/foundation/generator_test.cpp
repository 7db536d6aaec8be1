// The generation engine against the toy target (logits a deterministic function of the prefix): plain
// decoding against an independently computed reference, and speculative decoding against plain decoding
// token for token (greedy; sampled: seeded and rejecting), with rollback, stop conditions, limits and
// statistics.
#include <gtest/gtest.h>

#include "specula/core/generator.hpp"
#include "specula/error.hpp"
#include "toy.hpp"

using specula::core::GenerationOptions;
using specula::core::GenerationResult;
using specula::core::Generator;
using specula::core::StopReason;

namespace {

const std::vector<int32_t> kPrompt = {5, 9, 17, 3, 22};

// Greedy continuation computed directly from the toy's logit function, without the engine.
std::vector<int32_t> reference_greedy(const toy::Config& c, std::vector<int32_t> prefix, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    int32_t t = toy::argmax(toy::logits_after(prefix, c.vocab, c.seed, c.sharpness));
    out.push_back(t);
    prefix.push_back(t);
  }
  return out;
}

toy::Config no_end_config() {
  toy::Config c;
  c.end_tokens = {};  // let runs go to max_tokens
  return c;
}

struct Outcome {
  GenerationResult result;
  int64_t forwards = 0;
  int64_t final_position = 0;
  std::string streamed;
};

Outcome run(const toy::Config& c, specula::SamplingParams sp, int max_tokens, int draft_tokens, int error_every,
        std::vector<int32_t> prompt = kPrompt, int64_t context = 0) {
  auto model = std::make_shared<toy::Model>(c);
  auto sampler = std::make_shared<toy::Sampler>(sp);
  std::shared_ptr<toy::Drafter> drafter;
  if (draft_tokens > 0) drafter = std::make_shared<toy::Drafter>(c, error_every);
  Generator gen(model, sampler, drafter);
  GenerationOptions o;
  o.max_tokens = max_tokens;
  o.draft_tokens = draft_tokens > 0 ? draft_tokens : 3;
  specula::ContextOptions co;
  co.context_length = context;
  auto ctx = model->new_context(co);
  Outcome r;
  r.result = gen.generate(*ctx, prompt, o, [&](int32_t, std::string_view text) { r.streamed += text; });
  r.forwards = model->forwards;
  r.final_position = ctx->position();
  return r;
}

TEST(Generator, PlainGreedyMatchesIndependentReference) {
  auto c = no_end_config();
  Outcome r = run(c, {}, 40, 0, 0);
  EXPECT_EQ(r.result.tokens, reference_greedy(c, kPrompt, 40));
  EXPECT_EQ(r.result.stop_reason, StopReason::MaxTokens);
  EXPECT_EQ(r.forwards, 40);  // one prefill + 39 decode steps
  EXPECT_EQ(r.result.stats.prompt_tokens, 5);
  EXPECT_EQ(r.result.stats.generated_tokens, 40);
  EXPECT_EQ(r.final_position, 5 + 39);
}

TEST(Generator, SpeculativeGreedyEqualsPlainGreedy) {
  auto c = no_end_config();
  const Outcome plain = run(c, {}, 60, 0, 0);
  for (int n : {1, 2, 3, 5, 8}) {
    for (int error_every : {0, 2, 3, 7}) {
      SCOPED_TRACE(testing::Message() << "draft_tokens=" << n << " error_every=" << error_every);
      Outcome s = run(c, {}, 60, n, error_every);
      EXPECT_EQ(s.result.tokens, plain.result.tokens);
      EXPECT_EQ(s.final_position, plain.final_position);
      EXPECT_EQ(s.streamed, plain.streamed);
      const auto& st = s.result.stats;
      EXPECT_GT(st.speculative_steps, 0);
      EXPECT_LE(st.accepted_tokens, st.drafted_tokens);
      // Every step emits its accepted drafts plus one token (correction or bonus); the first token comes
      // from the prefill, the last one from a plain step when one token is left to generate.
      EXPECT_LE(st.accepted_tokens + st.speculative_steps + 1, 60);
      EXPECT_GE(st.accepted_tokens + st.speculative_steps + 2, 60);
      if (error_every == 0) {
        EXPECT_EQ(st.accepted_tokens, st.drafted_tokens) << "a perfect drafter is always accepted";
        EXPECT_LT(s.forwards, plain.forwards);
      } else {
        EXPECT_LT(st.accepted_tokens, st.drafted_tokens) << "the deliberate errors must be rejected";
      }
    }
  }
}

// llama.cpp's draft-mtp loop: the last prompt token is verified by the first round, rounds draft
// min(K, max - produced - 1) tokens (K when that is not positive) and the round that passes max_tokens
// completes. Greedy output is still plain greedy decoding, and the trace adds up.
TEST(Generator, LlamaCppConventionFollowsItsLoopAndStaysLossless) {
  auto c = no_end_config();
  const int max = 30;
  const auto plain = reference_greedy(c, kPrompt, max + 12);
  for (int k : {1, 2, 3, 5}) {
    for (int error_every : {0, 3}) {
      SCOPED_TRACE(testing::Message() << "draft_tokens=" << k << " error_every=" << error_every);
      auto model = std::make_shared<toy::Model>(c);
      auto drafter = std::make_shared<toy::Drafter>(c, error_every);
      Generator gen(model, std::make_shared<toy::Sampler>(specula::SamplingParams{}), drafter);
      GenerationOptions o;
      o.max_tokens = max;
      o.draft_tokens = k;
      o.convention = specula::core::DraftConvention::LlamaCpp;
      std::vector<specula::core::RoundTrace> rounds;
      o.on_round = [&](const specula::core::RoundTrace& r) { rounds.push_back(r); };
      auto ctx = model->new_context({});
      const auto r = gen.generate(*ctx, kPrompt, o);
      const int64_t n = static_cast<int64_t>(r.tokens.size());
      EXPECT_EQ(r.tokens, std::vector<int32_t>(plain.begin(), plain.begin() + n));
      EXPECT_GT(n, max);
      EXPECT_LE(n, max + k + 1);
      EXPECT_EQ(r.stop_reason, StopReason::MaxTokens);
      EXPECT_EQ(ctx->position(), static_cast<int64_t>(kPrompt.size()) + n - 1);
      ASSERT_EQ(static_cast<int64_t>(rounds.size()), r.stats.speculative_steps);
      EXPECT_EQ(drafter->calls, r.stats.speculative_steps) << "no plain steps";
      int64_t produced = 0, n_past = static_cast<int64_t>(kPrompt.size()) - 1;
      int32_t last = kPrompt.back();
      for (size_t i = 0; i < rounds.size(); ++i) {
        const auto& t = rounds[i];
        EXPECT_EQ(t.round, static_cast<int64_t>(i));
        EXPECT_EQ(t.n_past, n_past);
        EXPECT_EQ(t.last_token, last);
        const int64_t limit = max - produced - 1;
        EXPECT_EQ(static_cast<int64_t>(t.draft.size()), limit > 0 ? std::min<int64_t>(k, limit) : k) << "round " << i;
        ASSERT_EQ(t.target_greedy.size(), t.draft.size() + 1);
        int64_t agree = 0;
        while (agree < static_cast<int64_t>(t.draft.size()) && t.draft[agree] == t.target_greedy[agree]) ++agree;
        EXPECT_EQ(t.accepted, agree);
        EXPECT_EQ(std::vector<int32_t>(t.target_greedy.begin(), t.target_greedy.begin() + agree + 1),
                  std::vector<int32_t>(r.tokens.begin() + produced, r.tokens.begin() + produced + agree + 1));
        produced += agree + 1;
        n_past += agree + 1;
        last = r.tokens[produced - 1];
        EXPECT_EQ(produced > max, i + 1 == rounds.size()) << "stops after the round that passes max_tokens";
      }
      EXPECT_EQ(produced, n);
    }
  }
}

TEST(Generator, SpeculativeSamplingIsSeededAndRejects) {
  // The toy drafter has no distribution, so its proposals are point masses: accepted with the target's
  // probability of them, else replaced by a draw from the rest of p. Tokens differ from plain sampling
  // (the uniforms are used differently); that the distribution is p's is tests/speculative's chi-square.
  auto c = no_end_config();
  c.sharpness = 3.0f;  // a flat distribution: drafts are often rejected
  int64_t drafted = 0, accepted = 0;
  for (uint64_t seed : {1u, 2u, 3u}) {
    specula::SamplingParams sp;
    sp.temperature = 0.9f;
    sp.seed = seed;
    sp.repetition_penalty = 1.3f;
    const auto greedy = run(c, {}, 50, 4, 3);
    for (int n : {1, 4}) {
      SCOPED_TRACE(testing::Message() << "seed=" << seed << " draft_tokens=" << n);
      Outcome s = run(c, sp, 50, n, 3);
      EXPECT_EQ(run(c, sp, 50, n, 3).result.tokens, s.result.tokens) << "a seed repeats a sampled run";
      EXPECT_NE(s.result.tokens, greedy.result.tokens) << "sampling must differ from greedy here";
      EXPECT_EQ(s.result.tokens.size(), 50u);
      EXPECT_EQ(s.final_position, static_cast<int64_t>(kPrompt.size()) + 49);
      drafted += s.result.stats.drafted_tokens;
      accepted += s.result.stats.accepted_tokens;
    }
  }
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
}

TEST(Generator, EndTokenStopsAndIsNotEmitted) {
  auto c = no_end_config();
  auto ref = reference_greedy(c, kPrompt, 30);
  // Make the 8th greedy token an end token, provided it did not occur earlier.
  int32_t end = ref[7];
  size_t first = std::find(ref.begin(), ref.end(), end) - ref.begin();
  c.end_tokens = {end};
  for (int n : {0, 3}) {
    SCOPED_TRACE(n);
    Outcome r = run(c, {}, 30, n, 4);
    EXPECT_EQ(r.result.stop_reason, StopReason::EndToken);
    EXPECT_EQ(r.result.stop_token, end);
    EXPECT_EQ(r.result.tokens, std::vector<int32_t>(ref.begin(), ref.begin() + first));
    EXPECT_EQ(r.final_position, static_cast<int64_t>(kPrompt.size() + first - 1));
  }
}

TEST(Generator, StopTokensFromOptions) {
  auto c = no_end_config();
  auto ref = reference_greedy(c, kPrompt, 20);
  auto model = std::make_shared<toy::Model>(c);
  Generator gen(model, std::make_shared<toy::Sampler>(specula::SamplingParams{}),
                std::make_shared<toy::Drafter>(c, 0));
  GenerationOptions o;
  o.max_tokens = 20;
  o.stop_tokens = {ref[4]};
  auto r = gen.generate(kPrompt, o);
  size_t first = std::find(ref.begin(), ref.end(), ref[4]) - ref.begin();
  EXPECT_EQ(r.tokens, std::vector<int32_t>(ref.begin(), ref.begin() + first));
  EXPECT_EQ(r.stop_token, ref[4]);
}

TEST(Generator, MaxTokensIsExactInBothModes) {
  auto c = no_end_config();
  for (int max : {1, 2, 7}) {
    for (int n : {0, 4}) {
      Outcome r = run(c, {}, max, n, 0);
      EXPECT_EQ(static_cast<int>(r.result.tokens.size()), max) << "max=" << max << " n=" << n;
      EXPECT_EQ(r.result.stop_reason, StopReason::MaxTokens);
    }
  }
}

TEST(Generator, PromptLongerThanContextIsAnError) {
  auto c = no_end_config();
  std::vector<int32_t> prompt(20, 4);
  try {
    run(c, {}, 5, 0, 0, prompt, 16);
    FAIL() << "expected an error";
  } catch (const specula::Error& e) {
    EXPECT_NE(std::string(e.what()).find("the prompt has 20 tokens"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("holds 16 tokens"), std::string::npos) << e.what();
  }
  EXPECT_THROW(run(c, {}, 5, 0, 0, {}), specula::Error);
}

TEST(Generator, StopsWhenTheContextIsFull) {
  auto c = no_end_config();
  for (int n : {0, 3}) {
    Outcome r = run(c, {}, 100, n, 2, kPrompt, 12);
    EXPECT_EQ(r.result.stop_reason, StopReason::ContextFull) << n;
    // 12 positions: 5 prompt + 7 generated processed, plus the last generated token unprocessed.
    EXPECT_EQ(r.result.tokens.size(), 8u) << n;
    EXPECT_EQ(r.result.tokens, reference_greedy(c, kPrompt, 8));
  }
}

TEST(Generator, StreamsTextThroughTheChatFormat) {
  auto c = no_end_config();
  Outcome r = run(c, {}, 25, 3, 2);
  toy::Tokenizer tok(c.vocab);
  EXPECT_EQ(r.result.text, tok.decode(r.result.tokens, true));
  EXPECT_EQ(r.streamed, r.result.text);
  EXPECT_EQ(r.result.text.size(), 25u);
}

TEST(Generator, ContinuesAConversationInTheSameContext) {
  // Two turns in one context give the same tokens as one prompt holding the first turn's tokens.
  auto c = no_end_config();
  auto model = std::make_shared<toy::Model>(c);
  Generator gen(model, std::make_shared<toy::Sampler>(specula::SamplingParams{}), std::make_shared<toy::Drafter>(c, 3));
  GenerationOptions o;
  o.max_tokens = 6;
  auto ctx = model->new_context({});
  auto first = gen.generate(*ctx, kPrompt, o);
  std::vector<int32_t> next = {first.tokens.back(), 11, 12};
  auto second = gen.generate(*ctx, next, o);
  std::vector<int32_t> full = kPrompt;
  full.insert(full.end(), first.tokens.begin(), first.tokens.end());
  full.insert(full.end(), {11, 12});
  EXPECT_EQ(second.tokens, reference_greedy(c, full, 6));
}

TEST(Utf8Stream, HoldsBackIncompleteSequences) {
  specula::core::Utf8Stream s;
  std::string euro = "\xE2\x82\xAC";
  EXPECT_EQ(s.push("a"), "a");
  EXPECT_EQ(s.push(euro.substr(0, 1)), "");
  EXPECT_EQ(s.push(euro.substr(1, 1)), "");
  EXPECT_EQ(s.push(euro.substr(2) + "b"), euro + "b");
  EXPECT_EQ(s.push("\xFF"), "\xEF\xBF\xBD");
  EXPECT_EQ(s.push("\xC3"), "");
  EXPECT_EQ(s.finish(), "\xEF\xBF\xBD");
}

}  // namespace

// Stop strings end generation before them, plain and speculative alike, and what streams equals the
// result's text (text that may begin a stop string is held back until it cannot).
TEST(Generator, StopStringsCutTheTextAndStreamTheSame) {
  const toy::Config c = no_end_config();
  const toy::Tokenizer tok(c.vocab);
  const std::string full = tok.decode(reference_greedy(c, kPrompt, 40), true);
  const std::string stop = full.substr(20, 3);
  const std::string expected = full.substr(0, full.find(stop));
  for (int draft : {0, 3}) {
    auto model = std::make_shared<toy::Model>(c);
    std::shared_ptr<toy::Drafter> drafter = draft ? std::make_shared<toy::Drafter>(c, 3) : nullptr;
    Generator gen(model, std::make_shared<toy::Sampler>(specula::SamplingParams{}), drafter);
    GenerationOptions o;
    o.max_tokens = 40;
    o.stop_strings = {"never there \x01", stop};
    std::string streamed;
    const auto r = gen.generate(kPrompt, o, [&](int32_t, std::string_view text) { streamed += text; });
    EXPECT_EQ(r.stop_reason, StopReason::StopString) << draft;
    EXPECT_EQ(r.text, expected) << draft;
    EXPECT_EQ(streamed, expected) << draft;
  }
}

// An interrupt flag ends generation after the current step with stop reason "interrupted".
TEST(Generator, InterruptEndsGenerationWithItsStopReason) {
  const toy::Config c = no_end_config();
  auto model = std::make_shared<toy::Model>(c);
  Generator gen(model, std::make_shared<toy::Sampler>(specula::SamplingParams{}));
  std::atomic<bool> stop{false};
  GenerationOptions o;
  o.max_tokens = 100;
  o.interrupt = &stop;
  const auto r = gen.generate(kPrompt, o, [&](int32_t, std::string_view) { stop = true; });
  EXPECT_EQ(r.stop_reason, StopReason::Interrupted);
  EXPECT_EQ(r.tokens, reference_greedy(c, kPrompt, 1));
  EXPECT_EQ(specula::core::stop_reason_name(r.stop_reason), "interrupted");
}

namespace {

// Generator::start / Generation::step, interleaved over two contexts as the server's scheduler runs them:
// each run equals its own Generator::generate, one target forward per plain step, and finish() before
// the end is an interruption that keeps the context invariant.
TEST(Generator, InterleavedStepwiseGenerationsEqualGenerate) {
  auto c = no_end_config();
  auto model = std::make_shared<toy::Model>(c);
  auto drafter = std::make_shared<toy::Drafter>(c, 3);
  Generator plain(model, std::make_shared<toy::Sampler>(specula::SamplingParams{}), nullptr);
  Generator drafted(model, std::make_shared<toy::Sampler>(specula::SamplingParams{}), drafter);
  GenerationOptions o;
  o.max_tokens = 20;
  const std::vector<int32_t> other = {7, 1, 30};
  auto ca = model->new_context({}), cb = model->new_context({});
  auto a = plain.start(*ca, kPrompt, o);
  auto b = drafted.start(*cb, other, o);
  EXPECT_EQ(a.tokens().size(), 1u);  // start() prefills and emits the first token
  int steps = 0;
  while (!a.finished() || !b.finished()) {
    a.step();
    b.step();
    ++steps;
  }
  const auto ra = a.finish(), rb = b.finish();
  EXPECT_EQ(ra.tokens, reference_greedy(c, kPrompt, 20));
  EXPECT_EQ(rb.tokens, reference_greedy(c, other, 20));
  EXPECT_LT(rb.stats.speculative_steps, 19);  // it drafted, so it needed fewer steps
  EXPECT_EQ(steps, 19);
  EXPECT_EQ(ca->position(), 5 + 19);

  auto cc = model->new_context({});
  auto early = plain.start(*cc, kPrompt, o);
  early.step();
  const auto rc = early.finish();
  EXPECT_EQ(rc.stop_reason, StopReason::Interrupted);
  EXPECT_EQ(rc.tokens, reference_greedy(c, kPrompt, 2));
  EXPECT_EQ(cc->position(), 5 + 1);
}

}  // namespace
