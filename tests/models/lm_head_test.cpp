// The LM head as a plugin kind (specula/lm_head.hpp) on the shipped tiny pair: the pipeline names the
// head of the target and of the drafter (target.lm_head, drafter.lm_head). The standard head named
// explicitly equals the default; a third head (test-half-head: the dense head, halved) replaces the
// target's and the dense drafter's and changes exactly their logits; a head that refuses the drafter's
// centroid weights, or an unknown head plugin, fails the pipeline with a message naming it.
#include <gtest/gtest.h>

#include <filesystem>

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
    p->discover({fs::path(TEST_HEAD_PLUGIN_DIR), fs::path(SPECULA_PLUGIN_DIR)});
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
  std::vector<specula::DraftStep> draft;
};

Outputs run(const specula::core::BuiltPipeline& b) {
  Outputs out;
  auto ctx = b.target->new_context({});
  out.target = ctx->forward(prompt(), 1);
  const int32_t next = static_cast<int32_t>(std::max_element(out.target.begin(), out.target.end()) - out.target.begin());
  specula::DraftRequest request;
  request.last_token = next;
  request.n = 3;
  request.logits = true;
  out.draft = b.drafter->draft(ctx->view(), request);
  return out;
}

TEST(LmHead, TheStandardHeadNamedByThePipelineEqualsTheDefault) {
  const Outputs def = run(build({}));
  const Outputs named = run(build({{"target.lm_head", "lm-head", "test"}, {"drafter.lm_head", "lm-head", "test"}}));
  EXPECT_EQ(named.target, def.target);
  ASSERT_EQ(named.draft.size(), def.draft.size());
  for (size_t k = 0; k < def.draft.size(); ++k) {
    EXPECT_EQ(named.draft[k].token, def.draft[k].token);
    EXPECT_EQ(named.draft[k].logits, def.draft[k].logits);
  }
}

TEST(LmHead, AThirdHeadReplacesTheTargetsAndTheDraftersHead) {
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

TEST(LmHead, AHeadThatRefusesTheWeightsOrAnUnknownHeadFailsThePipelineNamingIt) {
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
}

}  // namespace
