// gemma4-assistant drafter: parity with a float64 numpy reference (tools/gemma4_assistant_reference.py,
// golden/e2b-assistant.json) for the three checkpoint layouts, both heads and both query-position
// conventions; the centroid head against the dense head; lossless greedy speculative decoding with
// the e2b target fixture; bad input.
//
// Fixtures (target e2b F32 GGUF, drafter in every layout) are generated at test time into the build
// dir by tools/gemma4_fixture.py and tools/gemma4_assistant_fixture.py (bit-reproducible, stamped).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <random>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <map>
#include <mutex>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "assistant.hpp"
#include "common/plugins.hpp"
#include "specula/core/generator.hpp"
#include "specula/core/plugin_host.hpp"
#include "specula/error.hpp"
#include "specula/model.hpp"

namespace {

namespace fs = std::filesystem;
namespace ga = specula::gemma4_assistant;
using json = nlohmann::json;

// F32 weights on both sides; the C++ side computes in float32 (K/V from the float32 target, 4 layers,
// a 32-wide head). Measured worst differences are ~1e-5; the bound leaves room for summation order.
constexpr double kLogitTol = 1e-3;

fs::path fixture_dir() {
  static std::once_flag once;
  const fs::path dir = fs::path(SPECULA_FIXTURE_DIR) / "gemma4-assistant-fixtures";
  std::call_once(once, [&] {
    const std::string vocab = std::string(SPECULA_SHARED_DIR) + "/gemma4-vocab/ggml-vocab-gemma-4.gguf";
    for (const std::string& cmd :
         {std::string(SPECULA_PYTHON) + " " + SPECULA_SOURCE_DIR + "/tools/gemma4_fixture.py --variant e2b --formats f32 --out " +
              dir.string() + " --vocab " + vocab,
          std::string(SPECULA_PYTHON) + " " + SPECULA_SOURCE_DIR + "/tools/gemma4_assistant_fixture.py --out " + dir.string() +
              " --vocab " + vocab}) {
      if (std::system(cmd.c_str()) != 0) throw std::runtime_error("fixture generation failed: " + cmd);
    }
  });
  return dir;
}

const json& golden() {
  static const json g = [] {
    std::ifstream in(fs::path(SPECULA_SOURCE_DIR) / "tests/gemma4_assistant/golden/e2b-assistant.json");
    if (!in) throw std::runtime_error("cannot read the golden file");
    return json::parse(in);
  }();
  return g;
}

using specula_test::backend;
using specula_test::host;

// A greedy draft request: n tokens after `last`.
specula::DraftRequest greedy(int32_t last, int n) {
  specula::DraftRequest r;
  r.last_token = last;
  r.n = n;
  return r;
}

// The e2b target; prefill_chunk 4 makes its sliding cache a ring (window - 1 + 4 = 11 slots), so the
// drafter reads keys out of position order.
std::shared_ptr<specula::Model> target() {
  static auto m = [] {
    auto file = host().open_model(fixture_dir() / "model-f32.gguf");
    return host().find_model_loader(*file)->load(file, backend(), json{{"prefill_chunk", 4}});
  }();
  return m;
}

// packed false: on the CPU backend with pack_weights off (MLX weights then keep float activations).
std::shared_ptr<ga::AssistantDrafter> drafter(const std::string& file, const json& options = json::object(),
                                              bool packed = true) {
  static std::map<std::string, std::shared_ptr<ga::AssistantDrafter>> loaded;
  auto& d = loaded[file + options.dump() + (packed ? "" : " unpacked")];
  if (!d)
    d = ga::load_drafter(host().open_model(fixture_dir() / file), packed ? backend() : specula_test::unpacked_backend(),
                         target()->info(), options);
  return d;
}

// A target context after the golden prompt: KV holds positions 0..p-1.
std::unique_ptr<specula::ModelContext> prompted() {
  auto ctx = target()->new_context({64});
  const auto prompt = golden()["prompt"].get<std::vector<int32_t>>();
  const auto logits = ctx->forward(prompt, 1);
  EXPECT_EQ(std::max_element(logits.begin(), logits.end()) - logits.begin(), golden()["x"].get<int64_t>())
      << "the target's greedy token after the prompt differs from the reference's";
  return ctx;
}

struct Err {
  double logit = 0, h = 0;
};

// Compares one run (steps forced to the reference's tokens) with the golden run.
Err compare_run(const std::vector<ga::StepTrace>& got, const json& run, const std::string& what) {
  Err err;
  const auto& steps = run["steps"];
  EXPECT_EQ(got.size(), steps.size()) << what;
  for (size_t k = 0; k < std::min(got.size(), steps.size()); ++k) {
    const ga::StepTrace& st = got[k];
    const json& ref = steps[k];
    std::map<int32_t, float> by_id;
    if (st.ids.empty()) {
      for (const auto& e : ref["top"]) by_id[e[0].get<int32_t>()] = st.logits.at(e[0].get<size_t>());
    } else {
      for (size_t i = 0; i < st.ids.size(); ++i) by_id[st.ids[i]] = st.logits[i];
    }
    for (const auto& e : ref["top"]) {
      const int32_t id = e[0];
      auto it = by_id.find(id);
      if (it == by_id.end()) {
        ADD_FAILURE() << what << " step " << k << ": reference candidate " << id << " is not among the selected ids";
        continue;
      }
      err.logit = std::max(err.logit, std::abs(it->second - e[1].get<double>()));
      EXPECT_NEAR(it->second, e[1].get<double>(), kLogitTol) << what << " step " << k << " token " << id;
    }
    // Each side may be kLogitTol off, so a top-1/top-2 margin above twice that decides the draft.
    if (ref["margin"].get<double>() > 2 * kLogitTol) {
      EXPECT_EQ(st.token, ref["token"].get<int32_t>()) << what << " step " << k;
    }
    const auto& first = ref["h_next"]["first"];
    for (size_t i = 0; i < first.size(); ++i) {
      err.h = std::max(err.h, std::abs(st.h_next[i] - first[i].get<double>()));
      EXPECT_NEAR(st.h_next[i], first[i].get<double>(), kLogitTol) << what << " step " << k << " h_next[" << i << "]";
    }
    double norm = 0;
    for (float v : st.h_next) norm += static_cast<double>(v) * v;
    EXPECT_NEAR(std::sqrt(norm), ref["h_next"]["norm"].get<double>(), kLogitTol * ref["h_next"]["norm"].get<double>())
        << what << " step " << k;
  }
  return err;
}

// The reference's drafts, to feed the C++ steps the same tokens. Empty when every step's margin decides
// its draft anyway: then the drafter's own loop (each step embedding its previous draft) is checked.
std::vector<int32_t> forced_tokens(const json& run) {
  std::vector<int32_t> t;
  bool decided = true;
  for (const auto& s : run["steps"]) {
    t.push_back(s["token"]);
    decided = decided && s["margin"].get<double>() > 2 * kLogitTol;
  }
  return decided ? std::vector<int32_t>{} : t;
}

// ---------------------------------------------------------------------------------- parity
class Parity : public testing::TestWithParam<std::string> {};

TEST_P(Parity, MatchesNumpyReference) {
  const std::string file = GetParam();
  auto ctx = prompted();
  const bool has_centroids = file != "assistant-f32.gguf";  // the upstream converter drops them
  int compared = 0;
  for (const auto& [name, run] : golden()["runs"].items()) {
    const std::string head = run["head"];
    if (head == "centroid" && !has_centroids) continue;
    auto d = drafter(file, {{"head", head}, {"query_position", run["query_position"]}});
    ASSERT_EQ(d->centroid_head(), head == "centroid");
    const int64_t p = ctx->position();
    const auto trace = d->trace(ctx->view(), golden()["x"].get<int32_t>(), 4, forced_tokens(run));
    EXPECT_EQ(ctx->position(), p) << "drafting must not move the target";
    const Err e = compare_run(trace, run, file + " " + name);
    std::printf("[gemma4-assistant] %s %s: max |logit diff| %.2e, max |h_next diff| %.2e\n", file.c_str(),
                name.c_str(), e.logit, e.h);
    ++compared;
  }
  EXPECT_EQ(compared, has_centroids ? 4 : 2);
}

INSTANTIATE_TEST_SUITE_P(Assistant, Parity,
                         testing::Values("assistant-f32.gguf", "assistant-seed-f32.gguf", "assistant-hf"),
                         [](const testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           for (char& c : n)
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           return n;
                         });

TEST(Assistant, AutoHeadFollowsTheFile) {
  EXPECT_FALSE(drafter("assistant-f32.gguf")->centroid_head());      // upstream GGUF: dense only
  EXPECT_TRUE(drafter("assistant-seed-f32.gguf")->centroid_head());  // seed: use_ordered_embeddings
  EXPECT_TRUE(drafter("assistant-hf")->centroid_head());
  EXPECT_EQ(drafter("assistant-seed-f32.gguf")->config().layout, "gguf-seed");
  EXPECT_EQ(drafter("assistant-f32.gguf")->config().backbone, 64);
}

// ---------------------------------------------------------------------------------- centroid head
// `file`'s centroid head against its dense head. For the MLX file the centroid head reorders quantized
// rows (words, scales and biases) while the dense head reads the table as stored; both in float tiles
// (packed, the dense head's MatMul would take 8-bit activations, the centroid head's MatMulId not).
void centroid_head_agrees_with_dense_head(const std::string& file, bool packed = true) {
  auto ctx = prompted();
  auto cen = drafter(file, {{"head", "centroid"}}, packed);
  auto den = drafter(file, {{"head", "dense"}}, packed);
  const int32_t x = golden()["x"];
  // Both heads see the same n at every step when fed the same tokens (the head does not feed back).
  const std::vector<int32_t> forced = {100, 2000, 30000, 200000, 7, 262143, 5384};
  const auto c = cen->trace(ctx->view(), x, 8, forced);
  const auto d = den->trace(ctx->view(), x, 8, forced);
  ASSERT_EQ(c.size(), 8u);
  int inside = 0;
  for (size_t k = 0; k < c.size(); ++k) {
    ASSERT_EQ(c[k].ids.size(), 32u * 128u);
    EXPECT_EQ(std::set<int32_t>(c[k].ids.begin(), c[k].ids.end()).size(), c[k].ids.size()) << "step " << k;
    for (size_t i = 0; i < c[k].h_next.size(); ++i) ASSERT_EQ(c[k].h_next[i], d[k].h_next[i]) << "step " << k;
    for (size_t i = 0; i < c[k].ids.size(); ++i)
      ASSERT_NEAR(c[k].logits[i], d[k].logits[c[k].ids[i]], 1e-4) << "step " << k << " id " << c[k].ids[i];
    const int32_t dense_best = d[k].token;
    EXPECT_EQ(dense_best, std::max_element(d[k].logits.begin(), d[k].logits.end()) - d[k].logits.begin());
    // The centroid draft is the dense head's argmax over the selected ids...
    int32_t restricted = c[k].ids[0];
    for (int32_t id : c[k].ids)
      if (d[k].logits[id] > d[k].logits[restricted]) restricted = id;
    EXPECT_EQ(c[k].token, restricted) << "step " << k;
    // ... and so the dense argmax itself whenever that lies in the selected clusters.
    if (std::find(c[k].ids.begin(), c[k].ids.end(), dense_best) != c[k].ids.end()) {
      EXPECT_EQ(c[k].token, dense_best) << "step " << k;
      ++inside;
    }
    // The full-vocabulary form: filler below every selected logit, same argmax.
    const auto full = ga::scatter_logits(262144, c[k].ids, c[k].logits);
    const float lo = *std::min_element(c[k].logits.begin(), c[k].logits.end());
    std::set<int32_t> sel(c[k].ids.begin(), c[k].ids.end());
    for (int32_t v = 0; v < 262144; v += 997)
      if (!sel.count(v)) {
        ASSERT_LT(full[v], lo) << "filler at " << v;
      }
    EXPECT_EQ(std::max_element(full.begin(), full.end()) - full.begin(), c[k].token);
  }
  std::printf("[gemma4-assistant] %s: dense argmax inside the 32 selected clusters at %d of 8 steps\n",
              file.c_str(), inside);
  // The fixture clusters its embeddings around the centroids (as trained checkpoints do), so the
  // comparison above happened.
  EXPECT_GE(inside, 4);
}

// ---------------------------------------------------------------------------------- draft requests
// DrafterBase keeps the graphs of several contexts (sequences batched together take turns every round)
// and drops the least recently used: drafting over more contexts than it keeps, in turn and twice, gives
// each context the drafts it gets alone.
TEST(Assistant, ContextsTakingTurnsDraftAsEachAlone) {
  auto d = drafter("assistant-seed-f32.gguf", {{"head", "centroid"}});
  const auto prompt = golden()["prompt"].get<std::vector<int32_t>>();
  std::vector<std::unique_ptr<specula::ModelContext>> contexts;
  std::vector<std::vector<int32_t>> alone;
  for (int i = 0; i < 10; ++i) {  // prompts of different lengths: different drafts
    contexts.push_back(target()->new_context({64}));
    contexts.back()->forward(std::span(prompt).first(prompt.size() - static_cast<size_t>(i % 4)), 1);
    std::vector<int32_t> ids;
    for (const auto& st : d->draft(contexts.back()->view(), greedy(prompt[static_cast<size_t>(i)], 3))) ids.push_back(st.token);
    alone.push_back(ids);
  }
  for (int round = 0; round < 2; ++round)
    for (size_t i = 0; i < contexts.size(); ++i) {
      std::vector<int32_t> ids;
      for (const auto& st : d->draft(contexts[i]->view(), greedy(prompt[i], 3))) ids.push_back(st.token);
      EXPECT_EQ(ids, alone[i]) << "context " << i << ", round " << round;
    }
  // A context that is gone does not stay alive in the drafter: once another context is bound, the entries
  // whose tensors only the drafter still holds are dropped.
  const std::weak_ptr<const specula::BackendTensor> gone = contexts.back()->view().last_hidden();  // the latest used
  contexts.erase(contexts.begin() + 1, contexts.end());
  auto fresh = target()->new_context({64});
  fresh->forward(prompt, 1);
  d->draft(fresh->view(), greedy(prompt[0], 3));
  EXPECT_TRUE(gone.expired()) << "the drafter kept a finished context's tensors";
}

// What Drafter::draft returns beyond the greedy ids: each step's logits over the vocabulary (the dense
// head's own, the centroid head's scattered with HF's filler) and, with a pick, the picked token
// embedded next: the same steps trace() computes with that token sequence forced.
TEST(Assistant, DraftRequestReturnsLogitsAndEmbedsThePick) {
  auto ctx = prompted();
  const int32_t x = golden()["x"];
  const std::vector<int32_t> picks = {100, 2000, 30000, 7};
  for (const char* head : {"dense", "centroid"}) {
    SCOPED_TRACE(head);
    auto d = drafter("assistant-seed-f32.gguf", {{"head", head}});
    const auto want = d->trace(ctx->view(), x, 4, picks);
    // Greedy, no logits: the ids only.
    const auto plain = d->draft(ctx->view(), greedy(x, 4));
    ASSERT_EQ(plain.size(), 4u);
    EXPECT_TRUE(plain[0].logits.empty());
    EXPECT_EQ(plain[0].token, want[0].token);
    // Logits asked for, no pick: greedy drafts with their logits; the argmax is the draft.
    specula::DraftRequest r = greedy(x, 4);
    r.logits = true;
    const auto with_logits = d->draft(ctx->view(), r);
    for (size_t k = 0; k < with_logits.size(); ++k) {
      EXPECT_EQ(with_logits[k].token, plain[k].token) << "step " << k;
      ASSERT_EQ(with_logits[k].logits.size(), 262144u);
      EXPECT_EQ(std::max_element(with_logits[k].logits.begin(), with_logits[k].logits.end()) -
                    with_logits[k].logits.begin(), with_logits[k].token) << "step " << k;
    }
    // A pick: step k + 1 embeds the picked token; the logits are trace()'s with the picks forced.
    specula::DraftRequest p = greedy(x, 4);
    int calls = 0;
    p.pick = [&](int step, std::span<const float> logits) {
      EXPECT_EQ(step, calls++);
      EXPECT_EQ(logits.size(), 262144u);
      return picks[static_cast<size_t>(step)];
    };
    const auto picked = d->draft(ctx->view(), p);
    ASSERT_EQ(picked.size(), 4u);
    EXPECT_EQ(calls, 4);
    for (size_t k = 0; k < picked.size(); ++k) {
      EXPECT_EQ(picked[k].token, picks[k]);
      const auto full = want[k].ids.empty() ? want[k].logits : ga::scatter_logits(262144, want[k].ids, want[k].logits);
      ASSERT_EQ(picked[k].logits.size(), full.size());
      for (size_t i = 0; i < full.size(); i += 101) ASSERT_EQ(picked[k].logits[i], full[i]) << "step " << k << " id " << i;
    }
  }
}

TEST(Assistant, CentroidHeadAgreesWithDenseHeadOnTheSameState) { centroid_head_agrees_with_dense_head("assistant-hf"); }

// An MLX 4-bit drafter (embedding, projections and centroids quantized): `head: auto` picks the centroid
// head, which agrees with the dense head over the quantized table.
TEST(Assistant, MlxDrafterUsesTheCentroidHead) {
  EXPECT_EQ(host().open_model(fixture_dir() / "assistant-mlx4")->format(), "mlx");
  EXPECT_TRUE(drafter("assistant-mlx4")->centroid_head());
  centroid_head_agrees_with_dense_head("assistant-mlx4", false);
}

// ---------------------------------------------------------------------------------- lossless
// Wraps a drafter to count its proposals.
class Counting final : public specula::Drafter {
 public:
  explicit Counting(std::shared_ptr<specula::Drafter> d) : d_(std::move(d)) {}
  std::vector<specula::DraftStep> draft(const specula::TargetView& t, const specula::DraftRequest& r) override {
    auto out = d_->draft(t, r);
    EXPECT_EQ(static_cast<int>(out.size()), r.n);
    proposed += static_cast<int64_t>(out.size());
    ++calls;
    sampled = sampled || static_cast<bool>(r.pick);
    return out;
  }
  int64_t proposed = 0, calls = 0;
  bool sampled = false;

 private:
  std::shared_ptr<specula::Drafter> d_;
};

// The assistant's drafts with the first m replaced by the target's known greedy continuation (m cycles
// through 0..n-1), so speculative steps accept partially and the target rolls back into the middle of
// each verify; the assistant still drafts from the rolled-back state every step.
class PartlyRight final : public specula::Drafter {
 public:
  PartlyRight(std::shared_ptr<specula::Drafter> d, std::vector<int32_t> truth, int64_t prompt)
      : d_(std::move(d)), truth_(std::move(truth)), prompt_(prompt) {}
  std::vector<specula::DraftStep> draft(const specula::TargetView& t, const specula::DraftRequest& r) override {
    specula::DraftRequest on_host = r;  // it edits the drafts, so they must come to the host
    on_host.buffers = {};
    auto out = d_->draft(t, on_host);
    const int64_t generated = t.position() - prompt_ + 1;  // the context holds all but `last`
    const int m = static_cast<int>(calls++ % r.n);
    for (int i = 0; i < m && generated + i < static_cast<int64_t>(truth_.size()); ++i) {
      out[i].token = truth_[generated + i];
      ++planted;
    }
    return out;
  }
  int64_t calls = 0, planted = 0;

 private:
  std::shared_ptr<specula::Drafter> d_;
  std::vector<int32_t> truth_;
  int64_t prompt_;
};

TEST(Assistant, GreedySpeculativeDecodingIsLossless) {
  auto sampler = [] { return host().make_sampler("standard", specula::SamplingParams{}); };
  const std::vector<int32_t> prompt = golden()["prompt"].get<std::vector<int32_t>>();
  specula::core::GenerationOptions o;
  o.max_tokens = 16;
  specula::core::Generator plain(target(), sampler());
  const auto want = plain.generate(prompt, o, {}, 64);
  ASSERT_GE(want.tokens.size(), 8u) << "the fixture's greedy continuation is too short to test anything";
  for (const char* head : {"dense", "centroid"}) {
    for (int k = 1; k <= 4; ++k) {
      if (std::string(head) == "centroid" && k != 3) continue;  // the head does not touch the loop: one size
      auto counting = std::make_shared<Counting>(drafter("assistant-seed-f32.gguf", {{"head", head}}));
      specula::core::Generator spec(target(), sampler(), counting);
      o.draft_tokens = k;
      const auto got = spec.generate(prompt, o, {}, 64);
      EXPECT_EQ(got.tokens, want.tokens) << head << " head, draft_tokens " << k;
      EXPECT_EQ(got.stop_reason, want.stop_reason);
      const auto& s = got.stats;
      EXPECT_EQ(s.drafted_tokens, counting->proposed);
      EXPECT_EQ(s.speculative_steps, counting->calls);
      EXPECT_LE(s.accepted_tokens, s.drafted_tokens);
      EXPECT_LE(s.drafted_tokens, s.speculative_steps * k);
      // Every speculative step emits its accepted drafts plus one target token; the first token comes
      // from the prefill, and a step is plain only when one token is left to generate.
      const int64_t emitted = 1 + s.speculative_steps + s.accepted_tokens;
      const int64_t n = static_cast<int64_t>(got.tokens.size()) + (got.stop_reason == specula::core::StopReason::EndToken);
      EXPECT_TRUE(n == emitted || n == emitted + 1) << "tokens " << n << ", steps " << s.speculative_steps
                                                    << ", accepted " << s.accepted_tokens;
      std::printf("[gemma4-assistant] %s head, draft_tokens %d: %lld steps, %lld/%lld drafts accepted (%.0f%%)\n", head,
                  k, static_cast<long long>(s.speculative_steps), static_cast<long long>(s.accepted_tokens),
                  static_cast<long long>(s.drafted_tokens), 100 * s.acceptance_rate());
    }
  }
  // llama.cpp's loop: the plain output too (it may run past max_tokens, never off the greedy path).
  {
    specula::core::GenerationOptions lo = o;
    lo.convention = specula::core::DraftConvention::LlamaCpp;
    lo.max_tokens = 10;  // at most 10 + k + 1 tokens: within the 16 plain ones
    for (int k : {1, 3}) {
      auto partly = std::make_shared<PartlyRight>(drafter("assistant-f32.gguf"), want.tokens,
                                                  static_cast<int64_t>(prompt.size()));
      specula::core::Generator spec(target(), sampler(), partly);
      lo.draft_tokens = k;
      const auto got = spec.generate(prompt, lo, {}, 64);
      ASSERT_LE(got.tokens.size(), want.tokens.size());
      EXPECT_GT(got.tokens.size(), 10u);
      EXPECT_EQ(got.tokens, std::vector<int32_t>(want.tokens.begin(), want.tokens.begin() + got.tokens.size()))
          << "llamacpp convention, draft_tokens " << k;
      if (k > 1) {
        EXPECT_GT(got.stats.accepted_tokens, 0) << "draft_tokens " << k;  // planted drafts
      }
    }
  }
  // Partial acceptance: still the plain output, and at least every planted draft accepted.
  for (int k : {2, 4}) {
    auto partly = std::make_shared<PartlyRight>(drafter("assistant-seed-f32.gguf"), want.tokens,
                                                static_cast<int64_t>(prompt.size()));
    specula::core::Generator spec(target(), sampler(), partly);
    o.draft_tokens = k;
    const auto got = spec.generate(prompt, o, {}, 64);
    EXPECT_EQ(got.tokens, want.tokens) << "partly right drafts, draft_tokens " << k;
    EXPECT_GT(partly->planted, 0);
    EXPECT_GE(got.stats.accepted_tokens, partly->planted) << "draft_tokens " << k;
    EXPECT_LT(got.stats.accepted_tokens, got.stats.drafted_tokens) << "draft_tokens " << k;
  }
}

// ---------------------------------------------------------------------------------- bad input
class Patched : public specula::ModelFile {
 public:
  explicit Patched(std::shared_ptr<const specula::ModelFile> base)
      : base_(std::move(base)), md_(base_->metadata()), tensors_(base_->tensors()) {}
  std::string format() const override { return base_->format(); }
  fs::path path() const override { return base_->path(); }
  const json& metadata() const override { return md_; }
  const std::vector<specula::TensorInfo>& tensors() const override { return tensors_; }
  const specula::TensorInfo* find(const std::string& name) const override {
    for (const auto& t : tensors_)
      if (t.name == name) return &t;
    return nullptr;
  }
  void drop(const std::string& name) {
    std::erase_if(tensors_, [&](const specula::TensorInfo& t) { return t.name == name; });
  }
  specula::TensorInfo& tensor(const std::string& name) {
    for (auto& t : tensors_)
      if (t.name == name) return t;
    throw std::runtime_error("no tensor " + name);
  }
  json& md() { return md_; }
  std::vector<std::byte> storage;

 private:
  std::shared_ptr<const specula::ModelFile> base_;
  json md_;
  std::vector<specula::TensorInfo> tensors_;
};

std::shared_ptr<Patched> patched(const std::string& file) {
  return std::make_shared<Patched>(host().open_model(fixture_dir() / file));
}

std::string load_error(const std::shared_ptr<const specula::ModelFile>& f, const specula::ModelInfo& info,
                       const json& options = json::object()) {
  try {
    host().make_drafter_loader("gemma4-assistant")->load(f, backend(), info, options);
  } catch (const specula::Error& e) {
    return e.what();
  }
  return "";
}

// Sampled drafting with the real drafter: at temperature > 0 the engine asks for the drafts' logits and
// picks from the drafter's own distribution; both heads run, accept and reject, and stay reproducible.
TEST(Assistant, SampledDraftingRunsWithBothHeads) {
  specula::SamplingParams sp;
  sp.temperature = 1.0f;
  sp.top_k = 40;
  sp.seed = 11;
  const std::vector<int32_t> prompt = golden()["prompt"].get<std::vector<int32_t>>();
  for (const char* head : {"dense", "centroid"}) {
    auto counting = std::make_shared<Counting>(drafter("assistant-seed-f32.gguf", {{"head", head}}));
    specula::core::GenerationOptions o;
    o.max_tokens = 8;
    o.draft_tokens = 3;
    std::vector<int32_t> first;
    for (int run = 0; run < (std::string(head) == "dense" ? 2 : 1); ++run) {
      specula::core::Generator spec(target(), host().make_sampler("standard", sp), counting);
      const auto got = spec.generate(prompt, o, {}, 64);
      EXPECT_EQ(got.tokens.size(), 8u) << head;
      EXPECT_GT(got.stats.speculative_steps, 0) << head;
      EXPECT_TRUE(counting->sampled) << head << ": the drafts were not sampled through DraftRequest::pick";
      if (run == 0) first = got.tokens;
      else EXPECT_EQ(got.tokens, first) << head << ": a seed repeats the run";
    }
  }
}

// ollama's names for the centroid head (masked_embd_centroids.weight, masked_embd_ordering as I32) with
// the upstream projection names and no assistant.* keys: the same numbers as the seed file.
TEST(Assistant, OllamaLayoutMatchesTheReference) {
  auto f = patched("assistant-seed-f32.gguf");
  f->tensor("assist_pre_proj.weight").name = "nextn.pre_projection.weight";
  f->tensor("assist_post_proj.weight").name = "nextn.post_projection.weight";
  f->tensor("assist_embed_centroids.weight").name = "masked_embd_centroids.weight";
  auto& ord = f->tensor("assist_token_ordering.weight");
  std::vector<int32_t> ids(262144);
  for (size_t i = 0; i < ids.size(); ++i) {
    float v;
    std::memcpy(&v, ord.data.data() + 4 * i, 4);
    ids[i] = static_cast<int32_t>(v);
  }
  f->storage.resize(ids.size() * 4);
  std::memcpy(f->storage.data(), ids.data(), f->storage.size());
  ord.name = "masked_embd_ordering";
  ord.type = specula::DType::I32;
  ord.data = f->storage;
  for (const char* k : {"backbone_hidden_size", "assistant.num_centroids", "assistant.centroid_intermediate_top_k",
                        "assistant.use_ordered_embeddings"})
    f->md().erase(std::string("gemma4-assistant.") + k);
  f->md()["gemma4-assistant.embedding_length_out"] = 64;
  auto d = ga::load_drafter(f, backend(), target()->info(), json::object());
  EXPECT_EQ(d->config().layout, "gguf-ollama");
  ASSERT_TRUE(d->centroid_head());
  auto ctx = prompted();
  const json& run = golden()["runs"]["centroid_p"];
  const Err e = compare_run(d->trace(ctx->view(), golden()["x"].get<int32_t>(), 4, forced_tokens(run)), run, "ollama");
  std::printf("[gemma4-assistant] ollama layout centroid_p: max |logit diff| %.2e\n", e.logit);
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST(AssistantBadInput, WrongBackboneSize) {
  specula::ModelInfo info = target()->info();
  info.hidden_size = 48;
  const std::string e = load_error(host().open_model(fixture_dir() / "assistant-f32.gguf"), info);
  EXPECT_HAS(e, "assistant-f32.gguf");
  EXPECT_HAS(e, "backbone hidden size is 64");
  EXPECT_HAS(e, "hidden size 48");
}

// Hostile or damaged hyper-parameters are refused where they are read, naming the key and the range.
TEST(AssistantBadInput, HyperParametersOutsideSaneBoundsAreNamed) {
  auto f = patched("assistant-f32.gguf");
  f->md()["gemma4-assistant.block_count"] = int64_t{1} << 50;
  EXPECT_HAS(load_error(f, target()->info()),
             "metadata key 'gemma4-assistant.block_count' is 1125899906842624, outside [1, 1024]");
  f = patched("assistant-f32.gguf");
  f->md()["gemma4-assistant.attention.key_length_swa"] = 100000;
  EXPECT_HAS(load_error(f, target()->info()),
             "metadata key 'gemma4-assistant.attention.key_length_swa' is 100000, outside [1, 16384]");
  auto h = patched("assistant-hf");
  h->md()["config"]["text_config"]["num_attention_heads"] = 5000;
  EXPECT_HAS(load_error(h, target()->info()), "config.json: text_config.num_attention_heads is 5000, outside [1, 1024]");
}

// RoPE is read by the gemma4 plugin's reader (plugins/gemma4/rope.cpp); its messages name the keys under
// text_config, where a drafter's config.json nests them.
TEST(AssistantBadInput, RopeParametersAreNamedUnderTextConfig) {
  auto h = patched("assistant-hf");
  h->md()["config"]["text_config"]["rope_parameters"] = {{"sliding_attention", {{"rope_type", "default"}}}};
  EXPECT_HAS(load_error(h, target()->info()), "config.json: text_config.rope_parameters.full_attention is missing");
  h = patched("assistant-hf");
  h->md()["config"]["text_config"]["rope_parameters"] = {
      {"sliding_attention", {{"rope_type", "default"}, {"factor", 0}}},
      {"full_attention", {{"rope_type", "proportional"}, {"partial_rotary_factor", 0.25}}}};
  EXPECT_HAS(load_error(h, target()->info()),
             "config.json: text_config.rope_parameters.sliding_attention has partial_rotary_factor 1 and factor 0");
  h = patched("assistant-hf");
  h->md()["config"]["text_config"]["rope_parameters"] = {
      {"sliding_attention", {{"rope_type", "default"}}},
      {"full_attention", {{"rope_type", "yarn"}, {"partial_rotary_factor", 0.25}}}};
  EXPECT_HAS(load_error(h, target()->info()),
             "config.json: text_config.rope_parameters.full_attention has rope_type 'yarn' with partial_rotary_factor "
             "0.25; only 'default' (full rotation) and 'proportional' are supported");
}

TEST(AssistantBadInput, MissingTensor) {
  auto f = patched("assistant-f32.gguf");
  f->drop("blk.2.attn_q.weight");
  const std::string e = load_error(f, target()->info());
  EXPECT_HAS(e, "assistant-f32.gguf");
  EXPECT_HAS(e, "'blk.2.attn_q.weight' is missing");
  EXPECT_HAS(e, "[64, 32]");
  auto h = patched("assistant-hf");
  h->drop("post_projection.weight");
  EXPECT_HAS(load_error(h, target()->info()), "'post_projection.weight' is missing");
}

TEST(AssistantBadInput, MisshapedTensor) {
  auto f = patched("assistant-hf");
  f->tensor("pre_projection.weight").shape = {128, 32};  // transposed
  const std::string e = load_error(f, target()->info());
  EXPECT_HAS(e, "assistant-hf");
  EXPECT_HAS(e, "'pre_projection.weight' has shape [128, 32]");
  EXPECT_HAS(e, "[32, 128]");
}

TEST(AssistantBadInput, OrderingNotAPermutation) {
  auto f = patched("assistant-seed-f32.gguf");
  auto& t = f->tensor("assist_token_ordering.weight");
  f->storage.assign(t.data.begin(), t.data.end());
  float first;
  std::memcpy(&first, f->storage.data(), 4);
  std::memcpy(f->storage.data() + 4 * 5, &first, 4);  // entry 5 repeats entry 0
  t.data = f->storage;
  std::string e = load_error(f, target()->info());
  EXPECT_HAS(e, "'assist_token_ordering.weight' is not a permutation");
  EXPECT_HAS(e, fmt::format("id {} appears twice", static_cast<int>(first)));
  const float big = 262144.0f;
  std::memcpy(f->storage.data() + 4 * 5, &big, 4);
  e = load_error(f, target()->info());
  EXPECT_HAS(e, "entry 5 is 262144");
  // A dense head never reads the ordering.
  EXPECT_EQ(load_error(f, target()->info(), {{"head", "dense"}}), "");
}

TEST(AssistantBadInput, OptionsAndHeads) {
  EXPECT_HAS(load_error(host().open_model(fixture_dir() / "assistant-f32.gguf"), target()->info(), {{"head", "centroid"}}),
             "no centroid tensors");
  EXPECT_THROW(host().make_drafter_loader("gemma4-assistant", {{"draft_temperature", 1}}), specula::Error);
  EXPECT_THROW(host().make_drafter_loader("gemma4-assistant", {{"query_position", "p+1"}}), specula::Error);
  auto f = patched("assistant-f32.gguf");
  f->md().erase("gemma4-assistant.embedding_length_out");
  EXPECT_HAS(load_error(f, target()->info()), "embedding_length_out");
}

// A target view that hides or swaps the caches a drafter reads.
class Broken final : public specula::TargetView {
 public:
  Broken(const specula::TargetView& real, std::string mode) : real_(real), mode_(std::move(mode)) {}
  specula::KvView kv(const std::string& type) const override {
    if (type == "sliding" && mode_ == "no-sliding") specula::fail("gemma4: the model has no sliding attention layer");
    if (type == "sliding" && mode_ == "swap") return real_.kv("full");
    return real_.kv(type);
  }
  specula::BackendTensorPtr last_hidden() const override { return real_.last_hidden(); }
  int64_t position() const override { return real_.position(); }
  specula::TokenEmbedding token_embedding() const override { return real_.token_embedding(); }

 private:
  const specula::TargetView& real_;
  std::string mode_;
};

TEST(AssistantBadInput, TargetWithoutSlidingLayerOrOtherHeadDims) {
  auto ctx = prompted();
  auto d = drafter("assistant-f32.gguf");
  try {
    d->draft(Broken(ctx->view(), "no-sliding"), greedy(5, 2));
    ADD_FAILURE() << "a target without a sliding cache must be refused";
  } catch (const specula::Error& e) {
    EXPECT_HAS(std::string(e.what()), "no sliding-attention KV cache");
  }
  try {
    d->draft(Broken(ctx->view(), "swap"), greedy(5, 2));
    ADD_FAILURE() << "a sliding cache with the full layers' head dim must be refused";
  } catch (const specula::Error& e) {
    const std::string m = e.what();
    EXPECT_HAS(m, "layer 0 (sliding) has query head dim 32");
    EXPECT_HAS(m, "'gemma4.cache.2.k' is [64, 1, 64]");
  }
  EXPECT_EQ(d->draft(ctx->view(), greedy(5, 2)).size(), 2u);  // the real view still works afterwards
}

// ---------------------------------------------------------------------------------- real shapes
// Not run by default (writes a 158 MB checkpoint): the real E2B drafter shapes (hidden 256, backbone
// 1536, head dims 256/512, 2048 centroids) over a synthetic 1024-token target cache, timing a draft.
// Run with --gtest_also_run_disabled_tests --gtest_filter='*RealShapes*'.
class SyntheticTarget final : public specula::TargetView {
 public:
  explicit SyntheticTarget(int64_t p) : p_(p) {
    auto& be = *backend();
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    auto fill = [&](const specula::BackendTensorPtr& t) {
      int64_t n = 1;
      for (int64_t d : t->shape()) n *= d;
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = nd(rng);
      be.write(*t, std::as_bytes(std::span(x)));
    };
    std::vector<int32_t> pos(static_cast<size_t>(p));
    for (int64_t i = 0; i < p; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    for (auto [type, D] : {std::pair{"sliding", 256}, std::pair{"full", 512}}) {
      specula::KvView kv;
      kv.k = be.allocate(std::string(type) + ".k", specula::DType::F32, {p, 1, D});
      kv.v = be.allocate(std::string(type) + ".v", specula::DType::F32, {p, 1, D});
      kv.positions = be.allocate(std::string(type) + ".pos", specula::DType::I32, {p});
      fill(kv.k);
      fill(kv.v);
      be.write(*kv.positions, std::as_bytes(std::span(pos)));
      kv_[type] = kv;
    }
    hidden_ = be.allocate("hidden", specula::DType::F32, {1536});
    fill(hidden_);
    table_ = be.allocate("embd", specula::DType::BF16, {262144, 1536});  // zeros: only its shape matters here
  }
  specula::KvView kv(const std::string& t) const override { return kv_.at(t); }
  specula::BackendTensorPtr last_hidden() const override { return hidden_; }
  int64_t position() const override { return p_; }
  specula::TokenEmbedding token_embedding() const override { return {table_, 39.25f}; }

 private:
  int64_t p_;
  std::map<std::string, specula::KvView> kv_;
  specula::BackendTensorPtr hidden_, table_;
};

TEST(Assistant, DISABLED_RealShapesDraftTime) {
  const fs::path dir = fs::path(SPECULA_FIXTURE_DIR) / "gemma4-assistant-fixtures" / "real";
  const std::string cmd = std::string(SPECULA_PYTHON) + " " + SPECULA_SOURCE_DIR +
                          "/tools/gemma4_assistant_fixture.py --real --formats hf --out " + dir.string() + " --vocab " +
                          SPECULA_SHARED_DIR + "/gemma4-vocab/ggml-vocab-gemma-4.gguf";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  specula::ModelInfo info;
  info.hidden_size = 1536;
  info.vocab_size = 262144;
  SyntheticTarget t(1024);
  for (const char* head : {"centroid", "dense"}) {
    auto d = ga::load_drafter(host().open_model(dir / "assistant-hf"), backend(), info, {{"head", head}});
    d->draft(t, greedy(818, 4));  // builds the graphs, decodes the weights once
    const auto t0 = std::chrono::steady_clock::now();
    const int rounds = 5;
    for (int i = 0; i < rounds; ++i) ASSERT_EQ(d->draft(t, greedy(818, 4)).size(), 4u);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::printf("[gemma4-assistant] real E2B drafter shapes, %s head, 1024 target positions: %.2f ms per draft step\n",
                head, ms / (rounds * 4));
  }
}

// ---------------------------------------------------------------------------------- specula bench
std::string run_cli(const std::string& args, int* status, bool with_stderr = true) {
  const std::string cmd = std::string(SPECULA_CLI) + " " + args + (with_stderr ? " 2>&1" : "");
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed: " + cmd);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  *status = pclose(pipe);
  return out;
}

TEST(BenchCli, MeasuresPlainAndSpeculativeDecodingOnTheFixtures) {
  const std::string common = "bench -q --plugin-path " + std::string(SPECULA_PLUGIN_DIR) + " --model " +
                             (fixture_dir() / "model-f32.gguf").string() + " --threads 1 ";
  int status = 0;
  const std::string out = run_cli(common + "--drafter " + (fixture_dir() / "assistant-f32.gguf").string() +
                                      " --draft-tokens 2 -p 12 -n 6 -r 2 --json", &status);
  ASSERT_EQ(status, 0) << out;
  const json j = json::parse(out);
  EXPECT_EQ(j["prompt_tokens"], 12);
  EXPECT_EQ(j["gen_tokens"], 6);
  EXPECT_EQ(j["threads"], 1);
  for (const char* key : {"pp_tokens_per_second", "tg_tokens_per_second", "peak_rss_mib", "load_seconds"})
    EXPECT_GT(j[key].get<double>(), 0.0) << key;
  EXPECT_LE(j["pp_min"].get<double>(), j["pp_tokens_per_second"].get<double>());
  EXPECT_GE(j["tg_max"].get<double>(), j["tg_tokens_per_second"].get<double>());
  const json& spec = j["speculative"];
  ASSERT_TRUE(spec.is_object()) << out;
  EXPECT_EQ(spec["draft_tokens"], 2);
  EXPECT_GT(spec["tokens_per_second"].get<double>(), 0.0);
  EXPECT_GE(spec["acceptance_rate"].get<double>(), 0.0);
  EXPECT_LE(spec["acceptance_rate"].get<double>(), 1.0);
  // Every speculative step makes at least one token and at most draft + 1.
  EXPECT_GE(spec["tokens_per_step"].get<double>(), 1.0);
  EXPECT_LE(spec["tokens_per_step"].get<double>(), 3.0);
  EXPECT_DOUBLE_EQ(spec["mean_accepted_length"].get<double>(), spec["tokens_per_step"].get<double>() - 1.0);
  EXPECT_EQ(spec["accepted_by_position"].size(), 2u);
  // The MTP cost model: K = 1..8, a round costs its verification plus its draft, in decode steps; the
  // break-even acceptance is a rate or null (never pays).
  const json& costs = j["verify_costs"];
  ASSERT_TRUE(costs.is_array()) << out;
  ASSERT_EQ(costs.size(), 8u);
  for (size_t k = 0; k < costs.size(); ++k) {
    const json& c = costs[k];
    EXPECT_EQ(c["draft_tokens"], static_cast<int>(k) + 1);
    EXPECT_GT(c["verify_ms"].get<double>(), 0.0);
    EXPECT_GT(c["draft_ms"].get<double>(), 0.0);
    EXPECT_GT(c["round_steps"].get<double>(), c["verify_steps"].get<double>());
    if (!c["break_even_acceptance"].is_null()) {
      EXPECT_GE(c["break_even_acceptance"].get<double>(), 0.0);
      EXPECT_LE(c["break_even_acceptance"].get<double>(), 1.0);
    }
  }

  // A run that cannot fit the model's context is refused up front, naming the numbers.
  const std::string big = run_cli(common + "-p 250 -n 100", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(big.find("--prompt-tokens 250 + --gen-tokens 100 exceed the model's context of 256 tokens"),
            std::string::npos) << big;
  const std::string zero = run_cli(common + "-r 0", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(zero.find("must be at least 1"), std::string::npos) << zero;
  // --context-length lifts the limit only as far as the model allows, and says which limit it was.
  const std::string asked = run_cli(common + "--context-length 64 -p 60 -n 8", &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(asked.find("exceed the --context-length context of 64 tokens"), std::string::npos) << asked;
}

// --acceptance-profile: the replay's figures in --json (every draft accepted at 1,1: as many tokens per round as
// the profile gives for the lengths run), "replay" on every line of the text, and what it does not combine with.
TEST(BenchCli, AcceptanceReplayReportsItsRoundsAndSaysReplayOnEveryLine) {
  const std::string common = "bench -q --plugin-path " + std::string(SPECULA_PLUGIN_DIR) + " --model " +
                             (fixture_dir() / "model-f32.gguf").string() + " --threads 1 -p 12 ";
  const std::string with_drafter = common + "--drafter " + (fixture_dir() / "assistant-f32.gguf").string() + " ";
  int status = 0;
  const std::string out = run_cli(with_drafter + "--draft-max 2 --acceptance-profile 1,1 -n 24 -r 2 --json", &status);
  ASSERT_EQ(status, 0) << out;
  const json j = json::parse(out);
  EXPECT_EQ(j["replay_profile"], json::parse("[1.0, 1.0]"));
  EXPECT_EQ(j["replay_accepted_fraction_by_position"], json::parse("[1.0, 1.0]"));
  EXPECT_DOUBLE_EQ(j["speculative"]["acceptance_rate"].get<double>(), 1.0);
  EXPECT_GT(j["replay_tokens_per_round"].get<double>(), 2.0);
  EXPECT_LE(j["replay_tokens_per_round"].get<double>(), 3.0);
  EXPECT_NEAR(j["replay_tokens_per_round"].get<double>(), j["replay_expected_tokens_per_round"].get<double>(), 1e-9);
  EXPECT_GT(j["replay_mean_draft_tokens"].get<double>(), 1.0);
  EXPECT_LE(j["replay_mean_draft_tokens"].get<double>(), 2.0);
  EXPECT_GT(j["replay_plain_tokens_per_second"].get<double>(), 0.0);
  EXPECT_NEAR(j["replay_speedup"].get<double>(),
              j["speculative"]["tokens_per_second"].get<double>() / j["replay_plain_tokens_per_second"].get<double>(), 1e-9);

  const std::string text = run_cli(with_drafter + "--draft-max auto --acceptance-profile 0 -n 16 -r 1", &status);
  ASSERT_EQ(status, 0) << text;
  std::istringstream lines(text);
  int n = 0;
  for (std::string line; std::getline(lines, line); ++n) EXPECT_EQ(line.rfind("replay ", 0), 0u) << line;
  EXPECT_GE(n, 14) << text;
  EXPECT_NE(text.find("draft auto (mean "), std::string::npos) << text;
  EXPECT_NE(text.find(", profile 0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("rounds   1.00 tokens (the profile gives 1.00)"), std::string::npos) << text;

  const std::pair<std::string, const char*> refused[] = {
      {with_drafter + "--acceptance-profile 0.5,0.7 -n 4", "entry 2 (0.7) is above entry 1 (0.5)"},
      {with_drafter + "--acceptance-profile 0.5 --no-drafter -n 4", "it does not combine with --no-drafter"},
      {with_drafter + "--acceptance-profile 0.5 --sequences 2 -n 4", "it does not combine with --sequences"},
      {common + "--acceptance-profile 0.5 -n 4", "the pipeline has no drafter (give --drafter)"},
  };
  for (const auto& [args, want] : refused) {
    const std::string err = run_cli(args, &status);
    EXPECT_NE(status, 0) << args;
    EXPECT_NE(err.find(want), std::string::npos) << err;
  }
}

// --profile: the CPU backend's tables for decode (1 row) and the prompt (12 rows), per op, weight, layer.
// (A table per graph kind: rows and node count, "profile: graphs of 503 nodes with 1 activation row".)
TEST(BenchCli, ProfileNamesOpsWeightsAndLayers) {
  int status = 0;
  const std::string out = run_cli("bench -q --plugin-path " + std::string(SPECULA_PLUGIN_DIR) + " --model " +
                                      (fixture_dir() / "model-f32.gguf").string() +
                                      " --threads 1 -p 12 -n 3 -r 1 --no-drafter --profile", &status);
  ASSERT_EQ(status, 0) << out;
  for (const char* want : {" nodes with 1 activation row (", " nodes with 12 activation rows (",
                           "\n  MatMul ", "\n  Attention ", "\n  blk.*.ffn_up.weight ", "\n  token_embd.weight ",
                           "\n  layer 0 ", "\n  outside layers "})
    EXPECT_NE(out.find(want), std::string::npos) << "missing '" << want << "' in:\n" << out;
}

}  // namespace

// ------------------------------------------------------------------- specula validate against run
// Every pipeline `run` refuses on the fixtures, `validate` refuses with the same message, before any
// weight is loaded (the message is what build_pipeline says after "section '...': ").
TEST(ValidateCli, RefusesWhatRunRefusesWithTheSameMessage) {
  const fs::path dir = fs::path(SPECULA_BINARY_DIR) / "test-tmp" / "validate-parity";
  fs::remove_all(dir);
  fs::create_directories(dir);
  // Drafters for another target: the backbone width, the KV head dims of each attention type.
  auto drafter_with = [&](const std::string& name, const std::function<void(json&)>& edit) {
    const fs::path d = dir / name;
    fs::create_directories(d);
    fs::copy_file(fixture_dir() / "assistant-hf/model.safetensors", d / "model.safetensors");
    std::ifstream in(fixture_dir() / "assistant-hf/config.json");
    json c = json::parse(in);
    edit(c);
    std::ofstream(d / "config.json") << c.dump(2);
    return d.string();
  };
  const std::string wide = drafter_with("wide", [](json& c) { c["backbone_hidden_size"] = 96; });
  const std::string sliding = drafter_with("sliding", [](json& c) { c["text_config"]["head_dim"] = 48; });
  const std::string full = drafter_with("full", [](json& c) { c["text_config"]["global_head_dim"] = 48; });
  auto pipeline = [&](const std::string& name, const std::string& backend, const std::string& target_options) {
    const fs::path p = dir / (name + ".yaml");
    std::ofstream(p) << "backend: {plugin: " << backend << "}\ntarget:\n  model: " << (fixture_dir() / "model-f32.gguf").string()
                     << "\n  options: " << target_options << "\n";
    return p.string();
  };
  struct Case {
    std::string pipeline, flags, expected;
  };
  std::vector<Case> cases = {
      {pipeline("q4", "cpu", "{kv_cache_type: Q4}"), "",
       "q4.yaml:4:13: option 'kv_cache_type' of model plugin 'gemma4' must be one of F32, F16, BF16, got \"Q4\""},
      {pipeline("typo", "cpu", "{prefil_chunk: 4}"), "",
       "typo.yaml:4:13: unknown option 'prefil_chunk' of model plugin 'gemma4'; did you mean 'prefill_chunk'? (valid "
       "options: prefill_chunk, kv_cache_type, embedding_scale)"},
      {pipeline("ok", "cpu", "{}"), " --ctx-size 100000", "context length 100000 exceeds the model's 256 tokens"},
      {pipeline("ok", "cpu", "{}"), " --drafter " + wide,
       "wide: the drafter's backbone hidden size is 96 but the target (gemma4) has hidden size 64; this drafter belongs "
       "to another target"},
      {pipeline("ok", "cpu", "{}"), " --drafter " + sliding,
       "sliding: drafter layer 0 has head dim 48 but the target's sliding attention KV cache has head dim 32"},
      {pipeline("ok", "cpu", "{}"), " --drafter " + full,
       "full: drafter layer 3 has head dim 48 but the target's full attention KV cache has head dim 64"},
      {pipeline("ok", "cpu", "{}"), " --drafter " + (fixture_dir() / "assistant-f32.gguf").string() + " --draft-max 65",
       "command line (--draft-max): key 'drafter.draft_tokens' must be between 1 and 64, got 65"},
  };
  if (host().find("vulkan")) {  // refused by the host before a Vulkan device is looked for
    cases.push_back({pipeline("vk", "vulkan, options: {bogus_opt: 1}", "{}"), "",
                     "unknown option 'bogus_opt' of backend plugin 'vulkan' (valid options: device, max_binding_bytes, subgroups, cooperative_matrix, profile)"});
  }
  for (const auto& c : cases) {
    int status = 0;
    const std::string common = " --plugin-path " + std::string(SPECULA_PLUGIN_DIR) + " " + c.pipeline + c.flags;
    const std::string run = run_cli("run" + common + " --tokens 2 -n 1 -q", &status);
    EXPECT_NE(status, 0) << run;
    std::string message = run.substr(run.find("error: ") + 7);
    message = message.substr(0, message.find('\n'));
    if (size_t s = message.find(": section '"); s != std::string::npos) message = message.substr(message.find("': ", s) + 3);
    EXPECT_NE(message.find(c.expected), std::string::npos) << message;
    const std::string validate = run_cli("validate" + common, &status);
    EXPECT_NE(status, 0) << validate;
    EXPECT_NE(validate.find("FAIL  "), std::string::npos) << validate;
    EXPECT_NE(validate.find(message), std::string::npos) << "run: " << message << "\nvalidate: " << validate;
  }
}

// docs/pipeline-yaml.md documents every option of every plugin that declares a schema.
TEST(ValidateCli, PipelineDocsListEveryDeclaredOption) {
  std::ifstream in(fs::path(SPECULA_SOURCE_DIR) / "docs/pipeline-yaml.md");
  std::stringstream text;
  text << in.rdbuf();
  const std::string docs = text.str();
  int schemas = 0;
  for (const auto& p : host().plugins()) {
    for (const auto& kind : p.kinds) {
      if (kind == "format") continue;
      const specula::OptionSchema* schema = host().option_schema(p.name, kind);
      if (!schema) continue;
      ++schemas;
      EXPECT_NE(docs.find("#### " + kind + " plugin `" + p.name + "`"), std::string::npos) << p.name << " (" << kind << ")";
      for (const auto& o : *schema) {
        const std::string row = "| `" + o.name + "` | " + specula::describe_option_type(o) + " |";
        EXPECT_NE(docs.find(row), std::string::npos) << p.name << ": " << row;
      }
    }
  }
  EXPECT_GE(schemas, 3);  // gemma4, gemma4-assistant, standard (and vulkan when built)
}

// The KV cache dtype is checked against the backend from metadata alone (ModelLoader::check).
TEST(ValidateCli, KvCacheTypeIsCheckedAgainstTheBackend) {
  class NoBf16 final : public specula::ComputeBackend {
   public:
    std::string name() const override { return "nobf16"; }
    specula::DeviceInfo device() const override { return {"none", 0, true}; }
    specula::Support supports(specula::Op, specula::DType type) const override {
      if (type == specula::DType::BF16) return specula::Support::no("no BF16 caches here");
      return specula::Support::yes();
    }
    specula::BackendTensorPtr load_weight(const specula::TensorInfo&) override { throw std::runtime_error("loaded a weight"); }
    specula::BackendTensorPtr allocate(const std::string&, specula::DType, const specula::Shape&) override {
      throw std::runtime_error("allocated");
    }
    std::unique_ptr<specula::CompiledGraph> compile(const specula::Graph&) override { throw std::runtime_error("compiled"); }
    void read(const specula::BackendTensor&, std::span<std::byte>) override {}
    void write(specula::BackendTensor&, std::span<const std::byte>) override {}
  };
  const NoBf16 backend;
  auto file = host().open_model(fixture_dir() / "model-f32.gguf");
  auto loader = host().make_model_loader("gemma4");
  const specula::ModelInfo info = loader->check(*file, backend, {{"kv_cache_type", "F16"}});  // nothing loaded
  EXPECT_EQ(info.hidden_size, 64);
  EXPECT_EQ(info.context_length, 256);
  EXPECT_EQ(info.vocab_size, 262144);
  try {
    loader->check(*file, backend, {{"kv_cache_type", "BF16"}});
    FAIL();
  } catch (const specula::Error& e) {
    EXPECT_STREQ(e.what(), "gemma4: option kv_cache_type = 'BF16': backend 'nobf16' cannot run WriteRows on BF16: no BF16 caches here");
  }
}

// draft_tokens: auto (here through --draft-max auto): bench reports the lengths the engine chose, within
// drafter.draft_max, and the acceptance by draft position; every step is counted once.
TEST(BenchCli, AdaptiveDraftLengthReportsTheLengthsItChose) {
  int status = 0;
  const std::string out = run_cli("bench -q --plugin-path " + std::string(SPECULA_PLUGIN_DIR) + " --model " +
                                      (fixture_dir() / "model-f32.gguf").string() + " --drafter " +
                                      (fixture_dir() / "assistant-f32.gguf").string() +
                                      " --draft-max auto --threads 1 -p 12 -n 24 -r 1 --json",
                                  &status);
  ASSERT_EQ(status, 0) << out;
  const json spec = json::parse(out)["speculative"];
  ASSERT_TRUE(spec.is_object()) << out;
  EXPECT_EQ(spec["draft_tokens"], "auto");
  const auto lengths = spec["steps_by_draft_length"].get<std::vector<int64_t>>();
  ASSERT_FALSE(lengths.empty());
  EXPECT_LE(lengths.size(), 9u) << "never beyond the default draft_max of 8";
  int64_t steps = 0, drafted = 0;
  for (size_t k = 1; k < lengths.size(); ++k) steps += lengths[k], drafted += static_cast<int64_t>(k) * lengths[k];
  ASSERT_GT(steps, 0);
  EXPECT_NEAR(spec["mean_draft_length"].get<double>(), double(drafted) / steps, 1e-9);
  const auto by_pos = spec["drafted_by_position"].get<std::vector<int64_t>>();
  ASSERT_FALSE(by_pos.empty());
  EXPECT_EQ(by_pos[0], steps) << "every speculative step drafts a first token";

  const std::string bad = run_cli("bench -q --plugin-path " + std::string(SPECULA_PLUGIN_DIR) + " --model " +
                                      (fixture_dir() / "model-f32.gguf").string() + " --drafter " +
                                      (fixture_dir() / "assistant-f32.gguf").string() + " --draft-max sometimes -n 2",
                                  &status);
  EXPECT_NE(status, 0);
  EXPECT_NE(bad.find("key 'drafter.draft_tokens' must be an integer or auto, got 'sometimes'"), std::string::npos) << bad;
}

// ------------------------------------------------------------------ llama.cpp draft-mtp goldens
// `specula run --trace-json` in the llamacpp convention against traces llama.cpp itself wrote
// (tools/llama-mtp-trace: its draft-mtp implementation and speculative-simple's loop, greedy), K = 1..4:
// the e2b F32 fixture pair (21-token prompt, longer than the sliding window) and the shipped tiny Q8_0
// pair (real acceptance; llama.cpp ran its assistant rewritten to the upstream schema, so Specula runs
// the dense head). Rounds, drafts, the target's tokens, acceptance and the output must be identical; the
// drafter's top-20 log-probabilities agree within tol * max(1, |logprob|): 1e-2 for F32 (measured
// 1.3e-3: ggml's fp16 GELU table is most of it) and 8e-2 for Q8_0: both engines round the activations to
// 8 bits, and a value that lands on the other side of a rounding step moves the next layer's input by a
// step; over four draft steps that measured 1.4e-2 with the few-row tiles' summation order and 5.2e-2
// (one token at K = 4's last step) with the packed panels' (exact block sums: a different order, not a
// worse one). The target's Q8_0 log-probabilities differ from PyTorch's by 7.1e-2 for the same reason
// (tests/models). Plain greedy decoding gives the same tokens.
namespace {

std::vector<json> json_lines(const std::string& text) {
  std::vector<json> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

// Compares two top-20 lists of [id, logprob]; an id only one list holds must lie at the other's edge.
double compare_top(const json& want, const json& got, double tol, const std::string& what) {
  double worst = 0;
  auto bound = [&](double lp) { return tol * std::max(1.0, std::abs(lp)); };
  auto check = [&](const json& a, const json& b, const char* side) {
    std::map<int32_t, double> in_b;
    for (const auto& e : b) in_b[e[0].get<int32_t>()] = e[1].get<double>();
    const double edge = b.back()[1].get<double>();
    for (const auto& e : a) {
      const int32_t id = e[0];
      const double lp = e[1];
      if (auto it = in_b.find(id); it != in_b.end()) {
        worst = std::max(worst, std::abs(lp - it->second) / std::max(1.0, std::abs(lp)));
        EXPECT_NEAR(it->second, lp, bound(lp)) << what << " token " << id;
      } else {
        EXPECT_LE(lp, edge + bound(lp)) << what << ": token " << id << " (" << lp << ") is missing from the " << side
                                        << " top-20, whose last entry is " << edge;
      }
    }
  };
  check(want, got, "Specula");
  check(got, want, "llama.cpp");
  return worst;
}

}  // namespace

TEST(LlamaCppTrace, MatchesLlamaCppDraftMtp) {
  const fs::path golden_dir = fs::path(SPECULA_SOURCE_DIR) / "tests/gemma4_assistant/golden/llamacpp-mtp";
  const fs::path models = fs::path(SPECULA_SOURCE_DIR) / "models";
  struct Set {
    const char* name;
    fs::path target, drafter;
    const char* drafter_options;
    double tol;
  };
  const Set sets[] = {
      {"fixture", fixture_dir() / "model-f32.gguf", fixture_dir() / "assistant-f32.gguf", "{}", 1e-2},
      {"tiny", models / "specula-tiny-kjv-q8_0.gguf", models / "specula-tiny-kjv-assistant-q8_0.gguf", "{head: dense}",
       8e-2}};
  // Under the sanitizers K = 1 and 3 only: the same code for every K, at a fifth of the speed.
  const int k_step = SPECULA_TEST_SANITIZE ? 2 : 1;
  for (const Set& set : sets) {
    for (int k = 1; k <= 4; k += k_step) {
      const std::string name = fmt::format("{}-k{}", set.name, k);
      SCOPED_TRACE(name);
      std::ifstream in(golden_dir / (name + ".jsonl"));
      ASSERT_TRUE(in) << "missing golden " << name;
      std::stringstream text;
      text << in.rdbuf();
      const std::vector<json> want = json_lines(text.str());
      ASSERT_GE(want.size(), 2u);
      const json& summary = want.back()["summary"];
      ASSERT_EQ(summary["draft_tokens"], k);
      // The fixture names the convention in the YAML, the tiny pair on the command line.
      const bool in_yaml = std::string(set.name) == "fixture";
      const fs::path yaml = fs::path(SPECULA_BINARY_DIR) / fmt::format("llamacpp-trace-{}.yaml", name);
      std::ofstream(yaml) << fmt::format(
          "backend: {{plugin: cpu, options: {{threads: 1}}}}\ntarget: {{model: {}}}\n"
          "drafter: {{model: {}, draft_tokens: {}, {}options: {}}}\nsampler: {{temperature: 0, max_tokens: {}}}\n",
          set.target.string(), set.drafter.string(), k, in_yaml ? "convention: llamacpp, " : "", set.drafter_options,
          summary["max_tokens"].get<int>());
      std::string ids;
      for (const auto& id : summary["prompt"]) ids += (ids.empty() ? "" : ",") + std::to_string(id.get<int>());
      const std::string args = "run -q --plugin-path " + std::string(SPECULA_PLUGIN_DIR) + " " + yaml.string() +
                               " --tokens " + ids;
      int status = 0;
      const std::string out = run_cli(args + " --trace-json" + (in_yaml ? "" : " --mtp-convention llamacpp"), &status, false);
      ASSERT_EQ(status, 0) << out;
      const std::vector<json> got = json_lines(out);
      ASSERT_EQ(got.size(), want.size()) << out;
      double worst = 0;
      for (size_t r = 0; r + 1 < want.size(); ++r) {
        const json& w = want[r];
        const json& g = got[r];
        for (const char* key : {"round", "n_past", "id_last", "draft", "ids", "n_accepted"})
          EXPECT_EQ(g[key], w[key]) << "round " << r << " " << key;
        ASSERT_EQ(g["steps"].size(), w["steps"].size()) << "round " << r;
        for (size_t i = 0; i < w["steps"].size(); ++i) {
          EXPECT_EQ(g["steps"][i]["token"], w["steps"][i]["token"]) << "round " << r << " step " << i;
          ASSERT_EQ(g["steps"][i]["top"].size(), 20u);
          worst = std::max(worst, compare_top(w["steps"][i]["top"], g["steps"][i]["top"], set.tol,
                                              fmt::format("round {} step {}", r, i)));
        }
      }
      const json& gs = got.back()["summary"];
      for (const char* key : {"n_predict", "n_drafted", "n_accept", "generated", "rounds", "accepted_by_position"})
        EXPECT_EQ(gs[key], summary[key]) << "summary " << key;
      EXPECT_NEAR(gs["mean_accepted_length"].get<double>(), summary["mean_accepted_length"].get<double>(), 1e-8);
      std::printf("[llamacpp-trace] %s: %zu rounds identical, %lld of %lld drafts accepted, drafter top-20 max "
                  "|logprob diff| / max(1, |logprob|) %.2e (bound %.0e)\n", name.c_str(), want.size() - 1,
                  static_cast<long long>(summary["n_accept"].get<int64_t>()),
                  static_cast<long long>(summary["n_drafted"].get<int64_t>()), worst, set.tol);
      // Plain greedy decoding, no drafter: the same tokens.
      if (k == 1) {
        const std::string plain = run_cli(fmt::format("{} --no-drafter --json --max-tokens {}", args,
                                                      summary["n_predict"].get<int>()), &status, false);
        ASSERT_EQ(status, 0) << plain;
        EXPECT_EQ(json::parse(plain)["tokens"], summary["generated"]) << "plain greedy decoding";
      }
    }
  }
}
