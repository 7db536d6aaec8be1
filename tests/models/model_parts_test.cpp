// The LM head and attention as plugin kinds (specula/lm_head.hpp, specula/attention.hpp) on the shipped
// tiny pair: the pipeline names the head and the attention of the target and of the drafter
// (target.lm_head, target.attention, the same under drafter). The standard parts named explicitly equal
// the defaults; a third head (test-half-head: the dense head, halved) changes exactly the target's and
// the dense drafter's logits; a third attention (test-row-split-attention: the standard one by halves of
// the query rows) gives the standard logits by another graph; a head that refuses the drafter's centroid
// weights, or an unknown plugin, fails the pipeline with a message naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "../foundation/test_util.hpp"
#include "specula/core/pipeline.hpp"
#include "specula/core/plugin_host.hpp"
#include "specula/error.hpp"
#include "specula/model.hpp"

namespace {

namespace fs = std::filesystem;
using specula::core::Override;

const specula::core::PluginHost& host() {
  static auto* h = [] {
    auto* p = new specula::core::PluginHost();
    p->discover({fs::path(TEST_PARTS_PLUGIN_DIR), fs::path(SPECULA_PLUGIN_DIR)});
    return p;
  }();
  return *h;
}

specula::core::BuiltPipeline build(std::vector<Override> overrides) {
  overrides.push_back({"drafter.options.head", "dense", "test"});
  const auto p = specula::core::load_pipeline(fs::path(SPECULA_SOURCE_DIR) / "configs/default.yaml", overrides);
  return specula::core::build_pipeline(p, host());
}

const std::vector<int32_t>& prompt() {
  static const std::vector<int32_t> ids = [] {
    auto b = build({});
    return b.target->tokenizer()->encode("And God said, Let there be light", false, true);
  }();
  return ids;
}

struct Outputs {
  std::vector<float> target;  // the target's logits after the prompt
  std::vector<float> prompt;  // the target's logits at every prompt position (a multi-row step)
  std::vector<specula::DraftStep> draft;
};

Outputs run(const specula::core::BuiltPipeline& b) {
  Outputs out;
  auto ctx = b.target->new_context({});
  out.prompt = ctx->forward(prompt(), static_cast<int64_t>(prompt().size()));
  out.target.assign(out.prompt.end() - b.target->info().vocab_size, out.prompt.end());
  const int32_t next = static_cast<int32_t>(std::max_element(out.target.begin(), out.target.end()) - out.target.begin());
  specula::DraftRequest request;
  request.last_token = next;
  request.n = 3;
  request.logits = true;
  out.draft = b.drafter->draft(ctx->view(), request);
  return out;
}

TEST(ModelParts, TheStandardPartsNamedByThePipelineEqualTheDefaults) {
  const Outputs def = run(build({}));
  const auto b = build({{"target.lm_head", "lm-head", "test"}, {"drafter.lm_head", "lm-head", "test"},
                        {"target.attention", "attention", "test"}, {"drafter.attention", "attention", "test"}});
  EXPECT_EQ(b.target->info().details["lm_head"], "lm-head");
  EXPECT_EQ(b.target->info().details["attention"], "attention");
  const Outputs named = run(b);
  EXPECT_EQ(named.prompt, def.prompt);
  EXPECT_EQ(named.target, def.target);
  ASSERT_EQ(named.draft.size(), def.draft.size());
  for (size_t k = 0; k < def.draft.size(); ++k) {
    EXPECT_EQ(named.draft[k].token, def.draft[k].token);
    EXPECT_EQ(named.draft[k].logits, def.draft[k].logits);
  }
}

TEST(ModelParts, AThirdHeadReplacesTheTargetsAndTheDraftersHead) {
  const Outputs def = run(build({}));
  const Outputs half = run(build({{"target.lm_head", "test-half-head", "test"}, {"drafter.lm_head", "test-half-head", "test"}}));
  ASSERT_EQ(half.target.size(), def.target.size());
  for (size_t i = 0; i < def.target.size(); ++i) ASSERT_EQ(half.target[i], 0.5f * def.target[i]) << "logit " << i;
  ASSERT_EQ(half.draft.size(), def.draft.size());
  for (size_t k = 0; k < def.draft.size(); ++k) {
    EXPECT_EQ(half.draft[k].token, def.draft[k].token);  // halving keeps the argmax
    ASSERT_EQ(half.draft[k].logits.size(), def.draft[k].logits.size());
    for (size_t i = 0; i < def.draft[k].logits.size(); ++i)
      ASSERT_EQ(half.draft[k].logits[i], 0.5f * def.draft[k].logits[i]) << "draft step " << k << ", logit " << i;
  }
  // Only the drafter's head replaced: the target's logits stay the default's.
  const Outputs mixed = run(build({{"drafter.lm_head", "test-half-head", "test"}}));
  EXPECT_EQ(mixed.target, def.target);
  EXPECT_EQ(mixed.draft[0].logits[0], 0.5f * def.draft[0].logits[0]);
}

TEST(ModelParts, AThirdAttentionReplacesTheTargetsAndTheDraftersAndGivesTheSameLogits) {
  const auto def_pipeline = build({});
  EXPECT_EQ(def_pipeline.target->info().details["attention"], "attention");  // the standard one
  const Outputs def = run(def_pipeline);
  const auto b = build({{"target.attention", "test-row-split-attention", "test"},
                        {"drafter.attention", "test-row-split-attention", "test"}});
  EXPECT_EQ(b.target->info().details["attention"], "test-row-split-attention");
  const Outputs split = run(b);
  ASSERT_EQ(split.prompt.size(), def.prompt.size());
  // Another graph for the same values: the kernels see other row counts, so allow float rounding.
  double worst = 0;
  for (size_t i = 0; i < def.prompt.size(); ++i) worst = std::max(worst, std::abs(double(split.prompt[i]) - def.prompt[i]));
  EXPECT_LT(worst, 1e-4) << "max |logit difference| over " << prompt().size() << " prompt positions";
  ASSERT_EQ(split.draft.size(), def.draft.size());
  for (size_t k = 0; k < def.draft.size(); ++k) EXPECT_EQ(split.draft[k].token, def.draft[k].token);
}

TEST(ModelParts, APartThatRefusesTheWeightsOrAnUnknownPluginFailsThePipelineNamingIt) {
  try {
    auto p = specula::core::load_pipeline(fs::path(SPECULA_SOURCE_DIR) / "configs/default.yaml",
                                          {{"drafter.options.head", "centroid", "test"},
                                           {"drafter.lm_head", "test-half-head", "test"}});
    specula::core::build_pipeline(p, host());
    FAIL() << "a dense-only head accepted the centroid drafter";
  } catch (const specula::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("section 'drafter'"), std::string::npos) << m;
    EXPECT_NE(m.find("'test-half-head' cannot serve this model's centroid-masked head"), std::string::npos) << m;
    EXPECT_NE(m.find("dense heads only"), std::string::npos) << m;
  }
  try {
    build({{"target.lm_head", "no-such-head", "test"}});
    FAIL() << "an unknown head plugin was accepted";
  } catch (const specula::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("no-such-head"), std::string::npos) << m;
    EXPECT_NE(m.find("lm-head"), std::string::npos) << m;  // the lm_head plugins that were found
  }
  try {
    build({{"target.lm_head", "standard", "test"}});  // a plugin of another kind
    FAIL() << "a sampler plugin was accepted as an LM head";
  } catch (const specula::Error& e) {
    EXPECT_NE(std::string(e.what()).find("lm_head"), std::string::npos) << e.what();
  }
  try {
    build({{"drafter.attention", "test-half-head", "test"}});
    FAIL() << "an LM head plugin was accepted as attention";
  } catch (const specula::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("test-half-head"), std::string::npos) << m;
    EXPECT_NE(m.find("attention"), std::string::npos) << m;
  }
}

// `specula validate` checks the parts a pipeline names, as the pipeline's build would.
TEST(ModelParts, ValidateChecksTheNamedParts) {
  const fs::path dir = fs::path(SPECULA_BINARY_DIR) / "model-parts";
  fs::create_directories(dir);
  auto pipeline = [&](const std::string& head) {
    const fs::path p = dir / (head + ".yaml");
    std::ofstream(p) << "backend: {plugin: cpu}\n"
                     << "target:\n  model: " << (fs::path(SPECULA_SOURCE_DIR) / "models/specula-tiny-kjv-q8_0.gguf").string()
                     << "\n  lm_head: " << head << "\n  attention: attention\n";
    return test::run_command(test::cli() + " validate " + test::quote(p.string()));
  };
  const auto good = pipeline("lm-head");
  EXPECT_EQ(good.status, 0) << good.output;
  EXPECT_NE(good.output.find("ok    target: lm_head plugin 'lm-head'"), std::string::npos) << good.output;
  EXPECT_NE(good.output.find("ok    target: attention plugin 'attention'"), std::string::npos) << good.output;
  const auto bad = pipeline("no-such-head");
  EXPECT_NE(bad.status, 0) << bad.output;
  EXPECT_NE(bad.output.find("FAIL  target: lm_head plugin 'no-such-head': no lm_head plugin named 'no-such-head'"),
            std::string::npos) << bad.output;
}

}  // namespace
