// The shipped default pair (models/specula-tiny-kjv*.gguf, trained by tools/train-tiny): Specula against
// the PyTorch training code, which wrote float64 goldens on the very numbers the files hold
// (golden/tiny-kjv-*.json, at export); the tokenizer against the one trained; lossless greedy
// speculative decoding with a real acceptance rate; and `specula run configs/default.yaml --speedup`.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "assistant.hpp"
#include "common/counting_backend.hpp"
#include "common/plugins.hpp"
#include "specula/core/acceptance_replay.hpp"
#include "specula/core/generator.hpp"
#include "specula/core/plugin_host.hpp"
#include "specula/core/token_constraint.hpp"
#include "specula/error.hpp"
#include "specula/model.hpp"
#include "specula/quant.hpp"

namespace {

namespace fs = std::filesystem;
namespace ga = specula::gemma4_assistant;
using json = nlohmann::json;

const fs::path kModels = fs::path(SPECULA_SOURCE_DIR) / "models";
constexpr const char* kTarget = "specula-tiny-kjv-q8_0.gguf";
constexpr const char* kDrafter = "specula-tiny-kjv-assistant-q8_0.gguf";

const json& golden(const std::string& name) {
  static std::map<std::string, json> cache;
  static std::mutex mu;
  std::lock_guard lock(mu);
  auto& g = cache[name];
  if (g.is_null()) {
    std::ifstream in(fs::path(SPECULA_SOURCE_DIR) / "tests/models/golden" / name);
    if (!in) throw std::runtime_error("cannot read golden " + name);
    g = json::parse(in);
  }
  return g;
}

using specula_test::backend;
using specula_test::host;
using specula_test::load;

// A shipped file with every tensor dequantized to F32 (same keys): F32 arithmetic on the file's numbers.
fs::path f32_copy(const std::string& name) {
  const fs::path out = fs::path(SPECULA_BINARY_DIR) / "tiny-kjv" / (fs::path(name).stem().string() + "-as-f32.gguf");
  static std::mutex mu;
  std::lock_guard lock(mu);
  if (fs::exists(out) && fs::last_write_time(out) > fs::last_write_time(kModels / name)) return out;
  // Read and written through the gguf format plugin.
  const auto file = host().open_model(kModels / name);
  specula::gguf::Metadata md = *file->gguf_metadata();
  md.set_u32("general.file_type", 0);
  std::vector<specula::TensorSpec> specs;
  for (const auto& t : file->tensors())
    specs.push_back({t.name, specula::DType::F32, t.shape, {}, [&t](const specula::PutBytes& put) {
                       std::vector<float> v(static_cast<size_t>(t.elements()));
                       specula::dequantize_tensor(t, v.data());
                       put(std::as_bytes(std::span(v)));
                     }});
  fs::create_directories(out.parent_path());
  const fs::path tmp = out.string() + ".tmp";
  host().make_writer("gguf")->write(tmp, md, specs);
  fs::rename(tmp, out);
  return out;
}

std::shared_ptr<specula::Model> target_f32() { return load(f32_copy(kTarget)); }
std::shared_ptr<specula::Model> target_q8() { return load(kModels / kTarget); }

std::shared_ptr<ga::AssistantDrafter> drafter(const fs::path& path, const std::shared_ptr<specula::Model>& target,
                                              const std::string& head) {
  return ga::load_drafter(host().open_model(path), backend(), target->info(), {{"head", head}});
}

// The ids of a one-message chat (the user's `text`) with the generation prompt, as the server builds them.
std::vector<int32_t> chat_ids(const specula::Model& target, const std::string& text) {
  const std::vector<specula::ChatMessage> messages{{"user", text}};
  return target.tokenizer()->encode(target.chat_format()->render(messages, true, false), false, true);
}

std::vector<double> log_softmax(const float* row, size_t n) {
  double m = *std::max_element(row, row + n), s = 0;
  for (size_t i = 0; i < n; ++i) s += std::exp(row[i] - m);
  std::vector<double> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = row[i] - m - std::log(s);
  return out;
}

struct Compared {
  double max_err = 0;
  int positions = 0, top1_same = 0;
};

// Specula's log-probs of every golden sequence against the reference's top-20 at every position.
Compared compare_target(specula::Model& model) {
  Compared c;
  const auto& seqs = golden("tiny-kjv-target.json")["sequences"];
  for (const auto& [name, seq] : seqs.items()) {
    const auto tokens = seq["tokens"].get<std::vector<int32_t>>();
    auto ctx = model.new_context({});
    const auto logits = ctx->forward(tokens, static_cast<int64_t>(tokens.size()));
    const size_t vocab = logits.size() / tokens.size();
    EXPECT_EQ(vocab, 4096u);
    for (const auto& p : seq["positions"]) {
      const auto lp = log_softmax(logits.data() + p["pos"].get<size_t>() * vocab, vocab);
      const auto& top = p["top"];
      for (const auto& e : top) c.max_err = std::max(c.max_err, std::abs(lp[e[0].get<size_t>()] - e[1].get<double>()));
      ++c.positions;
      c.top1_same += (std::max_element(lp.begin(), lp.end()) - lp.begin()) == top[0][0].get<int64_t>();
    }
  }
  return c;
}

TEST(TinyKjv, TargetMatchesPyTorchInF32) {
  const Compared c = compare_target(*target_f32());
  std::printf("[tiny-kjv] target as F32: max |log-prob diff| %.2e over %d positions (top 20 each)\n", c.max_err,
              c.positions);
  EXPECT_GT(c.positions, 200);
  EXPECT_LE(c.max_err, 1e-4);
  EXPECT_EQ(c.top1_same, c.positions);
}

// The shipped Q8_0 file as run by default: the backend also rounds activations to 8 bits (Q8_0 x Q8_0
// dot products, as llama.cpp does), so the bound is looser; the greedy choice rarely moves.
TEST(TinyKjv, TargetQ8_0StaysCloseToPyTorch) {
  const Compared c = compare_target(*target_q8());
  std::printf("[tiny-kjv] target Q8_0: max |log-prob diff| %.2e, top-1 equal at %d of %d positions\n", c.max_err,
              c.top1_same, c.positions);
  EXPECT_LE(c.max_err, 0.15);
  EXPECT_GE(c.top1_same, c.positions * 95 / 100);
}

TEST(TinyKjv, TokenizerMatchesTraining) {
  auto tok = target_q8()->tokenizer();
  ASSERT_TRUE(tok);
  for (const auto& c : golden("tiny-kjv-tokenizer.json")["cases"]) {
    const std::string text = c["text"];
    EXPECT_EQ(tok->encode(text, false, true), c["ids"].get<std::vector<int32_t>>()) << text;
    if (text.find('<') == std::string::npos) {  // no special tokens: the ids decode back to the text
      EXPECT_EQ(tok->decode(c["ids"].get<std::vector<int32_t>>(), true), text);
    }
  }
  // The chat prompt the training rendered is the one Specula's chat format renders.
  auto chat = target_q8()->chat_format();
  ASSERT_TRUE(chat);
  const std::string prompt = golden("tiny-kjv-target.json")["prompt_text"];
  const std::string user = prompt.substr(prompt.find("user\n") + 5, prompt.find("<turn|>") - prompt.find("user\n") - 5);
  const std::vector<specula::ChatMessage> messages{{"user", user}};
  EXPECT_EQ(chat->render(messages, true, false), prompt);
}

// Draft steps after the golden prompt, both heads, on F32 copies of both files.
TEST(TinyKjv, DrafterMatchesPyTorch) {
  const json& g = golden("tiny-kjv-assistant.json");
  auto target = target_f32();
  const auto prompt = g["prompt"].get<std::vector<int32_t>>();
  for (const auto& [name, run] : g["runs"].items()) {
    auto ctx = target->new_context({});
    const auto logits = ctx->forward(prompt, 1);
    ASSERT_EQ(std::max_element(logits.begin(), logits.end()) - logits.begin(), g["x"].get<int64_t>());
    auto d = drafter(f32_copy(kDrafter), target, run["head"]);
    const auto trace = d->trace(ctx->view(), g["x"].get<int32_t>(), 4);
    ASSERT_EQ(trace.size(), run["steps"].size());
    double err = 0;
    for (size_t k = 0; k < trace.size(); ++k) {
      const json& ref = run["steps"][k];
      const auto& st = trace[k];
      std::map<int32_t, float> by_id;
      if (st.ids.empty()) {
        for (size_t i = 0; i < st.logits.size(); ++i) by_id[static_cast<int32_t>(i)] = st.logits[i];
      } else {
        for (size_t i = 0; i < st.ids.size(); ++i) by_id[st.ids[i]] = st.logits[i];
      }
      for (const auto& e : ref["top"]) {
        ASSERT_TRUE(by_id.count(e[0].get<int32_t>())) << name << " step " << k << ": candidate " << e[0];
        err = std::max(err, std::abs(by_id[e[0].get<int32_t>()] - e[1].get<double>()));
      }
      // Each draft feeds the next step, so steps compare only while the drafts agree; they may differ
      // only where the reference's top two are closer than the arithmetic's error.
      if (st.token != ref["token"].get<int32_t>()) {
        EXPECT_LT(ref["margin"].get<double>(), 1e-3) << name << " step " << k << ": draft " << st.token << ", reference "
                                                     << ref["token"];
        break;
      }
      for (size_t i = 0; i < ref["h_next"]["first"].size(); ++i)
        err = std::max(err, std::abs(st.h_next[i] - ref["h_next"]["first"][i].get<double>()));
    }
    std::printf("[tiny-kjv] drafter %s head as F32: max |logit or h diff| %.2e\n",
                run["head"].get<std::string>().c_str(), err);
    EXPECT_LE(err, 1e-3);
  }
}

// Greedy decoding with the drafter gives the plain output, on held-out prompts, and the drafter is
// right often enough to matter (the acceptance is a measurement; the floor catches a broken pairing).
TEST(TinyKjv, SpeculativeGreedyIsLosslessWithRealAcceptance) {
  auto target = target_q8();
  auto d = drafter(kModels / kDrafter, target, "auto");
  EXPECT_TRUE(d->centroid_head());
  auto sampler = [] { return host().make_sampler("standard", specula::SamplingParams{}); };
  auto chat = target->chat_format();
  int64_t drafted = 0, accepted = 0;
  for (const auto& text : golden("tiny-kjv-assistant.json")["held_out_prompts"]) {
    const std::vector<specula::ChatMessage> messages{{"user", text.get<std::string>()}};
    const auto ids = target->tokenizer()->encode(chat->render(messages, true, false), false, true);
    specula::core::GenerationOptions o;
    o.max_tokens = 40;
    o.draft_tokens = 3;
    const auto want = specula::core::Generator(target, sampler()).generate(ids, o);
    const auto got = specula::core::Generator(target, sampler(), d).generate(ids, o);
    EXPECT_EQ(got.tokens, want.tokens) << text;
    drafted += got.stats.drafted_tokens;
    accepted += got.stats.accepted_tokens;
    // llama.cpp's loop: its first 40 tokens are the plain ones as well (it may stop a little later).
    o.convention = specula::core::DraftConvention::LlamaCpp;
    const auto lcpp = specula::core::Generator(target, sampler(), d).generate(ids, o);
    if (lcpp.stop_reason == specula::core::StopReason::MaxTokens) {
      ASSERT_GT(lcpp.tokens.size(), want.tokens.size()) << text;
      EXPECT_EQ(std::vector<int32_t>(lcpp.tokens.begin(), lcpp.tokens.begin() + want.tokens.size()), want.tokens) << text;
    } else {
      EXPECT_EQ(lcpp.tokens, want.tokens) << text;
    }
  }
  const double rate = drafted ? double(accepted) / drafted : 0;
  std::printf("[tiny-kjv] held-out prompts, greedy, K = 3: %lld of %lld drafts accepted (%.1f %%)\n",
              static_cast<long long>(accepted), static_cast<long long>(drafted), 100 * rate);
  EXPECT_GT(drafted, 0);
  EXPECT_GE(rate, 0.3);
}

// A greedy round kept on the backend (docs/architecture.md): the drafter writes its drafts into the
// target context's draft tokens, the target verifies them there and one read returns the drafts and its
// argmaxes; rollback needs none. So every step (plain or speculative) reads once and writes nothing,
// and the tokens are plain decoding's.
TEST(TinyKjv, GreedyRoundReadsOnceFromTheBackendAndEqualsPlain) {
  auto counting = std::make_shared<specula_test::CountingBackend>(backend());
  auto file = host().open_model(kModels / kTarget);
  auto target = host().find_model_loader(*file)->load(file, counting, json::object());
  auto sampler = [] { return host().make_sampler("standard", specula::SamplingParams{}); };
  auto chat = target->chat_format();
  const std::string text = golden("tiny-kjv-assistant.json")["held_out_prompts"][0].get<std::string>();
  const std::vector<specula::ChatMessage> messages{{"user", text}};
  const auto ids = target->tokenizer()->encode(chat->render(messages, true, false), false, true);
  for (auto [k, head] : {std::pair{1, "centroid"}, std::pair{3, "centroid"}, std::pair{2, "dense"}}) {
    auto d = ga::load_drafter(host().open_model(kModels / kDrafter), counting, target->info(), {{"head", head}});
    specula::core::GenerationOptions o;
    o.max_tokens = 48;
    o.draft_tokens = k;
    auto plain_ctx = target->new_context({});
    const auto want = specula::core::Generator(target, sampler()).generate(*plain_ctx, ids, o);
    auto ctx = target->new_context({});
    specula::core::Generation gen = specula::core::Generator(target, sampler(), d).start(*ctx, ids, o);
    const auto got = specula_test::finish_reading_once(gen, *counting, fmt::format("{} K = {}", head, k));
    EXPECT_EQ(got.tokens, want.tokens) << head << " K = " << k;
    EXPECT_GT(got.stats.speculative_steps, 0) << head << " K = " << k;
    EXPECT_EQ(got.stats.device_verified_steps, got.stats.speculative_steps) << head << " K = " << k;
    EXPECT_EQ(got.stats.host_sampled_tokens, 0) << head << " K = " << k;
    EXPECT_GT(got.stats.accepted_tokens, 0) << head << " K = " << k;
  }
}

// The acceptance replay (`specula bench --acceptance-profile`) on the real pair, its rounds held on the
// backend: the planted drafts are written into the drafts the drafter left there, every round is verified
// there, and acceptance is the profile's: none at 0, all at 1, and per position within binomial bounds at
// 0.8,0.5 over the eight held-out verses continued as plain text; the tokens are plain greedy decoding's.
TEST(TinyKjv, AcceptanceReplayPlantsItsProfileInRoundsHeldOnTheBackend) {
  auto target = target_q8();
  auto d = drafter(kModels / kDrafter, target, "auto");
  auto sampler = [] { return host().make_sampler("standard", specula::SamplingParams{}); };
  specula::core::GenerationOptions o;
  o.max_tokens = 120;
  o.draft_tokens = 3;
  int64_t rounds = 0, drafted[3] = {}, accepted[3] = {};
  int prompts = 0;
  for (const auto& text : golden("tiny-kjv-assistant.json")["held_out_prompts"]) {
    const auto ids = target->tokenizer()->encode(text.get<std::string>(), true, false);
    specula::core::GenerationOptions go;
    go.max_tokens = o.max_tokens + o.draft_tokens + 1;
    const auto plain = specula::core::Generator(target, sampler()).generate(ids, go);
    std::vector<int32_t> greedy = ids;
    greedy.insert(greedy.end(), plain.tokens.begin(), plain.tokens.end());
    if (plain.stop_reason == specula::core::StopReason::EndToken) greedy.push_back(plain.stop_token);
    const std::vector<int32_t> want(plain.tokens.begin(),
                                    plain.tokens.begin() + std::min<size_t>(plain.tokens.size(), o.max_tokens));
    const bool extremes = prompts++ < 2;
    for (const std::vector<double>& profile : extremes ? std::vector<std::vector<double>>{{0}, {1, 1, 1}, {0.8, 0.5}}
                                                       : std::vector<std::vector<double>>{{0.8, 0.5}}) {
      specula::core::AcceptanceReplay replay(profile, greedy, 3, backend().get());
      o.draft_hook = &replay;
      const auto got = specula::core::Generator(target, sampler(), d).generate(ids, o);
      const auto& s = got.stats;
      const std::string what = fmt::format("'{}', profile of {} entries starting {}", text.get<std::string>(),
                                           profile.size(), profile[0]);
      EXPECT_EQ(got.tokens, want) << what;
      EXPECT_GT(s.speculative_steps, 0) << what;
      EXPECT_EQ(s.device_verified_steps, s.speculative_steps) << what << ": rounds held on the backend";
      if (profile[0] == 0) {
        EXPECT_EQ(s.accepted_tokens, 0) << what;
      } else if (profile[0] == 1) {
        EXPECT_EQ(s.accepted_tokens, s.drafted_tokens) << what;
      }
      if (profile.size() != 2) continue;
      rounds += s.speculative_steps;
      for (size_t i = 0; i < 3 && i < s.drafted_by_position.size(); ++i)
        drafted[i] += s.drafted_by_position[i], accepted[i] += s.accepted_by_position[i];
    }
  }
  ASSERT_GT(rounds, 300);
  for (int i = 0; i < 3; ++i) {
    const double p = i == 0 ? 0.8 : i == 1 ? 0.5 : 0.0;
    ASSERT_GT(drafted[i], 0);
    EXPECT_NEAR(double(accepted[i]) / drafted[i], p, 4.5 * std::sqrt(p * (1 - p) / drafted[i]))
        << "draft " << i + 1 << ": " << accepted[i] << " of " << drafted[i] << " rounds accepted it";
  }
  std::printf("[tiny-kjv] acceptance replay at 0.8,0.5, K = 3: %lld rounds, first drafts accepted %.3f, first two "
              "%.3f, three %.3f\n", static_cast<long long>(rounds), double(accepted[0]) / drafted[0],
              double(accepted[1]) / drafted[1], double(accepted[2]) / drafted[2]);
}

// A sampled round kept on the backend (docs/sampling.md, "Speculative sampling"): the drafter draws each
// draft in its graph and leaves it and its logits there, the target decides the round with AcceptDrafts,
// and one read returns the emitted tokens. The tokens are those of the same seed with every round decided
// on the host (sampler.device: off), for both heads and several draft lengths: the float32 rule is the
// same on both sides. With a repetition penalty (which depends on the drafts) the host decides and says so.
TEST(TinyKjv, SampledRoundReadsOnceFromTheBackendAndEqualsTheHost) {
  auto counting = std::make_shared<specula_test::CountingBackend>(backend());
  auto file = host().open_model(kModels / kTarget);
  auto target = host().find_model_loader(*file)->load(file, counting, json::object());
  auto chat = target->chat_format();
  const auto& prompts = golden("tiny-kjv-assistant.json")["held_out_prompts"];
  int64_t rounds = 0, accepted = 0, drafted = 0;
  for (auto [k, head, seed] : {std::tuple{1, "centroid", 1}, std::tuple{3, "centroid", 2}, std::tuple{2, "dense", 3},
                               std::tuple{4, "dense", 4}}) {
    auto d = ga::load_drafter(host().open_model(kModels / kDrafter), counting, target->info(), {{"head", head}});
    const std::vector<specula::ChatMessage> messages{{"user", prompts[seed].get<std::string>()}};
    const auto ids = target->tokenizer()->encode(chat->render(messages, true, false), false, true);
    specula::core::GenerationOptions o;
    o.max_tokens = 48;
    o.draft_tokens = k;
    auto params = [&, seed = seed](specula::SamplingDevice device) {  // a structured binding: captured by init (clang)
      specula::SamplingParams p{.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = static_cast<uint64_t>(seed)};
      p.device = device;
      return p;
    };
    auto host_ctx = target->new_context({});
    const auto want = specula::core::Generator(target, host().make_sampler("standard", params(specula::SamplingDevice::Off)), d)
                          .generate(*host_ctx, ids, o);
    EXPECT_EQ(want.stats.device_verified_steps, 0);
    auto ctx = target->new_context({});
    specula::core::Generation gen =
        specula::core::Generator(target, host().make_sampler("standard", params(specula::SamplingDevice::Auto)), d)
            .start(*ctx, ids, o);
    const auto got = specula_test::finish_reading_once(gen, *counting, fmt::format("{} K = {}", head, k));
    EXPECT_EQ(got.tokens, want.tokens) << head << " K = " << k;
    EXPECT_EQ(got.stats.accepted_tokens, want.stats.accepted_tokens) << head << " K = " << k;
    EXPECT_GT(got.stats.speculative_steps, 0) << head << " K = " << k;
    EXPECT_EQ(got.stats.device_verified_steps, got.stats.speculative_steps) << head << " K = " << k;
    EXPECT_EQ(got.stats.host_sampled_tokens, 0) << head << " K = " << k;
    rounds += got.stats.speculative_steps;
    accepted += got.stats.accepted_tokens;
    drafted += got.stats.drafted_tokens;
  }
  std::printf("[tiny-kjv] sampled rounds on the backend: %lld rounds, %lld of %lld drafts accepted\n",
              static_cast<long long>(rounds), static_cast<long long>(accepted), static_cast<long long>(drafted));
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);  // rejections (replacements from the residual) happened too

  // A repetition penalty reads the drafts: the host decides, the reason is given, the tokens are the same.
  auto d = ga::load_drafter(host().open_model(kModels / kDrafter), counting, target->info(), json::object());
  const std::vector<specula::ChatMessage> messages{{"user", prompts[0].get<std::string>()}};
  const auto ids = target->tokenizer()->encode(chat->render(messages, true, false), false, true);
  specula::core::GenerationOptions o;
  o.max_tokens = 16;
  std::vector<std::vector<int32_t>> runs;
  for (auto device : {specula::SamplingDevice::Off, specula::SamplingDevice::Auto}) {
    specula::SamplingParams p{.temperature = 0.8f, .top_k = 40, .repetition_penalty = 1.2f, .seed = 5};
    p.device = device;
    auto ctx = target->new_context({});
    const auto r = specula::core::Generator(target, host().make_sampler("standard", p), d).generate(*ctx, ids, o);
    EXPECT_EQ(r.stats.device_verified_steps, 0);
    if (device == specula::SamplingDevice::Auto) {
      EXPECT_NE(r.stats.host_sampling_reason.find("repetition penalty"), std::string::npos) << r.stats.host_sampling_reason;
    }
    runs.push_back(r.tokens);
  }
  EXPECT_EQ(runs[1], runs[0]);
}

// OpenAI's presence / frequency penalties and logit_bias read what was generated (the drafts included
// while a round is verified): greedy decoding with them and the drafter on gives the tokens it gives
// without the drafter, the drafts verified on the host, and the reason names them.
TEST(TinyKjv, PenaltiesAndLogitBiasKeepDraftingOnAndEqualPlainGreedy) {
  auto target = target_q8();
  auto d = drafter(kModels / kDrafter, target, "auto");
  const auto ids = chat_ids(*target, golden("tiny-kjv-assistant.json")["held_out_prompts"][0].get<std::string>());
  specula::core::GenerationOptions o;
  o.max_tokens = 32;
  o.draft_tokens = 3;
  specula::SamplingParams p{.temperature = 0.0f, .presence_penalty = 0.7f, .frequency_penalty = 0.4f};
  // Two biases that move the argmax somewhere: favour the prompt's last token, forbid the plain run's first.
  {
    auto ctx = target->new_context({});
    const auto first = specula::core::Generator(target, host().make_sampler("standard", specula::SamplingParams{}), nullptr).generate(*ctx, ids, o);
    ASSERT_FALSE(first.tokens.empty());
    p.logit_bias = {{first.tokens[0], -100.0f}, {ids.back(), 1.5f}};
  }
  std::vector<specula::core::GenerationResult> runs;
  for (auto dr : {std::shared_ptr<ga::AssistantDrafter>{}, d}) {
    auto ctx = target->new_context({});
    runs.push_back(specula::core::Generator(target, host().make_sampler("standard", p), dr).generate(*ctx, ids, o));
  }
  EXPECT_EQ(runs[1].tokens, runs[0].tokens);
  EXPECT_GT(runs[1].stats.speculative_steps, 0);
  EXPECT_GT(runs[1].stats.accepted_tokens, 0);
  EXPECT_NE(runs[0].tokens.front(), p.logit_bias[0].first);
  for (const auto& r : runs) {
    EXPECT_EQ(r.stats.device_sampled_tokens, 0);
    EXPECT_NE(r.stats.host_sampling_reason.find("presence_penalty"), std::string::npos) << r.stats.host_sampling_reason;
  }
  // Penalties change the answer (else the test would prove little): the plain greedy run differs.
  auto ctx = target->new_context({});
  const auto plain = specula::core::Generator(target, host().make_sampler("standard", specula::SamplingParams{}), nullptr).generate(*ctx, ids, o);
  EXPECT_NE(plain.tokens, runs[0].tokens);
  // The same context again (as a server slot is): the device graph cached for the plain sampler must not
  // serve the penalised one (Sampler::device_key tells them apart).
  ctx->truncate(0);
  for (auto dr : {std::shared_ptr<ga::AssistantDrafter>{}, d}) {
    ctx->truncate(0);
    const auto again = specula::core::Generator(target, host().make_sampler("standard", p), dr).generate(*ctx, ids, o);
    EXPECT_EQ(again.tokens, runs[0].tokens) << (dr ? "with" : "without") << " the drafter, a reused context";
    EXPECT_EQ(again.stats.device_sampled_tokens, 0);
  }
}

// logprobs: log_softmax of the target's raw logits at each emitted position, the same with and without
// the drafter (there: the verification row each accepted draft and each correction/bonus came from), and
// equal to log_softmax of one plain forward over prompt + answer.
TEST(TinyKjv, LogprobsAgreeWithAndWithoutTheDrafterAndWithAPlainForward) {
  auto target = target_q8();
  auto d = drafter(kModels / kDrafter, target, "auto");
  const auto ids = chat_ids(*target, golden("tiny-kjv-assistant.json")["held_out_prompts"][1].get<std::string>());
  for (const float temperature : {0.0f, 0.8f}) {
    SCOPED_TRACE(fmt::format("temperature {}", temperature));
    specula::core::GenerationOptions o;
    o.max_tokens = 24;
    o.draft_tokens = 3;
    o.logprobs = 5;
    int streamed = 0;
    o.on_logprob = [&](const specula::core::TokenLogprob&) { ++streamed; };
    const specula::SamplingParams p{.temperature = temperature, .top_k = 40, .seed = 3};
    std::vector<specula::core::GenerationResult> runs;
    for (auto dr : {std::shared_ptr<ga::AssistantDrafter>{}, d}) {
      auto ctx = target->new_context({});
      runs.push_back(specula::core::Generator(target, host().make_sampler("standard", p), dr).generate(*ctx, ids, o));
    }
    const auto& plain = runs[0];
    const auto& spec = runs[1];
    EXPECT_EQ(streamed, static_cast<int>(plain.tokens.size() + spec.tokens.size()));
    EXPECT_GT(spec.stats.accepted_tokens, 0);
    EXPECT_NE(spec.stats.host_sampling_reason.find("logprobs"), std::string::npos) << spec.stats.host_sampling_reason;
    ASSERT_EQ(plain.logprobs.size(), plain.tokens.size());
    ASSERT_EQ(spec.logprobs.size(), spec.tokens.size());
    if (temperature == 0.0f) {
      ASSERT_EQ(spec.tokens, plain.tokens);
    }
    // One forward over prompt + the plain run's answer: row i is the distribution of token i.
    std::vector<int32_t> all = ids;
    all.insert(all.end(), plain.tokens.begin(), plain.tokens.end() - 1);
    auto ctx = target->new_context({});
    const auto logits = ctx->forward(all, static_cast<int64_t>(plain.tokens.size()));
    const size_t vocab = static_cast<size_t>(target->info().vocab_size);
    double worst_spec = 0, worst_forward = 0;
    const size_t same = std::min(plain.tokens.size(), spec.tokens.size());
    for (size_t i = 0; i < plain.tokens.size(); ++i) {
      const auto& a = plain.logprobs[i];
      EXPECT_EQ(a.token, plain.tokens[i]);
      ASSERT_EQ(a.top.size(), 5u);
      const auto want = log_softmax(logits.data() + i * vocab, vocab);
      worst_forward = std::max(worst_forward, std::abs(a.logprob - want[static_cast<size_t>(a.token)]));
      for (const auto& [t, lp] : a.top) worst_forward = std::max(worst_forward, std::abs(lp - want[static_cast<size_t>(t)]));
      for (size_t j = 1; j < a.top.size(); ++j) EXPECT_GE(a.top[j - 1].second, a.top[j].second);
      // The speculative run's positions agree while its tokens do (sampled: up to the first difference).
      bool prefix = i < same && std::equal(plain.tokens.begin(), plain.tokens.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                                           spec.tokens.begin());
      if (!prefix) continue;
      const auto& b = spec.logprobs[i];
      worst_spec = std::max(worst_spec, static_cast<double>(std::abs(a.logprob - b.logprob)));
      ASSERT_EQ(b.top.size(), a.top.size());
      for (size_t j = 0; j < a.top.size(); ++j) {
        EXPECT_EQ(b.top[j].first, a.top[j].first) << "position " << i;
        worst_spec = std::max(worst_spec, static_cast<double>(std::abs(a.top[j].second - b.top[j].second)));
      }
    }
    std::printf("[tiny-kjv] logprobs, temperature %.1f: largest difference with/without the drafter %.2e, against a "
                "plain forward %.2e\n", temperature, worst_spec, worst_forward);
    EXPECT_LT(worst_spec, 1e-4);
    EXPECT_LT(worst_forward, 1e-4);
  }
}

// Where the backend cannot decide a sampled round (no AcceptDrafts: the verification graph; no TopPDraw:
// the drafter's draw), the round runs on the host, the reason names the op, and the tokens are the same.
TEST(TinyKjv, SampledRoundFallsBackToTheHostWhereTheBackendCannot) {
  const std::vector<specula::ChatMessage> messages{
      {"user", golden("tiny-kjv-assistant.json")["held_out_prompts"][2].get<std::string>()}};
  for (const specula::Op op : {specula::Op::AcceptDrafts, specula::Op::TopPDraw}) {
    auto lacking = std::make_shared<specula_test::CountingBackend>(backend());
    lacking->lacking = {op};
    auto file = host().open_model(kModels / kTarget);
    auto target = host().find_model_loader(*file)->load(file, lacking, json::object());
    auto d = ga::load_drafter(host().open_model(kModels / kDrafter), lacking, target->info(), json::object());
    const auto ids = target->tokenizer()->encode(target->chat_format()->render(messages, true, false), false, true);
    specula::core::GenerationOptions o;
    o.max_tokens = 24;
    o.draft_tokens = 2;
    std::vector<std::vector<int32_t>> runs;
    for (auto device : {specula::SamplingDevice::Off, specula::SamplingDevice::Auto}) {
      specula::SamplingParams p{.temperature = 0.8f, .top_k = 40, .seed = 9};
      p.device = device;
      auto ctx = target->new_context({});
      const auto r = specula::core::Generator(target, host().make_sampler("standard", p), d).generate(*ctx, ids, o);
      EXPECT_GT(r.stats.speculative_steps, 0) << op_name(op);
      EXPECT_EQ(r.stats.device_verified_steps, 0) << op_name(op);
      if (device == specula::SamplingDevice::Auto) {
        EXPECT_NE(r.stats.host_sampling_reason.find(std::string(op_name(op))), std::string::npos)
            << op_name(op) << ": " << r.stats.host_sampling_reason;
      }
      runs.push_back(r.tokens);
    }
    EXPECT_EQ(runs[1], runs[0]) << op_name(op);
  }
}

// Several prompts of different lengths decoded together (Generation::step_all: one target forward per
// step for all of them, its rounds decided on the backend in one graph), plain and with the drafter,
// greedy and sampled: each sequence's tokens are the ones it gets alone (a sampler of the same seed),
// while the sequences accept different numbers of drafts and roll back on their own.
TEST(TinyKjv, BatchedSequencesEqualEachAloneWithAndWithoutTheDrafter) {
  auto target = target_q8();
  auto d = drafter(kModels / kDrafter, target, "auto");
  for (const bool sampled : {false, true}) {
  specula::SamplingParams params;
  if (sampled) {
    params.temperature = 0.9f;
    params.top_k = 40;
    params.seed = 11;
  }
  auto sampler = [&] { return host().make_sampler("standard", params); };
  auto chat = target->chat_format();
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& text : golden("tiny-kjv-assistant.json")["held_out_prompts"]) {
    const std::vector<specula::ChatMessage> messages{{"user", text.get<std::string>()}};
    prompts.push_back(target->tokenizer()->encode(chat->render(messages, true, false), false, true));
    if (prompts.size() == 4) break;
  }
  ASSERT_EQ(prompts.size(), 4u);
  specula::core::GenerationOptions o;
  o.max_tokens = 24;
  o.draft_tokens = 3;
  for (const bool speculative : {false, true}) {
    const auto drafter = speculative ? d : nullptr;
    std::vector<std::vector<int32_t>> alone;
    for (const auto& p : prompts) alone.push_back(specula::core::Generator(target, sampler(), drafter).generate(p, o).tokens);
    std::vector<std::unique_ptr<specula::ModelContext>> contexts;
    std::vector<specula::core::Generator> generators;
    generators.reserve(prompts.size());  // a Generation may point into its Generator
    std::vector<specula::core::Generation> running;
    for (const auto& p : prompts) {
      contexts.push_back(target->new_context({}));
      generators.emplace_back(target, sampler(), drafter);
      running.push_back(generators.back().start(*contexts.back(), p, o));
    }
    std::vector<specula::core::Generation*> all;
    for (auto& g : running) all.push_back(&g);
    for (int step = 0; step < 100; ++step) specula::core::Generation::step_all(all);
    std::set<int64_t> accepted;
    for (size_t i = 0; i < running.size(); ++i) {
      ASSERT_TRUE(running[i].finished()) << "sequence " << i;
      const auto result = running[i].finish();
      const std::string what = fmt::format("sequence {}{}{}", i, speculative ? " with the drafter" : "",
                                           sampled ? ", sampled" : "");
      EXPECT_EQ(result.tokens, alone[i]) << what;
      accepted.insert(result.stats.accepted_tokens);
      EXPECT_EQ(result.stats.host_sampled_tokens, 0) << what << ": " << result.stats.host_sampling_reason;
      if (speculative) {
        EXPECT_GT(result.stats.speculative_steps, 0) << what;
        EXPECT_EQ(result.stats.device_verified_steps, result.stats.speculative_steps) << what;
      }
    }
    if (speculative) {
      EXPECT_GT(accepted.size(), 1u) << "every sequence accepted as many drafts";
    }
  }
  }
}

// ---------------------------------------------------------------------------- structured output
// The recognizer behind response_format json_object, on texts written by hand.
TEST(JsonObjectConstraint, RecognizerTakesJsonObjectsAndTheirPrefixesOnly) {
  for (const char* whole : {"{}", "{\"a\":1}", "{ \"a\" : [1, -2.5e+3, 0, true, false, null, {\"b\": \"\\u00e9\\n\\ud83d\\ude00\"}] }",
                            "{\"k\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}", "{\"a\":{\"b\":{\"c\":[[]]}}}",
                            "{\n  \"x\": 0.5\n}"}) {
    const auto r = specula::check_json_object_prefix(whole);
    EXPECT_TRUE(r.valid && r.complete) << whole;
    EXPECT_TRUE(nlohmann::json::accept(whole)) << whole;  // the reference agrees
    for (size_t n = 0; n < std::strlen(whole); ++n) {
      const auto p = specula::check_json_object_prefix(std::string_view(whole, n));
      EXPECT_TRUE(p.valid && !p.complete) << "prefix " << n << " of " << whole;
    }
  }
  for (const char* bad : {"[]", "1", "\"a\"", "{a:1}", "{\"a\" 1}", "{\"a\":01}", "{\"a\":1,}", "{\"a\":-}",
                          "{\"a\":1.}", "{\"a\":tru}", "{\"a\":\"\n\"}", "{\"a\":\"\\x\"}", "{\"a\":[1}",
                          "{\"a\":1]", "{} ", "{}{}", "{\"a\":\"\xc0\xaf\"}", "{\"a\":\"\xed\xa0\x80\"}",
                          "{                 }", "{\"a\":1e100}", "{\"a\":123456789012345678901}", "{\"a\":\"\\ud800\"}", "{\"a\":\"\\udc00\"}", "{\"a\":\"\\ud800\\n\"}"}) {
    EXPECT_FALSE(specula::check_json_object_prefix(bad).valid) << bad;
  }
  std::string deep = "{\"a\":";
  for (int i = 0; i < 63; ++i) deep += "[";
  EXPECT_TRUE(specula::check_json_object_prefix(deep).valid);
  EXPECT_FALSE(specula::check_json_object_prefix(deep + "[").valid) << "nesting is capped at 64 levels";
}

// The mask over Gemma's 262144 tokens equals trying every token's bytes after the text so far.
TEST(JsonObjectConstraint, MaskEqualsEveryTokenTriedOnItsOwn) {
  auto target = target_q8();
  const auto tok = target->tokenizer();
  const int64_t V = target->info().vocab_size;
  const int32_t end = target->info().end_tokens.front();
  auto c = specula::json_object_constraint(specula::token_trie(tok), {end}, V);
  const std::vector<int32_t> prefix = tok->encode("{\"name\": \"Lo", false, false);
  for (const int32_t t : prefix) c->accept(t);
  for (const std::string& more : {std::string(), std::string("rd\", \"n\": 1"), std::string("rd\"}")}) {
    SCOPED_TRACE("after '{\"name\": \"Lo" + more + "'");
    const std::vector<int32_t> pending = tok->encode(more, false, false);
    const std::string text = tok->decode(prefix, false) + tok->decode(pending, false);
    std::vector<float> logits(static_cast<size_t>(V), 0.0f);
    c->mask(logits, pending);
    const bool complete = specula::check_json_object_prefix(text).complete;
    int64_t allowed = 0;
    for (int32_t id = 0; id < V; ++id) {
      const bool want = complete ? id == end
                                 : !tok->is_special(id) && !tok->token_bytes(id).empty() &&
                                       specula::check_json_object_prefix(text + tok->token_bytes(id)).valid;
      ASSERT_EQ(std::isinf(logits[static_cast<size_t>(id)]), !want) << "token " << id << " '" << tok->token_bytes(id) << "'";
      allowed += want;
    }
    EXPECT_GT(allowed, 0);
  }
  EXPECT_EQ(V, tok->vocab_size());
  std::printf("[json_object] vocabulary %lld tokens\n", static_cast<long long>(V));
  EXPECT_THROW(c->accept(tok->encode("\n", false, false).front()), specula::Error) << "a raw newline inside a string";
}

// response_format json_object on the default pair: the answer is a JSON object (or, cut by max_tokens, a
// prefix of one), greedy output is the same with and without the drafter, drafts still run, and the
// statistics say why rounds verify on the host.
TEST(TinyKjv, JsonObjectOutputWithAndWithoutTheDrafter) {
  auto target = target_q8();
  auto d = drafter(kModels / kDrafter, target, "auto");
  const auto tok = target->tokenizer();
  const auto prompt = chat_ids(*target, "Give the name of the first king of Israel as JSON.");
  for (const bool sampled : {false, true}) {
    specula::SamplingParams params;
    if (sampled) {
      params.temperature = 0.8f;
      params.seed = 5;
    }
    specula::core::GenerationOptions o;
    o.max_tokens = 48;
    o.draft_tokens = 3;
    o.response_format = "json_object";
    std::vector<std::vector<int32_t>> outputs;
    for (const bool speculative : {false, true}) {
      const std::string what = fmt::format("{}{}", sampled ? "sampled" : "greedy", speculative ? ", drafter" : "");
      const auto r = specula::core::Generator(target, host().make_sampler("standard", params), speculative ? d : nullptr)
                         .generate(prompt, o);
      const std::string text = tok->decode(r.tokens, false);
      const auto check = specula::check_json_object_prefix(text);
      EXPECT_TRUE(check.valid) << what << ": " << text;
      if (r.stop_reason == specula::core::StopReason::EndToken) {
        EXPECT_TRUE(check.complete) << what << ": " << text;
        EXPECT_TRUE(nlohmann::json::parse(text).is_object()) << what << ": " << text;
      }
      EXPECT_NE(r.stats.host_sampling_reason.find("json_object"), std::string::npos) << r.stats.host_sampling_reason;
      if (speculative) {
        EXPECT_GT(r.stats.speculative_steps, 0) << what;
      }
      std::printf("[json_object] %s: %s (%s, acceptance %lld/%lld)\n", what.c_str(), text.c_str(),
                  r.stop_reason == specula::core::StopReason::EndToken ? "complete" : "cut",
                  static_cast<long long>(r.stats.accepted_tokens), static_cast<long long>(r.stats.drafted_tokens));
      outputs.push_back(r.tokens);
    }
    if (!sampled) {
      EXPECT_EQ(outputs[0], outputs[1]) << "greedy output changed with the drafter";
    }
  }
}

// What `make run` runs: the answer on stdout, the --json object with the baseline and the speed-up.
TEST(TinyKjv, DefaultPipelineRunsWithTheDrafter) {
  const std::string cmd = "cd '" + std::string(SPECULA_SOURCE_DIR) + "' && SPECULA_PLUGIN_PATH= '" + SPECULA_CLI +
                          "' run configs/default.yaml --plugin-path '" + SPECULA_PLUGIN_DIR +
                          "' --prompt 'And God said unto Noah, Make thee an ark.' --max-tokens 24 --speedup --json -q";
  FILE* pipe = popen(cmd.c_str(), "r");
  ASSERT_TRUE(pipe);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, n);
  ASSERT_EQ(pclose(pipe), 0) << out;
  const json j = json::parse(out);
  const std::string text = j["text"];
  EXPECT_FALSE(text.empty());
  int letters = 0;
  for (char ch : text) letters += std::isalpha(static_cast<unsigned char>(ch)) || ch == ' ';
  EXPECT_GE(letters, static_cast<int>(text.size()) * 8 / 10) << text;  // English words, not byte soup
  EXPECT_GT(j["stats"]["drafted_tokens"].get<int64_t>(), 0);
  EXPECT_GT(j["baseline"]["decode_tokens_per_second"].get<double>(), 0);
  EXPECT_EQ(j["baseline"]["tokens"], j["tokens"]) << "greedy: the plain run makes the same tokens";
  EXPECT_GT(j["speedup"].get<double>(), 0);
  // The ratio is of the medians of five alternating runs each.
  EXPECT_EQ(j["speedup_runs"]["runs_each"].get<int>(), 5);
  EXPECT_NEAR(j["speedup"].get<double>(),
              j["speedup_runs"]["decode_tokens_per_second"].get<double>() /
                  j["baseline"]["decode_tokens_per_second"].get<double>(),
              1e-9);
}

}  // namespace
