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

struct SamplingCase {
  const char* name;
  SamplingParams params;
  int64_t prefill_chunk;
};

void PrintTo(const SamplingCase& c, std::ostream* os) { *os << c.name; }

class DeviceSampling : public ::testing::TestWithParam<SamplingCase> {};

TEST_P(DeviceSampling, SameTokensAsHostSampling) {
  const SamplingCase& c = GetParam();
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
        SamplingCase{"greedy", {}, 256},
        SamplingCase{"greedy_penalty_min_length", {.repetition_penalty = 1.3f, .penalty_window = 16, .min_length = 8}, 4},
        SamplingCase{"topk_topp_penalty", {.temperature = 1.0f, .top_k = 40, .top_p = 0.95f, .repetition_penalty = 1.2f,
                                   .min_length = 5, .seed = 7}, 256},
        SamplingCase{"full_vocab_topp", {.temperature = 0.8f, .top_p = 0.9f, .seed = 11}, 4},
        SamplingCase{"hot", {.temperature = 1.5f, .top_k = 200, .seed = 3}, 256},
        SamplingCase{"min_p", {.temperature = 1.2f, .top_p = 0.95f, .min_p = 0.05f, .seed = 5}, 256}),
    [](const auto& info) { return std::string(info.param.name); });

// The CPU backend without TopPDraw: `auto` falls back to the host with the op named, `on` refuses before
// processing anything, and greedy steps (which need no TopPDraw) still sample in the graph.
class WithoutTopPDraw final : public specula::ComputeBackend {
 public:
  explicit WithoutTopPDraw(std::shared_ptr<specula::ComputeBackend> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return "cpu-without-TopPDraw"; }
  specula::DeviceInfo device() const override { return inner_->device(); }
  specula::Support supports(specula::Op op, specula::DType type) const override {
    if (op == specula::Op::TopPDraw) return specula::Support::no("left out by the test");
    return inner_->supports(op, type);
  }
  specula::BackendTensorPtr load_weight(const specula::TensorInfo& i) override { return inner_->load_weight(i); }
  specula::BackendTensorPtr allocate(const std::string& n, specula::DType t, const specula::Shape& s) override {
    return inner_->allocate(n, t, s);
  }
  std::unique_ptr<specula::CompiledGraph> compile(const specula::Graph& g) override { return inner_->compile(g); }
  void read(const specula::BackendTensor& t, std::span<std::byte> d) override { inner_->read(t, d); }
  void write(specula::BackendTensor& t, std::span<const std::byte> s) override { inner_->write(t, s); }

 private:
  std::shared_ptr<specula::ComputeBackend> inner_;
};

TEST(Gemma4DeviceSampling, MissingOpFallsBackOrFailsNamingIt) {
  auto file = host().open_model(fixture("e2b") / "model-f32.gguf");
  auto be = std::make_shared<WithoutTopPDraw>(gemma4_test::backend());
  auto model = host().find_model_loader(*file)->load(file, be, nlohmann::json::object());
  const std::vector<int32_t> prompt{2, 818, 5279, 529};
  const SamplingParams sampled{.temperature = 1.0f, .top_k = 40, .seed = 5};
  const auto fallback = run(model, sampled, SamplingDevice::Auto, prompt, 4);
  EXPECT_EQ(fallback.stats.sampling_path(), "host");
  EXPECT_NE(fallback.stats.host_sampling_reason.find("TopPDraw"), std::string::npos) << fallback.stats.host_sampling_reason;
  EXPECT_EQ(fallback.tokens, run(model, sampled, SamplingDevice::Off, prompt, 4).tokens);

  specula::core::Generator gen(model, host().make_sampler("standard", {.temperature = 1.0f, .device = SamplingDevice::On},
                                                          nlohmann::json::object()));
  auto ctx = model->new_context({.context_length = 64});
  try {
    gen.generate(*ctx, prompt, {});
    ADD_FAILURE() << "device: on must fail without TopPDraw";
  } catch (const specula::Error& e) {
    EXPECT_NE(std::string(e.what()).find("TopPDraw"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ctx->position(), 0);  // refused before processing the prompt

  EXPECT_EQ(run(model, {}, SamplingDevice::On, prompt, 4).stats.sampling_path(), "device");  // greedy: no draw
}

}  // namespace
