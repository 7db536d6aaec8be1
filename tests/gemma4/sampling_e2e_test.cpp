// Device sampling end to end on the e2b fixture: the Generator with sampler.device off (forward, logits
// to the host, StandardSampler::sample) and on (forward and sampling in one graph, only the id read
// back) must produce identical token sequences, greedy and sampled (temperature, top-K, top-P,
// repetition penalty, min_length, fixed seed), with single- and multi-chunk prefills.
#include <gtest/gtest.h>

#include <ostream>
#include <vector>

#include "fixture.hpp"
#include "specula/core/generator.hpp"
#include "specula/error.hpp"

namespace {

using gemma4_test::fixture;
using gemma4_test::host;
using gemma4_test::load;
using specula::SamplingDevice;
using specula::SamplingParams;

specula::core::GenerationResult run(const std::shared_ptr<specula::Model>& model, SamplingParams p,
                                    SamplingDevice device, const std::vector<int32_t>& prompt, int max_tokens) {
  p.device = device;
  specula::core::Generator gen(model, host().make_sampler("standard", p, nlohmann::json::object()));
  specula::core::GenerationOptions o;
  o.max_tokens = max_tokens;
  return gen.generate(prompt, o, {}, 256);
}

struct Case {
  const char* name;
  SamplingParams params;
  int64_t prefill_chunk;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class DeviceSampling : public ::testing::TestWithParam<Case> {};

TEST_P(DeviceSampling, SameTokensAsHostSampling) {
  const Case& c = GetParam();
  auto model = load(fixture("e2b") / "model-f32.gguf", {{"prefill_chunk", c.prefill_chunk}});
  const std::vector<int32_t> prompt{2, 818, 5279, 529, 7001, 563, 107, 1018, 236761, 9079};
  const auto host_run = run(model, c.params, SamplingDevice::Off, prompt, 12);
  const auto dev_run = run(model, c.params, SamplingDevice::On, prompt, 12);
  EXPECT_EQ(dev_run.tokens, host_run.tokens);
  EXPECT_EQ(dev_run.stop_token, host_run.stop_token);
  // Every token of the device run was sampled in the graph, every one of the host run on the host.
  EXPECT_EQ(host_run.stats.device_sampled_tokens, 0);
  EXPECT_EQ(dev_run.stats.host_sampled_tokens, 0) << dev_run.stats.host_sampling_reason;
  EXPECT_EQ(dev_run.stats.device_sampled_tokens, host_run.stats.host_sampled_tokens);
  EXPECT_GE(dev_run.stats.device_sampled_tokens, static_cast<int64_t>(dev_run.tokens.size()));
  EXPECT_EQ(dev_run.stats.sampling_path(), "device");
  // auto picks the device on the CPU backend.
  const auto auto_run = run(model, c.params, SamplingDevice::Auto, prompt, 3);
  EXPECT_EQ(auto_run.stats.sampling_path(), "device");
  EXPECT_EQ(auto_run.tokens, std::vector<int32_t>(host_run.tokens.begin(), host_run.tokens.begin() + auto_run.tokens.size()));
  if (c.params.temperature > 0.0f) {
    // A sampled sequence is not the greedy one (the test would pass vacuously if sampling did nothing).
    const auto greedy = run(model, {}, SamplingDevice::Off, prompt, 12);
    EXPECT_NE(greedy.tokens, host_run.tokens);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Gemma4, DeviceSampling,
    ::testing::Values(
        Case{"greedy", {}, 256},
        Case{"greedy_penalty_min_length", {.repetition_penalty = 1.3f, .penalty_window = 16, .min_length = 8}, 4},
        Case{"topk_topp_penalty", {.temperature = 1.0f, .top_k = 40, .top_p = 0.95f, .repetition_penalty = 1.2f,
                                   .min_length = 5, .seed = 7}, 256},
        Case{"full_vocab_topp", {.temperature = 0.8f, .top_p = 0.9f, .seed = 11}, 4},
        Case{"hot", {.temperature = 1.5f, .top_k = 200, .seed = 3}, 256}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
