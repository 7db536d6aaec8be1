// The application API on the shipped tiny model (models/, configs/default.yaml): the three ways to open
// a pipeline, streaming, token-level generation against the core Generator, prefix reuse in a session,
// cancellation from another thread, two threads sharing one Model, the thought-channel splitter.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "specula/api.hpp"
#include "specula/error.hpp"

namespace {

namespace fs = std::filesystem;
using specula::api::ChatMessage;
using specula::api::Model;
using specula::api::SamplingConfig;
using specula::core::StopReason;

const fs::path kSource = SPECULA_SOURCE_DIR;
const fs::path kPipeline = kSource / "configs/default.yaml";

std::shared_ptr<Model> tiny() {
  static std::shared_ptr<Model> model = Model::open(kPipeline);
  return model;
}

SamplingConfig greedy(int max_tokens) {
  SamplingConfig s = tiny()->default_sampling();
  s.temperature = 0;
  s.max_tokens = max_tokens;
  return s;
}

const std::vector<ChatMessage> kMessages = {{"user", "And God said"}};

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    for (size_t k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    i += len;
  }
  return true;
}

TEST(Api, OpensFromAYamlFileYamlTextAndAModelPathWithTheSameGreedyAnswer) {
  auto from_file = tiny();
  EXPECT_TRUE(from_file->has_drafter());
  EXPECT_EQ(from_file->info().architecture, "gemma4");
  std::ifstream in(kPipeline);
  std::stringstream yaml;
  yaml << in.rdbuf();
  auto from_text = Model::from_yaml(yaml.str(), kPipeline.parent_path());
  auto from_path = Model::open(kSource / "models/specula-tiny-kjv-q8_0.gguf");
  EXPECT_FALSE(from_path->has_drafter());  // the default pipeline has none
  // A GGUF carries no generation_config.json: the default pipeline's sampler (greedy).
  EXPECT_EQ(from_path->default_sampling().temperature, 0.0f);
  EXPECT_EQ(from_file->default_sampling().max_tokens, 96);  // configs/default.yaml's sampler section

  const auto a = from_file->generate_stream(kMessages, greedy(10));
  const auto b = from_text->generate_stream(kMessages, greedy(10));
  const auto c = from_path->generate_stream(kMessages, greedy(10));
  EXPECT_FALSE(a.text.empty());
  EXPECT_EQ(a.tokens.size(), 10u);
  EXPECT_EQ(a.stop_reason, StopReason::MaxTokens);
  EXPECT_EQ(a.text, b.text);
  EXPECT_EQ(a.tokens, c.tokens);  // speculative greedy decoding is lossless
  EXPECT_GT(a.stats.drafted_tokens, 0);
  EXPECT_EQ(c.stats.drafted_tokens, 0);
}

TEST(Api, OpeningAMissingFileSaysWhichFile) {
  try {
    Model::open(kSource / "configs/no-such-pipeline.yaml");
    FAIL() << "opened a missing pipeline";
  } catch (const specula::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-pipeline.yaml"), std::string::npos) << e.what();
  }
}

TEST(Api, StreamedChunksAreValidUtf8AndConcatenateToTheTextWithStatistics) {
  std::string streamed;
  int calls = 0;
  const auto r = tiny()->generate_stream(kMessages, greedy(16), [&](std::string_view chunk) {
    EXPECT_FALSE(chunk.empty());
    EXPECT_TRUE(valid_utf8(chunk));
    streamed += chunk;
    ++calls;
  });
  EXPECT_EQ(streamed, r.text);
  EXPECT_GT(calls, 1);
  EXPECT_EQ(r.stats.prompt_tokens, static_cast<int64_t>(tiny()->chat_prompt(kMessages).size()));
  EXPECT_EQ(r.stats.generated_tokens, static_cast<int64_t>(r.tokens.size()));
  EXPECT_GT(r.stats.decode_tokens_per_second(), 0);
  EXPECT_EQ(r.cached_tokens, 0);
}

TEST(Api, TokenLevelGenerationEqualsTheCoreGenerator) {
  auto model = tiny();
  const std::vector<int32_t> prompt = model->tokenize("And the earth was without form", false);
  std::vector<int32_t> seen;
  const auto r = model->generate(prompt, greedy(12), [&](int32_t t, std::string_view) {
    if (t >= 0) seen.push_back(t);
  });
  EXPECT_EQ(seen, r.tokens);
  specula::core::Generator generator(model->built().target, model->built().sampler, nullptr);
  specula::core::GenerationOptions o;
  o.max_tokens = 12;
  const auto ref = generator.generate(prompt, o);
  EXPECT_EQ(r.tokens, ref.tokens);
  EXPECT_EQ(r.text, ref.text);
  EXPECT_EQ(model->detokenize(r.tokens), ref.text);
}

TEST(Api, ASessionReusesThePrefixItHoldsAndAnswersAsAFreshOne) {
  auto model = tiny();
  auto session = model->new_session();
  const std::vector<ChatMessage> first = {{"system", "In the beginning"}, {"user", "And God said"}};
  const std::vector<ChatMessage> second = {{"system", "In the beginning"}, {"user", "And Moses said"}};
  session->generate_stream(first, greedy(4));
  const auto prompt = model->chat_prompt(second);
  const size_t reusable = session->reusable_prefix(prompt);
  EXPECT_GT(reusable, 3u);  // at least the system turn
  const auto reused = session->generate(prompt, greedy(8));
  EXPECT_EQ(reused.cached_tokens, static_cast<int64_t>(reusable));
  EXPECT_EQ(reused.stats.prompt_tokens, static_cast<int64_t>(prompt.size() - reusable));
  const auto fresh = model->generate(prompt, greedy(8));
  EXPECT_EQ(reused.tokens, fresh.tokens);
}

TEST(Api, APrefixTheSlidingWindowCannotRollBackToIsProcessedAfresh) {
  auto model = tiny();
  auto session = model->new_session();
  // A prompt past what the sliding-window cache (64) keeps for rollback (256).
  std::vector<int32_t> long_prompt = model->tokenize("And God said", false);
  const auto verse = model->tokenize(" and it came to pass", false);
  while (long_prompt.size() < 300) long_prompt.insert(long_prompt.end(), verse.begin(), verse.end());
  session->generate(long_prompt, greedy(2));
  const auto other = model->tokenize("And God saw the light", false);
  const auto r = session->generate(other, greedy(4));
  EXPECT_EQ(r.cached_tokens, 0);
  EXPECT_EQ(r.tokens, model->generate(other, greedy(4)).tokens);
}

TEST(Api, CancelFromAnotherThreadEndsTheGenerationAfterItsCurrentStep) {
  auto model = tiny();
  auto session = model->new_session();
  SamplingConfig s = greedy(4000);
  s.min_tokens = 4000;  // nothing but the cancel ends it early
  const auto prompt = model->tokenize("And it came to pass", false);
  std::atomic<int> tokens{0};
  std::thread canceller([&] {
    while (tokens.load() < 3) std::this_thread::yield();
    session->cancel();
  });
  specula::api::Result r;
  const auto capacity = session->capacity();
  s.max_tokens = static_cast<int>(std::min<int64_t>(4000, capacity - static_cast<int64_t>(prompt.size())));
  s.min_tokens = s.max_tokens;
  r = session->generate(prompt, s, [&](int32_t t, std::string_view) {
    if (t >= 0) ++tokens;
  });
  canceller.join();
  EXPECT_EQ(r.stop_reason, StopReason::Interrupted);
  EXPECT_GE(r.tokens.size(), 3u);
  EXPECT_LT(static_cast<int>(r.tokens.size()), s.max_tokens);
  // The session is usable again, and its context holds what it generated (prefix reuse).
  EXPECT_EQ(session->generate(prompt, greedy(4)).tokens, model->generate(prompt, greedy(4)).tokens);
}

TEST(Api, TwoThreadsSharingOneModelGetTheAnswersTheyGetAlone) {
  auto model = tiny();
  // Raw continuations: the tiny model answers every chat message alike.
  const auto a = model->tokenize("And God said", false), b = model->tokenize("Blessed are the meek", false);
  const auto alone_a = model->generate(a, greedy(16)).text;
  const auto alone_b = model->generate(b, greedy(16)).text;
  std::string got_a, got_b;
  std::thread ta([&] { got_a = model->new_session()->generate(a, greedy(16)).text; });
  std::thread tb([&] { got_b = model->new_session()->generate(b, greedy(16)).text; });
  ta.join();
  tb.join();
  EXPECT_EQ(got_a, alone_a);
  EXPECT_EQ(got_b, alone_b);
  EXPECT_NE(alone_a, alone_b);
}

TEST(Api, APromptPastTheContextIsAnErrorAndTheSessionStaysUsable) {
  auto model = tiny();
  auto session = model->new_session();
  std::vector<int32_t> prompt(static_cast<size_t>(session->capacity()) + 1, model->tokenize("And", false).at(0));
  try {
    session->generate(prompt, greedy(4));
    FAIL() << "a prompt past the context was accepted";
  } catch (const specula::Error& e) {
    EXPECT_NE(std::string(e.what()).find("context"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(session->active());
  EXPECT_EQ(session->generate(model->tokenize("And God", false), greedy(3)).tokens.size(), 3u);
}

TEST(Api, TheThoughtSplitterHandsTheThoughtChannelApart) {
  auto model = tiny();
  const auto chat = model->built().target->chat_format();
  ASSERT_TRUE(chat);
  const auto ids = model->tokenize("<|channel>thought\nLet me think.<channel|>The answer.", true);
  specula::api::ThoughtSplitter splitter(*chat);
  auto answer = chat->answer_filter(false);
  std::string thought, text;
  for (int32_t id : ids) {
    thought += splitter.push(id);
    text += answer->push(id);
  }
  thought += splitter.finish();
  text += answer->finish();
  EXPECT_EQ(text, "The answer.");
  EXPECT_EQ(thought, "Let me think.\n");
}

// SamplingConfig::logprobs: Result::logprobs holds one TokenLogprob per token, and each streamed chunk of
// a token carries the same one; with and without the drafter they agree. Penalties reach the sampler.
TEST(Api, LogprobsAndPenaltiesReachTheResultAndTheChunks) {
  auto model = tiny();
  const auto prompt = model->chat_prompt(kMessages);
  SamplingConfig s = greedy(12);
  s.logprobs = 2;
  std::vector<specula::core::TokenLogprob> streamed;
  const auto r = model->new_session()->generate_chunks(prompt, s, [&](const specula::api::Chunk& c) {
    if (c.logprob) streamed.push_back(*c.logprob);
  });
  ASSERT_EQ(r.logprobs.size(), r.tokens.size());
  ASSERT_EQ(streamed.size(), r.tokens.size());
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    EXPECT_EQ(r.logprobs[i].token, r.tokens[i]);
    EXPECT_EQ(streamed[i].logprob, r.logprobs[i].logprob);
    ASSERT_EQ(r.logprobs[i].top.size(), 2u);
    EXPECT_EQ(r.logprobs[i].top[0].first, r.tokens[i]);  // greedy: the most likely token
  }
  EXPECT_NE(r.stats.host_sampling_reason.find("logprobs"), std::string::npos) << r.stats.host_sampling_reason;
  SamplingConfig off = s;
  off.draft_tokens = 0;
  const auto plain = model->new_session()->generate(prompt, off);
  ASSERT_EQ(plain.tokens, r.tokens);
  for (size_t i = 0; i < r.tokens.size(); ++i) EXPECT_NEAR(plain.logprobs[i].logprob, r.logprobs[i].logprob, 1e-4);
  // logit_bias -100 on the greedy answer's first token: another first token.
  SamplingConfig biased = greedy(4);
  biased.logit_bias = {{r.tokens[0], -100.0f}};
  biased.presence_penalty = 0.5f;
  EXPECT_NE(model->new_session()->generate(prompt, biased).tokens.front(), r.tokens[0]);
}

}  // namespace
