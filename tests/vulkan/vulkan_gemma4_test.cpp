// The gemma4 target on the Vulkan backend (loaded as a plugin, as a pipeline would) against the CPU
// backend and the committed goldens (tests/gemma4/golden) on the e2b fixture, F32 and Q8_0 GGUF:
//  - next-token log-probabilities: numpy float64 reference within 1e-4 (F32), llama.cpp within the
//    bounds tests/gemma4 uses, and the CPU backend within 1e-4 (F32; Q8_0: see below);
//  - greedy decode over a sequence longer than the sliding window gives the CPU backend's tokens;
//  - `specula eval --backend vulkan` prints the reference's top token.
//  - the quantizer's block types (Q4_1, Q5_0, Q5_1, Q5_K, Q6_K, IQ4_NL, IQ4_XS: what a Q4_K_M download
//    mixes, with llama.cpp's fallbacks for rows that are not whole 256-value blocks) give the CPU's
//    next-token log-probabilities.
//  - the e2b fixture as an MLX checkpoint (affine 4-bit): the numpy reference of its dequantized weights
//    within 1e-4 and the CPU backend within 1e-4 (both multiply MLX weights with F32 activations).
// Skipped (GTEST_SKIP) when no Vulkan device exists.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "common/counting_backend.hpp"
#include "common/plugins.hpp"
#include "common/sanitizers.hpp"
#include "specula/core/acceptance_replay.hpp"
#include "specula/core/generator.hpp"
#include "specula/core/plugin_host.hpp"
#include "specula/quantize.hpp"
#include "specula/error.hpp"
#include "specula/model.hpp"

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json read_json(const fs::path& p) {
  std::ifstream in(p);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  return json::parse(in);
}
fs::path golden(const std::string& name) { return fs::path(SPECULA_SOURCE_DIR) / "tests/gemma4/golden" / name; }

// The e2b fixture in `formats`, written once per build dir into vulkan-fixtures/<dir> by the generator
// tests/gemma4 uses (each set in a directory of its own, so one set's stamp does not rewrite another).
fs::path write_fixture(const std::string& dir, const std::string& formats) {
  const fs::path d = fs::path(SPECULA_FIXTURE_DIR) / "vulkan-fixtures" / dir;
  const std::string cmd = std::string(SPECULA_PYTHON) + " " + SPECULA_SOURCE_DIR +
                          "/tools/gemma4_fixture.py --variant e2b --formats " + formats + " --out " + d.string() +
                          " --vocab " + SPECULA_SHARED_DIR + "/gemma4-vocab/ggml-vocab-gemma-4.gguf";
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("fixture generation failed: " + cmd);
  return d;
}
// F32 and Q8_0 GGUF.
fs::path fixture() {
  static const fs::path dir = write_fixture("e2b", "f32,q8_0");
  return dir;
}
// The same weights as an MLX checkpoint (mlx4: affine 4-bit in groups of 32, BF16 scales, the router at
// 8 bits).
fs::path mlx_fixture() {
  static const fs::path dir = write_fixture("e2b-mlx", "mlx4") / "mlx4";
  return dir;
}

using specula_test::host;

// The backends and models the tests share, released when the tests end (ReleaseDevices below).
std::map<std::string, std::shared_ptr<specula::ComputeBackend>> made;
std::map<std::string, std::shared_ptr<specula::Model>> loaded;

// Devices are released before main returns, not by static destructors at exit: NVIDIA's driver crashed
// (SIGSEGV) on the Vulkan objects still alive by then.
class ReleaseDevices final : public ::testing::Environment {
 public:
  void TearDown() override {
    loaded.clear();
    made.clear();
  }
};
::testing::Environment* const kReleaseDevices = ::testing::AddGlobalTestEnvironment(new ReleaseDevices);

// "cpu", "vulkan" (its defaults: cooperative matrices for prompts where the device has them) or
// "vulkan-fp32" (every product on the fp32 shaders).
std::shared_ptr<specula::ComputeBackend> backend(const std::string& name, std::string* why = nullptr) {
  static std::map<std::string, std::string> errors;
  if (!made.count(name) && !errors.count(name)) {
    try {
      made[name] = name == "vulkan-fp32"   ? host().make_backend("vulkan", {{"cooperative_matrix", false}})
                   : name == "cpu-float" ? host().make_backend("cpu", {{"pack_weights", false}})
                                         : host().make_backend(name);
    } catch (const specula::Error& e) {
      errors[name] = e.what();
    }
  }
  if (why && errors.count(name)) *why = errors[name];
  return made.count(name) ? made[name] : nullptr;
}

std::shared_ptr<specula::Model> load(const std::string& backend_name, const std::string& file, const json& options = json::object()) {
  auto& m = loaded[backend_name + "/" + file + options.dump()];
  if (!m) {
    auto f = host().open_model(fixture() / file);
    m = host().find_model_loader(*f)->load(f, backend(backend_name), options);
  }
  return m;
}

#define REQUIRE_VULKAN()                                   \
  std::string why_;                                        \
  if (!backend("vulkan", &why_)) GTEST_SKIP() << why_

std::vector<float> run_all(specula::Model& m, const std::vector<int32_t>& tokens) {
  specula::ContextOptions o;
  o.context_length = static_cast<int64_t>(tokens.size());
  return m.new_context(o)->forward(tokens, static_cast<int64_t>(tokens.size()));
}

std::vector<double> log_softmax(const float* row, int64_t n) {
  double m = -INFINITY, s = 0.0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, static_cast<double>(row[i]));
  for (int64_t i = 0; i < n; ++i) s += std::exp(row[i] - m);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = row[i] - m - std::log(s);
  return out;
}

// Per position: the largest |Δ log-prob| over the golden's top entries.
std::vector<double> golden_diffs(const std::vector<float>& logits, int64_t vocab, const json& seq) {
  std::vector<double> out;
  for (const auto& p : seq["positions"]) {
    auto lp = log_softmax(logits.data() + p["pos"].get<int64_t>() * vocab, vocab);
    double worst = 0;
    for (const auto& e : p["top"]) worst = std::max(worst, std::abs(lp[e[0].get<size_t>()] - e[1].get<double>()));
    out.push_back(worst);
  }
  return out;
}

// Largest |Δ log-prob| between two backends' logits over each position's top 20 (of the CPU).
double max_logprob_diff(const std::vector<float>& a, const std::vector<float>& b, int64_t vocab) {
  double worst = 0;
  for (size_t pos = 0; pos < a.size() / static_cast<size_t>(vocab); ++pos) {
    auto la = log_softmax(a.data() + pos * vocab, vocab), lb = log_softmax(b.data() + pos * vocab, vocab);
    std::vector<size_t> idx(la.size());
    for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
    std::partial_sort(idx.begin(), idx.begin() + 20, idx.end(), [&](size_t x, size_t y) { return la[x] > la[y]; });
    for (size_t k = 0; k < 20; ++k) worst = std::max(worst, std::abs(la[idx[k]] - lb[idx[k]]));
  }
  return worst;
}

// F32 weights on the fp32 shaders: the numpy reference and the CPU within 1e-4 in log-prob. Where the
// device has cooperative matrices the default backend multiplies prompts in fp16 (matmul_coopmat.comp),
// as llama.cpp's Vulkan and CUDA builds do: held to llama.cpp's F32 bound instead, and to 0.02 of the CPU
// (about 6e-3 measured on an H200).
TEST(VulkanGemma4, F32MatchesNumpyLlamaCppAndCpu) {
  REQUIRE_VULKAN();
  SKIP_UNDER_SANITIZERS();
  auto cpu = load("cpu", "model-f32.gguf");
  const json ref = read_json(golden("ref-e2b.json")), ll = read_json(golden("e2b-f32.json"));
  // The device line says when prompts run on cooperative matrices (vk_backend.cpp, device_features).
  const bool coopmat = backend("vulkan")->device().name.find("prompt matmuls on") != std::string::npos;
  for (const std::string which : {"vulkan-fp32", "vulkan"}) {
    if (which == "vulkan" && !coopmat) continue;  // the same shaders as vulkan-fp32
    const double tol = which == "vulkan" ? 0.02 : 1e-4;
    auto vk = load(which, "model-f32.gguf");
    const int64_t V = vk->info().vocab_size;
    for (const auto& [name, seq] : ref["sequences"].items()) {
      const auto tokens = seq["tokens"].get<std::vector<int32_t>>();
      const auto logits = run_all(*vk, tokens);
      const auto d = golden_diffs(logits, V, seq);
      const double ref_max = *std::max_element(d.begin(), d.end());
      EXPECT_LE(ref_max, tol) << which << ": numpy reference, sequence " << name;
      const auto l = golden_diffs(logits, V, ll["sequences"][name]);
      double lmax = 0, lmean = 0;
      for (double e : l) lmax = std::max(lmax, e), lmean += e / static_cast<double>(l.size());
      EXPECT_LE(lmax, 0.015) << which << ": llama.cpp, sequence " << name;  // tests/gemma4 kLlamaTol f32
      EXPECT_LE(lmean, 0.005) << which << ": llama.cpp, sequence " << name;
      const double cmax = max_logprob_diff(run_all(*cpu, tokens), logits, V);
      EXPECT_LE(cmax, tol) << which << ": CPU backend, sequence " << name;
      std::printf("[vulkan-gemma4] %s f32 %s: numpy max %.2e | llama.cpp max %.2e mean %.2e | cpu max %.2e\n",
                  which.c_str(), name.c_str(), ref_max, lmax, lmean, cmax);
    }
  }
}

TEST(VulkanGemma4, Q8_0MatchesLlamaCppAndDequantizedCpu) {
  REQUIRE_VULKAN();
  SKIP_UNDER_SANITIZERS();
  // The Vulkan backend multiplies the dequantized weights with F32 activations; the CPU backend
  // quantizes activations to 8 bits (as llama.cpp does), so the two differ by that rounding (~0.1
  // in log-prob on these random-weight fixtures, tests/gemma4's Q8_0 bound) rather than by 1e-4.
  auto vk = load("vulkan", "model-q8_0.gguf");
  auto cpu = load("cpu", "model-q8_0.gguf");
  const int64_t V = vk->info().vocab_size;
  const json ll = read_json(golden("e2b-q8_0.json"));
  for (const auto& [name, seq] : ll["sequences"].items()) {
    const auto tokens = seq["tokens"].get<std::vector<int32_t>>();
    const auto logits = run_all(*vk, tokens);
    auto d = golden_diffs(logits, V, seq);
    const double within = static_cast<double>(std::count_if(d.begin(), d.end(), [](double e) { return e <= 0.45; })) /
                          static_cast<double>(d.size());
    std::sort(d.begin(), d.end());
    EXPECT_GE(within, 0.9) << "llama.cpp q8_0, sequence " << name;
    EXPECT_LE(d[d.size() / 2], 0.25) << "llama.cpp q8_0, sequence " << name;
    const double cmax = max_logprob_diff(run_all(*cpu, tokens), logits, V);
    EXPECT_LE(cmax, 0.45) << "CPU backend q8_0, sequence " << name;
    std::printf("[vulkan-gemma4] q8_0 %s: llama.cpp median %.2e, %.0f%% within 0.45 | cpu max %.2e\n", name.c_str(),
                d[d.size() / 2], 100 * within, cmax);
  }
}

TEST(VulkanGemma4, Mlx4MatchesNumpyAndCpu) {
  REQUIRE_VULKAN();
  SKIP_UNDER_SANITIZERS();
  auto f = host().open_model(mlx_fixture());
  auto vk = host().find_model_loader(*f)->load(f, backend("vulkan"), json::object());
  // The CPU in MLX's float numerics: packed 4-bit panels would take 8-bit activations.
  auto cpu = host().find_model_loader(*f)->load(f, backend("cpu-float"), json::object());
  const int64_t V = vk->info().vocab_size;
  const json ref = read_json(golden("ref-e2b-mlx4.json"));
  for (const auto& [name, seq] : ref["sequences"].items()) {
    if (name != "seed") continue;  // 6 tokens: a few seconds on lavapipe (the 41-token "long" adds ~25 s)
    const auto tokens = seq["tokens"].get<std::vector<int32_t>>();
    const auto logits = run_all(*vk, tokens);
    const auto d = golden_diffs(logits, V, seq);
    const double ref_max = *std::max_element(d.begin(), d.end());
    EXPECT_LE(ref_max, 1e-4) << "numpy reference (mlx4), sequence " << name;
    const double cmax = max_logprob_diff(run_all(*cpu, tokens), logits, V);
    EXPECT_LE(cmax, 1e-4) << "CPU backend mlx4, sequence " << name;
    std::printf("[vulkan-gemma4] mlx4 %s: numpy max %.2e | cpu max %.2e\n", name.c_str(), ref_max, cmax);
  }
}

TEST(VulkanGemma4, GreedyDecodeEqualsCpuPastTheSlidingWindow) {
  REQUIRE_VULKAN();
  // prefill_chunk 4 makes the sliding-window caches real rings; 18 tokens cross the fixture's
  // window (8) twice.
  const json opts = {{"prefill_chunk", 4}};
  auto vk = load("vulkan", "model-f32.gguf", opts);
  auto cpu = load("cpu", "model-f32.gguf", opts);
  std::vector<int32_t> prompt = {2, 818, 5279, 529, 7001, 563};
  std::vector<std::vector<int32_t>> seqs;
  for (auto* m : {vk.get(), cpu.get()}) {
    std::vector<int32_t> seq = prompt;
    auto ctx = m->new_context({64});
    auto logits = ctx->forward(seq, 1);
    for (int step = 0; step < 12; ++step) {
      seq.push_back(static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
      logits = ctx->forward(std::span(&seq.back(), 1), 1);
    }
    seqs.push_back(seq);
  }
  EXPECT_EQ(seqs[0], seqs[1]) << "greedy tokens, Vulkan vs CPU";
}

// The shipped tiny pair on Vulkan: greedy speculative decoding gives plain decoding's tokens, and each
// step crosses back to the host once: the drafts stay on the device (the drafter writes them into the
// target context's draft tokens), the verification reads the drafts and its argmaxes in one go, and the
// rollback is a graph.
TEST(VulkanGemma4, GreedySpeculativeRoundReadsOnceAndEqualsPlain) {
  REQUIRE_VULKAN();
  SKIP_UNDER_SANITIZERS();  // lavapipe JIT time; the engine and drafter paths run under them on the CPU
  const fs::path models = fs::path(SPECULA_SOURCE_DIR) / "models";
  auto counting = std::make_shared<specula_test::CountingBackend>(backend("vulkan"));
  auto tf = host().open_model(models / "specula-tiny-kjv-q8_0.gguf");
  auto target = host().find_model_loader(*tf)->load(tf, counting, json::object());
  auto df = host().open_model(models / "specula-tiny-kjv-assistant-q8_0.gguf");
  auto drafter = host().find_drafter_loader(*df)->load(df, counting, target->info(), json::object());
  auto sampler = [] { return host().make_sampler("standard", specula::SamplingParams{}); };
  const std::vector<specula::ChatMessage> messages{{"user", "In the beginning God created the heaven and the earth."}};
  const auto ids = target->tokenizer()->encode(target->chat_format()->render(messages, true, false), false, true);
  specula::core::GenerationOptions o;
  o.max_tokens = 12;
  o.draft_tokens = 2;
  auto plain_ctx = target->new_context({256});
  const auto want = specula::core::Generator(target, sampler()).generate(*plain_ctx, ids, o);
  auto ctx = target->new_context({256});
  specula::core::Generation gen = specula::core::Generator(target, sampler(), drafter).start(*ctx, ids, o);
  const auto got = specula_test::finish_reading_once(gen, *counting);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_GT(got.stats.speculative_steps, 0);
  EXPECT_EQ(got.stats.device_verified_steps, got.stats.speculative_steps);
  std::printf("[vulkan-gemma4] tiny pair, K = 2: %lld rounds on the device, %lld of %lld drafts accepted\n",
              static_cast<long long>(got.stats.device_verified_steps), static_cast<long long>(got.stats.accepted_tokens),
              static_cast<long long>(got.stats.drafted_tokens));
}

// The acceptance replay writes its planted drafts into the drafts the drafter left on the GPU (a write the
// verification then reads): every draft accepted at profile 1,1, none at 0, the tokens plain decoding's.
TEST(VulkanGemma4, AcceptanceReplayPlantsDraftsHeldOnTheDevice) {
  REQUIRE_VULKAN();
  SKIP_UNDER_SANITIZERS();  // lavapipe JIT time; the replay runs under them on the CPU (tests/models)
  const fs::path models = fs::path(SPECULA_SOURCE_DIR) / "models";
  auto vk = backend("vulkan");
  auto tf = host().open_model(models / "specula-tiny-kjv-q8_0.gguf");
  auto target = host().find_model_loader(*tf)->load(tf, vk, json::object());
  auto df = host().open_model(models / "specula-tiny-kjv-assistant-q8_0.gguf");
  auto drafter = host().find_drafter_loader(*df)->load(df, vk, target->info(), json::object());
  auto sampler = [] { return host().make_sampler("standard", specula::SamplingParams{}); };
  const auto ids = target->tokenizer()->encode("In the beginning God created the heaven and the earth.", true, false);
  specula::core::GenerationOptions o;
  o.max_tokens = 16;
  o.draft_tokens = 2;
  specula::core::GenerationOptions go = o;
  go.max_tokens = o.max_tokens + o.draft_tokens + 1;
  const auto plain = specula::core::Generator(target, sampler()).generate(ids, go, {}, 256);
  std::vector<int32_t> greedy = ids;
  greedy.insert(greedy.end(), plain.tokens.begin(), plain.tokens.end());
  if (plain.stop_reason == specula::core::StopReason::EndToken) greedy.push_back(plain.stop_token);
  const std::vector<int32_t> want(plain.tokens.begin(), plain.tokens.begin() + std::min<size_t>(plain.tokens.size(), 16));
  for (const std::vector<double>& profile : {std::vector<double>{1, 1}, std::vector<double>{0}}) {
    specula::core::AcceptanceReplay replay(profile, greedy, 1, vk.get());
    o.draft_hook = &replay;
    const auto got = specula::core::Generator(target, sampler(), drafter).generate(ids, o, {}, 256);
    EXPECT_EQ(got.tokens, want) << "profile starting " << profile[0];
    EXPECT_GT(got.stats.speculative_steps, 0);
    EXPECT_EQ(got.stats.device_verified_steps, got.stats.speculative_steps);
    EXPECT_EQ(got.stats.accepted_tokens, profile[0] == 1 ? got.stats.drafted_tokens : 0) << "profile starting " << profile[0];
  }
}

// A sampled speculative round stays on the GPU too: the drafter draws its drafts in its graph, the target
// decides them with AcceptDrafts (the SDK's float32 rule in GLSL), and one read per step returns the
// emitted tokens, which are those of the same seed decided on the host (sampler.device: off).
TEST(VulkanGemma4, SampledSpeculativeRoundReadsOnceAndEqualsTheHost) {
  REQUIRE_VULKAN();
  SKIP_UNDER_SANITIZERS();  // lavapipe JIT time; the engine and drafter paths run under them on the CPU
  const fs::path models = fs::path(SPECULA_SOURCE_DIR) / "models";
  auto counting = std::make_shared<specula_test::CountingBackend>(backend("vulkan"));
  auto tf = host().open_model(models / "specula-tiny-kjv-q8_0.gguf");
  auto target = host().find_model_loader(*tf)->load(tf, counting, json::object());
  auto df = host().open_model(models / "specula-tiny-kjv-assistant-q8_0.gguf");
  auto drafter = host().find_drafter_loader(*df)->load(df, counting, target->info(), json::object());
  const std::vector<specula::ChatMessage> messages{{"user", "What did the people say unto the prophet?"}};
  const auto ids = target->tokenizer()->encode(target->chat_format()->render(messages, true, false), false, true);
  specula::core::GenerationOptions o;
  o.max_tokens = 24;
  o.draft_tokens = 2;
  auto params = [](specula::SamplingDevice device) {
    specula::SamplingParams p{.temperature = 1.0f, .top_k = 40, .top_p = 0.95f, .seed = 3};
    p.device = device;
    return p;
  };
  auto host_ctx = target->new_context({256});
  const auto want = specula::core::Generator(target, host().make_sampler("standard", params(specula::SamplingDevice::Off)),
                                             drafter).generate(*host_ctx, ids, o);
  auto ctx = target->new_context({256});
  specula::core::Generation gen =
      specula::core::Generator(target, host().make_sampler("standard", params(specula::SamplingDevice::Auto)), drafter)
          .start(*ctx, ids, o);
  const auto got = specula_test::finish_reading_once(gen, *counting);
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_GT(got.stats.speculative_steps, 0);
  EXPECT_EQ(got.stats.device_verified_steps, got.stats.speculative_steps);
  EXPECT_EQ(got.stats.host_sampled_tokens, 0);
  EXPECT_LT(got.stats.accepted_tokens, got.stats.drafted_tokens);  // a replacement drawn on the device too
  std::printf("[vulkan-gemma4] tiny pair, sampled, K = 2: %lld rounds on the device, %lld of %lld drafts accepted\n",
              static_cast<long long>(got.stats.device_verified_steps), static_cast<long long>(got.stats.accepted_tokens),
              static_cast<long long>(got.stats.drafted_tokens));
}

// Sampled decoding stays on the GPU: with sampler.device on, every token of the tiny target is drawn in
// its graph (penalty, top-K, TopPDraw by the SDK's float32 rule) and equals the host sampler's token
// drawn from the same run's logits with the same uniforms.
TEST(VulkanGemma4, SampledDecodeOnTheDeviceEqualsHostSampling) {
  REQUIRE_VULKAN();
  SKIP_UNDER_SANITIZERS();  // lavapipe JIT time; the engine and drafter paths run under them on the CPU
  auto tf = host().open_model(fs::path(SPECULA_SOURCE_DIR) / "models" / "specula-tiny-kjv-q8_0.gguf");
  auto target = host().find_model_loader(*tf)->load(tf, backend("vulkan"), json::object());
  const std::vector<specula::ChatMessage> messages{{"user", "And the LORD spake unto Moses, saying,"}};
  const auto ids = target->tokenizer()->encode(target->chat_format()->render(messages, true, false), false, true);
  std::vector<std::vector<int32_t>> runs;
  for (auto device : {specula::SamplingDevice::Off, specula::SamplingDevice::On}) {
    specula::SamplingParams p{.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .repetition_penalty = 1.1f, .seed = 7};
    p.device = device;
    specula::core::GenerationOptions o;
    o.max_tokens = 6;
    auto ctx = target->new_context({64});
    const auto r = specula::core::Generator(target, host().make_sampler("standard", p)).generate(*ctx, ids, o);
    EXPECT_EQ(r.stats.sampling_path(), device == specula::SamplingDevice::On ? "device" : "host");
    runs.push_back(r.tokens);
  }
  EXPECT_EQ(runs[1], runs[0]);
}

// Top-p with top-k off over Gemma's 262144-token vocabulary: a GPU draws in the graph; lavapipe refuses
// that TopPDraw (past llvmpipe's loop limit), so with `device: auto` the host samples and says why, and
// `device: on` fails with the same reason. Either way the tokens are those of host sampling.
TEST(VulkanGemma4, WholeVocabularyTopPSamplesWhereTheDeviceCan) {
  REQUIRE_VULKAN();
  SKIP_UNDER_SANITIZERS();  // lavapipe time on the full-vocabulary fixture
  auto vk = backend("vulkan");
  const bool llvmpipe = vk->device().name.find("llvmpipe") != std::string::npos;
  auto tf = host().open_model(fixture() / "model-f32.gguf");
  auto target = host().find_model_loader(*tf)->load(tf, vk, json::object());
  const std::vector<int32_t> ids{2, 818, 5279, 529, 7001};
  auto generate = [&](specula::SamplingDevice device) {
    specula::SamplingParams p{.temperature = 1.0f, .top_k = 0, .top_p = 0.9f, .seed = 11};
    p.device = device;
    specula::core::GenerationOptions o;
    o.max_tokens = 2;
    auto ctx = target->new_context({16});
    return specula::core::Generator(target, host().make_sampler("standard", p)).generate(*ctx, ids, o);
  };
  const auto host_run = generate(specula::SamplingDevice::Off);
  const auto auto_run = generate(specula::SamplingDevice::Auto);
  EXPECT_EQ(auto_run.tokens, host_run.tokens);
  if (!llvmpipe) {
    EXPECT_EQ(auto_run.stats.sampling_path(), "device");
    return;
  }
  EXPECT_EQ(auto_run.stats.sampling_path(), "host");
  const std::string& why = auto_run.stats.host_sampling_reason;
  for (const char* want : {"cannot run the sampling graph", "TopPDraw", "262144 candidates", "65535"})
    EXPECT_NE(why.find(want), std::string::npos) << "missing '" << want << "' in: " << why;
  try {
    generate(specula::SamplingDevice::On);
    ADD_FAILURE() << "device: on sampled on lavapipe past its loop limit";
  } catch (const specula::Error& e) {
    EXPECT_NE(std::string(e.what()).find("device sampling required but unavailable"), std::string::npos) << e.what();
  }
}

TEST(VulkanGemma4, EvalCliRunsOnVulkan) {
  REQUIRE_VULKAN();
  const json ref = read_json(golden("ref-e2b.json"))["sequences"]["seed"];
  std::string toks;
  for (int32_t t : ref["tokens"].get<std::vector<int32_t>>()) toks += (toks.empty() ? "" : ",") + std::to_string(t);
  const std::string cmd = std::string(SPECULA_CLI) + " eval -q --backend vulkan --model " +
                          (fixture() / "model-f32.gguf").string() + " --tokens " + toks + " --top 5 --json 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << cmd << "\n" << out;
  // One JSON line per position: the top token and its log-prob as the numpy reference has them.
  std::map<int64_t, json> got;
  size_t at = 0;
  while ((at = out.find("{\"pos\"", at)) != std::string::npos) {
    const size_t end = out.find('\n', at);
    const json line = json::parse(out.substr(at, end - at));
    got[line["pos"].get<int64_t>()] = line["top"];
    at = end;
  }
  ASSERT_FALSE(got.empty()) << out.substr(0, 600);
  for (const auto& p : ref["positions"]) {
    const int64_t pos = p["pos"];
    ASSERT_TRUE(got.count(pos)) << "position " << pos << " missing in: " << out.substr(0, 600);
    EXPECT_EQ(got[pos][0][0].get<int64_t>(), p["top"][0][0].get<int64_t>()) << "top token at " << pos;
    EXPECT_NEAR(got[pos][0][1].get<double>(), p["top"][0][1].get<double>(), 1e-4) << "top log-prob at " << pos;
  }
}

// The quantizer's "quant" fixture (hidden 64, ffn 256: the FFN rows take K-quants, the others fall back)
// quantized by Specula to each file type, on both backends. The weights are the same bits on both; the
// CPU quantizes activations to 8 bits, hence the Q8_0 test's bound.
TEST(VulkanGemma4, QuantizedFileTypesMatchCpu) {
  REQUIRE_VULKAN();
  SKIP_UNDER_SANITIZERS();
  const fs::path dir = fs::path(SPECULA_FIXTURE_DIR) / "quantize-fixtures" / "quant";
  const std::string cmd = std::string(SPECULA_PYTHON) + " " + SPECULA_SOURCE_DIR +
                          "/tools/gemma4_fixture.py --variant quant --formats f16,q8_0 --out " + dir.string() +
                          " --vocab " + SPECULA_SHARED_DIR + "/gemma4-vocab/ggml-vocab-gemma-4.gguf";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const fs::path out = fs::path(SPECULA_BINARY_DIR) / "vulkan-quantized" / std::to_string(getpid());
  fs::create_directories(out);
  const std::vector<int32_t> tokens = {2, 818, 5279, 529, 7001, 563, 1000, 37};
  std::set<specula::DType> seen;
  for (const char* type : {"Q4_1", "Q4_K_M", "Q5_K_M", "IQ4_XS"}) {
    specula::core::QuantizeOptions o;
    o.type = specula::core::find_quant_file_type(type);
    ASSERT_NE(o.type, nullptr) << type;
    o.threads = 2;
    const fs::path path = out / (std::string(type) + ".gguf");
    const auto stats = specula::core::quantize_gguf(host(), dir / "model-f16.gguf", path, o);
    for (const auto& [t, n] : stats.type_counts) seen.insert(t);
    auto f = host().open_model(path);
    std::vector<float> logits[2];
    int i = 0;
    for (const char* b : {"vulkan", "cpu"})
      logits[i++] = run_all(*host().find_model_loader(*f)->load(f, backend(b), json::object()), tokens);
    const double worst = max_logprob_diff(logits[1], logits[0], static_cast<int64_t>(logits[0].size() / tokens.size()));
    EXPECT_LE(worst, 0.45) << type << ": Vulkan vs CPU";
    std::printf("[vulkan-gemma4] %s: cpu max %.2e\n", type, worst);
  }
  fs::remove_all(out);
  using specula::DType;
  for (DType t : {DType::Q4_1, DType::Q4_K, DType::Q5_0, DType::Q5_1, DType::Q5_K, DType::Q6_K, DType::IQ4_NL,
                  DType::IQ4_XS})
    EXPECT_TRUE(seen.count(t)) << "no tensor of " << specula::dtype_name(t) << " in the quantized files";
}

}  // namespace
