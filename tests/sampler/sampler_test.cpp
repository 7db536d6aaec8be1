// The standard sampler against a separately written, deliberately plain reference of the rules in
// ../shared/seeds/gemma4-chat.md (full sort, full softmax, linear scans), over sweeps of uniforms, plus
// the cases ChatSamplerDeviceTests lists: greedy, ties, penalty, suppression, top-K/top-P reachable sets
// with an exactly representable top-P boundary.
#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <random>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "specula/core/plugin_host.hpp"
#include "specula/core/speculative.hpp"
#include "specula/error.hpp"
#include "standard_sampler.hpp"

namespace specula {
namespace {

using sampling::StandardSampler;

// The reference: written from the seed's wording, sharing no code with the plugin, in double. The
// plugin draws by the SDK's float32 rule (sampling_rule.hpp); the two pick differently only where a
// uniform falls within float rounding of a boundary, which these fixed sweeps do not.
int32_t reference_sample(std::vector<float> logits, const SamplingParams& p, const std::vector<int32_t>& history,
                         int32_t generated, const std::vector<int32_t>& end_tokens, float uniform) {
  const int n = static_cast<int>(logits.size());
  if (generated < p.min_length)
    for (int32_t e : end_tokens) logits[e] = -FLT_MAX;
  if (p.repetition_penalty != 1.0f) {
    std::set<int32_t> seen;
    const int start = std::max(0, static_cast<int>(history.size()) - p.penalty_window);
    for (int i = start; i < static_cast<int>(history.size()); ++i) seen.insert(history[i]);
    for (int32_t id : seen) {
      if (logits[id] > 0) logits[id] = logits[id] / p.repetition_penalty;
      else logits[id] = logits[id] * p.repetition_penalty;
    }
  }
  if (p.temperature == 0.0f) {
    int32_t best = 0;
    for (int i = 0; i < n; ++i)
      if (logits[i] > logits[best]) best = i;
    return best;
  }
  std::vector<std::pair<float, int32_t>> ranked;
  for (int i = 0; i < n; ++i) ranked.push_back({logits[i], i});
  std::stable_sort(ranked.begin(), ranked.end(), [](auto& a, auto& b) { return a.first > b.first; });
  if (p.top_k > 0 && p.top_k < n) ranked.resize(p.top_k);
  std::vector<double> w;
  double total = 0;
  for (auto& [l, i] : ranked) {
    w.push_back(std::exp((static_cast<double>(l) - ranked[0].first) / p.temperature));
    total += w.back();
  }
  size_t keep = w.size();
  double cum = 0;
  for (size_t i = 0; i < w.size() && p.top_p < 1.0f; ++i) {
    cum += w[i] / total;
    if (cum >= p.top_p) {
      keep = i + 1;
      break;
    }
  }
  double kept = 0;
  for (size_t i = 0; i < keep; ++i) kept += w[i] / total;
  cum = 0;
  for (size_t i = 0; i < keep; ++i) {
    cum += w[i] / total;
    if (cum > uniform * kept) return ranked[i].second;
  }
  return ranked[keep - 1].second;
}

SamplingState state_of(const std::vector<int32_t>& history, int32_t generated, const std::vector<int32_t>& ends) {
  return SamplingState{history, generated, ends};
}

std::vector<float> random_logits(int n, uint32_t seed, float scale = 4.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> x(n);
  for (float& v : x) v = d(g);
  return x;
}

// The draw's exp (sampling_rule.hpp) against the double-precision exp: a few ulp, exactly 1 at 0, and
// 0 rather than a subnormal (which a GPU may flush) far below.
TEST(SamplingRule, ExpIsWithinFourUlpAndHasNoSubnormals) {
  double worst = 0;
  for (int i = 0; i <= 400000; ++i) {
    const float d = -87.0f * static_cast<float>(i) / 400000.0f;
    const float e = rule_exp(d);
    ASSERT_TRUE(e == 0.0f || std::fpclassify(e) == FP_NORMAL) << d;
    if (e == 0.0f) continue;
    const double want = std::exp(static_cast<double>(d));
    worst = std::max(worst, std::abs(e - want) / std::ldexp(1.0, std::ilogb(want) - 23));
  }
  EXPECT_LE(worst, 4.0);
  EXPECT_EQ(rule_exp(0.0f), 1.0f);
  EXPECT_EQ(rule_exp(-88.0f), 0.0f);
  EXPECT_EQ(rule_exp(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(rule_exp(std::numeric_limits<float>::quiet_NaN()), 0.0f);
  std::printf("[sampling-rule] exp: worst %.2f ulp over [-87, 0]\n", worst);
}

TEST(StandardSampler, MatchesReferenceOverUniformSweeps) {
  const std::vector<SamplingParams> configs = {
      {.temperature = 0.0f},
      {.temperature = 1.0f},
      {.temperature = 0.7f, .top_k = 50, .top_p = 0.9f, .repetition_penalty = 1.05f},
      {.temperature = 0.3f, .top_k = 5},
      {.temperature = 1.3f, .top_p = 0.5f},
      {.temperature = 1.0f, .top_k = 1},
      {.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .repetition_penalty = 1.3f, .min_length = 4},
  };
  int compared = 0;
  for (size_t c = 0; c < configs.size(); ++c) {
    const StandardSampler sampler(configs[c]);
    for (uint32_t trial = 0; trial < 4; ++trial) {
      const auto logits = random_logits(1000, 100 * c + trial);
      std::vector<int32_t> history;
      for (int i = 0; i < 100; ++i) history.push_back((i * 37 + trial) % 1000);
      const std::vector<int32_t> ends{1, 106};
      for (int32_t generated : {0, 10}) {
        for (int u = 0; u < 129; ++u) {
          const float uniform = static_cast<float>(u) / 129.0f;
          ASSERT_EQ(sampler.sample(logits, state_of(history, generated, ends), uniform),
                    reference_sample(logits, configs[c], history, generated, ends, uniform))
              << "config " << c << " trial " << trial << " u " << uniform;
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 7 * 4 * 2 * 129);
}

// distribution() is what sample() draws from: over a fine sweep of uniforms, each token's share of the
// draws is its probability (to the sweep's resolution), and the candidates come most likely first.
TEST(StandardSampler, DistributionIsWhatSampleDrawsFrom) {
  const std::vector<SamplingParams> configs = {
      {.temperature = 0.0f, .repetition_penalty = 1.3f},
      {.temperature = 1.0f},
      {.temperature = 0.7f, .top_k = 20, .top_p = 0.9f, .repetition_penalty = 1.1f},
      {.temperature = 1.3f, .top_p = 0.5f},
      {.temperature = 1.0f, .min_p = 0.05f},
      {.temperature = 0.9f, .top_k = 40, .min_length = 4},
  };
  constexpr int N = 1 << 13;
  for (size_t c = 0; c < configs.size(); ++c) {
    const StandardSampler sampler(configs[c]);
    const auto logits = random_logits(200, 7 + static_cast<uint32_t>(c), 2.0f);
    std::vector<int32_t> history{3, 5, 8, 13};
    const std::vector<int32_t> ends{1};
    const SamplingState state = state_of(history, 0, ends);
    const auto dist = sampler.distribution(logits, state);
    ASSERT_FALSE(dist.empty());
    std::map<int32_t, double> want;
    double total = 0;
    for (size_t i = 0; i < dist.size(); ++i) {
      want[dist[i].token] = dist[i].probability;
      total += dist[i].probability;
      if (i > 0) {
        EXPECT_GE(dist[i - 1].probability, dist[i].probability) << "config " << c;
      }
    }
    EXPECT_NEAR(total, 1.0, 1e-12) << "config " << c;
    std::map<int32_t, double> got;
    for (int i = 0; i < N; ++i) got[sampler.sample(logits, state, static_cast<float>(i) / N)] += 1.0 / N;
    for (auto [t, share] : got) EXPECT_TRUE(want.count(t)) << "config " << c << ": sample() drew " << t;
    for (auto [t, p] : want) EXPECT_NEAR(got[t], p, 2.0 / N) << "config " << c << " token " << t;
    if (configs[c].temperature == 0.0f) {
      ASSERT_EQ(dist.size(), 1u);
      EXPECT_EQ(dist[0].token, sampler.sample(logits, state, 0.5f));
    }
  }
}

TEST(StandardSampler, GreedyTakesLowestIndexAmongEqualMaxima) {
  const StandardSampler s({.temperature = 0.0f});
  const std::vector<float> x{1.0f, 3.0f, -2.0f, 3.0f, 3.0f};
  for (float u : {0.0f, 0.5f, 0.999f}) EXPECT_EQ(s.sample(x, {}, u), 1);
  const std::vector<float> all_equal(10, 0.25f);
  EXPECT_EQ(s.sample(all_equal, {}, 0.7f), 0);
}

TEST(StandardSampler, RepetitionPenaltyDividesPositiveMultipliesOthers) {
  const StandardSampler s({.temperature = 0.0f, .repetition_penalty = 2.0f, .penalty_window = 3});
  const std::vector<float> x{4.0f, -1.0f, 0.0f, 3.0f, 2.5f};
  const std::vector<int32_t> history{0, 0, 1, 2, 1};  // the last 3 ids hold 1 and 2 only
  const auto adj = s.adjusted_logits(x, state_of(history, 0, {}));
  EXPECT_EQ(adj, (std::vector<float>{4.0f, -2.0f, 0.0f, 3.0f, 2.5f}));  // id 0 is outside the window
  const std::vector<int32_t> recent{0, 3};
  const auto adj2 = s.adjusted_logits(x, state_of(recent, 0, {}));
  EXPECT_EQ(adj2, (std::vector<float>{2.0f, -1.0f, 0.0f, 1.5f, 2.5f}));
  EXPECT_EQ(s.sample(x, state_of(recent, 0, {}), 0.0f), 4);  // 2.5 now beats 4/2 and 3/2
  EXPECT_EQ(s.sample(x, state_of({}, 0, {}), 0.0f), 0);
}

TEST(StandardSampler, EndTokensSuppressedUntilMinLength) {
  const StandardSampler s({.temperature = 0.0f, .min_length = 3});
  const std::vector<float> x{0.0f, 9.0f, 1.0f, 8.0f};
  const std::vector<int32_t> ends{1};
  EXPECT_EQ(s.sample(x, state_of({}, 0, ends), 0.0f), 3);
  EXPECT_EQ(s.sample(x, state_of({}, 2, ends), 0.0f), 3);
  EXPECT_EQ(s.sample(x, state_of({}, 3, ends), 0.0f), 1);
  EXPECT_EQ(s.adjusted_logits(x, state_of({}, 0, ends))[1], -FLT_MAX);
  // A sampled (non-greedy) draw can never reach a suppressed token either.
  const StandardSampler t({.temperature = 1.0f, .min_length = 3});
  const std::vector<float> flat(4, 0.0f);
  for (int u = 0; u < 1000; ++u) EXPECT_NE(t.sample(flat, state_of({}, 0, ends), u / 1000.0f), 1);
}

std::set<int32_t> reachable(const StandardSampler& s, const std::vector<float>& x, int steps = 4096) {
  std::set<int32_t> out;
  for (int u = 0; u < steps; ++u) out.insert(s.sample(x, {}, static_cast<float>(u) / steps));
  return out;
}

TEST(StandardSampler, TopKReachableSetIsTheKHighestLogits) {
  auto x = random_logits(200, 7, 0.5f);
  x[17] = 5.0f;
  x[3] = 4.9f;
  x[150] = 4.8f;
  const StandardSampler s({.temperature = 1.0f, .top_k = 3});
  EXPECT_EQ(reachable(s, x), (std::set<int32_t>{3, 17, 150}));
  // Ties at the K boundary: the lower index is the one kept.
  std::vector<float> tie(10, 0.0f);
  tie[4] = 1.0f;
  const StandardSampler s2({.temperature = 1.0f, .top_k = 3});
  EXPECT_EQ(reachable(s2, tie), (std::set<int32_t>{0, 1, 4}));
}

TEST(StandardSampler, TopPExactlyRepresentableBoundary) {
  // Eight equal logits: every probability is exactly 1/8, so a cumulative sum hits 3/8 exactly.
  const std::vector<float> x(8, 1.5f);
  const StandardSampler reach({.temperature = 1.0f, .top_p = 0.375f});
  EXPECT_EQ(reachable(reach, x), (std::set<int32_t>{0, 1, 2}));  // "reaching" includes equality
  const StandardSampler above({.temperature = 1.0f, .top_p = 0.376f});
  EXPECT_EQ(reachable(above, x), (std::set<int32_t>{0, 1, 2, 3}));
  const StandardSampler all({.temperature = 1.0f, .top_p = 1.0f});
  EXPECT_EQ(reachable(all, x).size(), 8u);
  // Inverse CDF over the kept three: u in [0, 1/3) -> 0, [1/3, 2/3) -> 1, [2/3, 1) -> 2.
  EXPECT_EQ(reach.sample(x, {}, 0.0f), 0);
  EXPECT_EQ(reach.sample(x, {}, 0.3f), 0);
  EXPECT_EQ(reach.sample(x, {}, 0.34f), 1);
  EXPECT_EQ(reach.sample(x, {}, 0.999f), 2);
}

TEST(StandardSampler, MinPKeepsCandidatesNearTheMostLikelyAndRenormalises) {
  // Probabilities 8 : 4 : 2 : 1 (over 15) at temperature 1.
  const std::vector<float> x{std::log(8.0f), std::log(4.0f), std::log(2.0f), std::log(1.0f)};
  EXPECT_EQ(reachable(StandardSampler({.temperature = 1.0f, .min_p = 0.2f}), x), (std::set<int32_t>{0, 1, 2}));
  EXPECT_EQ(reachable(StandardSampler({.temperature = 1.0f, .min_p = 0.3f}), x), (std::set<int32_t>{0, 1}));
  EXPECT_EQ(reachable(StandardSampler({.temperature = 1.0f, .min_p = 1.0f}), x), (std::set<int32_t>{0}));
  EXPECT_EQ(reachable(StandardSampler({.temperature = 1.0f}), x).size(), 4u);
  // Renormalised over 8 : 4: u below 2/3 -> 0, above -> 1.
  const StandardSampler s({.temperature = 1.0f, .min_p = 0.3f});
  EXPECT_EQ(s.sample(x, {}, 0.6f), 0);
  EXPECT_EQ(s.sample(x, {}, 0.7f), 1);
  // Min-p, then top-p over what is left: 8/12 = 0.667 reaches 0.6.
  EXPECT_EQ(reachable(StandardSampler({.temperature = 1.0f, .top_p = 0.6f, .min_p = 0.3f}), x), (std::set<int32_t>{0}));
  EXPECT_THROW(StandardSampler({.min_p = 1.5f}), Error);
  EXPECT_THROW(StandardSampler({.min_p = -0.1f}), Error);
}

TEST(StandardSampler, SeededUniformsAreReproducibleAndInRange) {
  StandardSampler a({.temperature = 1.0f, .seed = 42}), b({.temperature = 1.0f, .seed = 42}),
      c({.temperature = 1.0f, .seed = 43});
  int same_as_c = 0;
  for (int i = 0; i < 1000; ++i) {
    const float ua = a.next_uniform(), ub = b.next_uniform(), uc = c.next_uniform();
    EXPECT_EQ(ua, ub);
    EXPECT_GE(ua, 0.0f);
    EXPECT_LT(ua, 1.0f);
    same_as_c += ua == uc;
  }
  EXPECT_LT(same_as_c, 5);
}

TEST(StandardSampler, BadParametersAreClearErrors) {
  EXPECT_THROW(StandardSampler({.temperature = -1.0f}), Error);
  EXPECT_THROW(StandardSampler({.top_p = 0.0f}), Error);
  EXPECT_THROW(StandardSampler({.top_p = 1.5f}), Error);
  EXPECT_THROW(StandardSampler({.top_k = -2}), Error);
  EXPECT_THROW(StandardSampler({.repetition_penalty = 0.0f}), Error);
  const StandardSampler s({});
  EXPECT_THROW(s.sample(std::vector<float>{}, {}, 0.5f), Error);
}

TEST(StandardSampler, LoadsAsPluginThroughTheHost) {
  core::PluginHost host;
  host.discover({SPECULA_PLUGIN_DIR});
  const auto* info = host.find("standard");
  ASSERT_NE(info, nullptr);
  EXPECT_TRUE(info->has_kind("sampler"));
  const auto sampler = host.make_sampler("standard", {.temperature = 0.0f});
  const std::vector<float> x{0.5f, 2.0f, 1.0f};
  EXPECT_EQ(sampler->sample(x, {}, 0.3f), 1);
}

}  // namespace
}  // namespace specula

#include "cpu_backend.hpp"

namespace specula {
namespace {

// The device form (sample_in_graph) run by the CPU backend, against the host form, token for token.
// Both rank candidates by (logit, then lower index) and repeat the same double arithmetic, so they
// agree on every input, exact ties included: no divergence is allowed here (unlike the seed's MLX
// device form, whose argSort may order equal logits differently from the host's sort).
class Device {
 public:
  Device() : backend_(cpu::make_cpu_backend({{"threads", 1}})) {}
  ComputeBackend& backend() { return *backend_; }

  // Builds the graph for (sampler, state) once per device_key, runs it with `uniform`.
  int32_t sample(const Sampler& s, const std::vector<float>& logits, const SamplingState& state, float uniform) {
    const std::string key = s.device_key(state) + "|" + std::to_string(logits.size());
    auto& b = built_[key];
    if (!b.g) {
      b.g = std::make_unique<Graph>();
      b.logits = b.g->input(DType::F32, {static_cast<int64_t>(logits.size())}, "logits");
      const auto ids = s.device_ids(state);
      if (!ids.empty()) b.ids = b.g->input(DType::I32, {static_cast<int64_t>(ids.size())}, "ids");
      b.uniform = b.g->input(DType::F32, {1}, "uniform");
      b.token = s.sample_in_graph(*b.g, b.logits, b.ids, b.uniform, state, *backend_);
      if (!b.token) throw Error("device form declined on the CPU backend");
      b.g->mark_output(b.token);
      b.plan = backend_->compile(*b.g);
    }
    const auto ids = s.device_ids(state);
    RunInputs in{{{b.logits, std::as_bytes(std::span<const float>(logits))},
                  {b.uniform, std::as_bytes(std::span<const float>(&uniform, 1))}}};
    if (b.ids) in.inputs.emplace_back(b.ids, std::as_bytes(std::span<const int32_t>(ids)));
    b.plan->run(in);
    int32_t token = -1;
    b.plan->read(b.token, std::as_writable_bytes(std::span<int32_t>(&token, 1)));
    return token;
  }

 private:
  struct Built {
    std::unique_ptr<Graph> g;
    std::unique_ptr<CompiledGraph> plan;  // after `g`: destroyed before it
    Value logits, ids, uniform, token;
  };
  std::unique_ptr<ComputeBackend> backend_;
  std::map<std::string, Built> built_;
};

// bf16 keeps 8 mantissa bits: logits rounded to it tie often, as a real lm_head's do.
std::vector<float> bf16_logits(int n, uint32_t seed) {
  auto x = random_logits(n, seed, 2.0f);
  for (float& v : x) {
    int e = 0;
    const double m = std::frexp(static_cast<double>(v), &e);
    v = static_cast<float>(std::ldexp(std::nearbyint(std::ldexp(m, 8)), e - 8));
  }
  return x;
}

TEST(StandardSamplerDevice, MatchesHostOverUniformSweeps) {
  const std::vector<SamplingParams> configs = {
      {.temperature = 0.0f},
      {.temperature = 1.0f},
      {.temperature = 0.7f, .top_k = 50, .top_p = 0.9f, .repetition_penalty = 1.05f},
      {.temperature = 0.3f, .top_k = 5},
      {.temperature = 1.3f, .top_p = 0.5f},
      {.temperature = 1.0f, .top_k = 1},
      {.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .repetition_penalty = 1.3f, .min_length = 4},
      {.temperature = 0.0f, .repetition_penalty = 1.5f, .penalty_window = 8, .min_length = 4},
      {.temperature = 1.0f, .top_p = 0.8f, .repetition_penalty = 0.8f, .penalty_window = 5000},
      {.temperature = 0.7f, .min_p = 0.05f},
      {.temperature = 1.2f, .top_k = 40, .top_p = 0.9f, .min_p = 0.1f, .repetition_penalty = 1.1f},
      {.temperature = 1.0f, .min_p = 1.0f},
  };
  Device dev;
  int compared = 0;
  for (size_t c = 0; c < configs.size(); ++c) {
    const StandardSampler sampler(configs[c]);
    for (uint32_t trial = 0; trial < 2; ++trial) {
      const auto logits = trial ? bf16_logits(1000, 70 + c) : random_logits(1000, 100 * c + trial);
      std::vector<int32_t> history;
      for (int i = 0; i < (trial ? 30 : 100); ++i) history.push_back((i * 37 + trial) % 1000);
      const std::vector<int32_t> ends{1, 106, 1};
      for (int32_t generated : {0, 10}) {
        const auto state = state_of(history, generated, ends);
        for (int u = 0; u < 1000; ++u) {
          const float uniform = u == 999 ? 0x1.fffffep-1f : static_cast<float>(u) / 1000.0f;
          ASSERT_EQ(dev.sample(sampler, logits, state, uniform), sampler.sample(logits, state, uniform))
              << "config " << c << " trial " << trial << " generated " << generated << " u " << uniform;
          ++compared;
        }
      }
    }
  }
  EXPECT_EQ(compared, 12 * 2 * 2 * 1000);
}

TEST(StandardSamplerDevice, GreedyTiesTakeTheLowestIndex) {
  Device dev;
  const StandardSampler greedy({.temperature = 0.0f});
  for (uint32_t trial = 0; trial < 20; ++trial) {
    auto x = random_logits(1000, 900 + trial, 1.0f);
    const float top = *std::max_element(x.begin(), x.end()) + 1.0f;
    x[5 + trial] = x[500 + trial] = x[999] = top;
    EXPECT_EQ(dev.sample(greedy, x, {}, 0.5f), static_cast<int32_t>(5 + trial));
    EXPECT_EQ(dev.sample(greedy, x, {}, 0.5f), greedy.sample(x, {}, 0.5f));
  }
  EXPECT_EQ(dev.sample(greedy, std::vector<float>(10, 0.25f), {}, 0.7f), 0);
}

TEST(StandardSamplerDevice, RepetitionPenaltyAndSuppression) {
  Device dev;
  const StandardSampler s({.temperature = 0.0f, .repetition_penalty = 2.0f, .penalty_window = 3});
  const std::vector<float> x{4.0f, -1.0f, 0.0f, 3.0f, 2.5f};
  const std::vector<int32_t> recent{0, 3}, old{0, 0, 1, 2, 1};
  EXPECT_EQ(dev.sample(s, x, state_of(recent, 0, {}), 0.0f), 4);  // 2.5 beats 4/2 and 3/2
  EXPECT_EQ(dev.sample(s, x, state_of(old, 0, {}), 0.0f), 0);     // id 0 is outside the window
  // Negative logits are multiplied: -1 * 2 = -2 makes id 1 lose to id 2's 0 under a sampled draw too.
  const StandardSampler t({.temperature = 1.0f, .top_k = 2, .repetition_penalty = 2.0f, .penalty_window = 1});
  const std::vector<float> y{-1.0f, -0.6f, -0.7f};
  for (int u = 0; u < 100; ++u)
    EXPECT_NE(dev.sample(t, y, state_of(std::vector<int32_t>{1}, 0, {}), u / 100.0f), 1);
  // End tokens at -FLT_MAX while generated < min_length, reachable after; the penalty then turns
  // -FLT_MAX * p into -inf on both sides.
  const StandardSampler m({.temperature = 0.0f, .repetition_penalty = 1.5f, .min_length = 3});
  const std::vector<float> z{0.0f, 9.0f, 1.0f, 8.0f};
  const std::vector<int32_t> ends{1}, hist{1, 2};
  const std::vector<int32_t> no_end{2};
  EXPECT_EQ(dev.sample(m, z, state_of(hist, 2, ends), 0.0f), 3);
  EXPECT_EQ(dev.sample(m, z, state_of(hist, 3, ends), 0.0f), 3);     // 9 / 1.5 = 6 < 8
  EXPECT_EQ(dev.sample(m, z, state_of(no_end, 3, ends), 0.0f), 1);
  for (const auto& st : {state_of(hist, 2, ends), state_of(hist, 3, ends), state_of(no_end, 3, ends)})
    EXPECT_EQ(dev.sample(m, z, st, 0.0f), m.sample(z, st, 0.0f));
  const StandardSampler flat({.temperature = 1.0f, .min_length = 3});
  for (int u = 0; u < 1000; ++u)
    EXPECT_NE(dev.sample(flat, std::vector<float>(4, 0.0f), state_of({}, 0, ends), u / 1000.0f), 1);
}

TEST(StandardSamplerDevice, TopKAndTopPReachableSets) {
  Device dev;
  auto reach = [&](const StandardSampler& s, const std::vector<float>& x) {
    std::set<int32_t> out;
    for (int u = 0; u < 1000; ++u) out.insert(dev.sample(s, x, {}, u / 1000.0f));
    return out;
  };
  auto x = random_logits(200, 7, 0.5f);
  x[17] = 5.0f;
  x[3] = 4.9f;
  x[150] = 4.8f;
  EXPECT_EQ(reach(StandardSampler({.temperature = 1.0f, .top_k = 3}), x), (std::set<int32_t>{3, 17, 150}));
  std::vector<float> tie(10, 0.0f);
  tie[4] = 1.0f;
  EXPECT_EQ(reach(StandardSampler({.temperature = 1.0f, .top_k = 3}), tie), (std::set<int32_t>{0, 1, 4}));
  const std::vector<float> eight(8, 1.5f);  // every probability exactly 1/8
  EXPECT_EQ(reach(StandardSampler({.temperature = 1.0f, .top_p = 0.375f}), eight), (std::set<int32_t>{0, 1, 2}));
  EXPECT_EQ(reach(StandardSampler({.temperature = 1.0f, .top_p = 0.376f}), eight), (std::set<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(reach(StandardSampler({.temperature = 1.0f}), eight).size(), 8u);
}

TEST(StandardSamplerDevice, WindowIdsKeepOneShapeAsHistoryGrows) {
  const StandardSampler s({.temperature = 0.7f, .repetition_penalty = 1.1f, .penalty_window = 4, .min_length = 2});
  const std::vector<int32_t> ends{7, 8};
  std::vector<int32_t> h{5};
  EXPECT_EQ(s.device_ids(state_of(h, 0, ends)), (std::vector<int32_t>{5, 5, 5, 5, 7, 8}));
  const std::string key = s.device_key(state_of(h, 0, ends));
  h = {1, 2, 3, 4, 5, 6};
  EXPECT_EQ(s.device_ids(state_of(h, 1, ends)), (std::vector<int32_t>{3, 4, 5, 6, 7, 8}));
  EXPECT_EQ(s.device_key(state_of(h, 1, ends)), key);
  EXPECT_EQ(s.device_ids(state_of(h, 2, ends)), (std::vector<int32_t>{3, 4, 5, 6}));  // suppression over
  EXPECT_NE(s.device_key(state_of(h, 2, ends)), key);
  EXPECT_TRUE(StandardSampler({}).device_ids(state_of(h, 0, {})).empty());
  EXPECT_NE(StandardSampler({.temperature = 0.5f}).device_key({}), StandardSampler({.temperature = 0.6f}).device_key({}));
}

// A CPU backend that lacks one op: the device form declines, names it, and leaves the graph alone.
class Lacking final : public ComputeBackend {
 public:
  explicit Lacking(Op missing) : inner_(cpu::make_cpu_backend({})), missing_(missing) {}
  std::string name() const override { return "lacking"; }
  DeviceInfo device() const override { return inner_->device(); }
  Support supports(Op op, DType type) const override {
    return op == missing_ ? Support::no("not implemented") : inner_->supports(op, type);
  }
  BackendTensorPtr load_weight(const TensorInfo& i) override { return inner_->load_weight(i); }
  BackendTensorPtr allocate(const std::string& n, DType t, const Shape& s) override { return inner_->allocate(n, t, s); }
  std::unique_ptr<CompiledGraph> compile(const Graph& g) override { return inner_->compile(g); }
  void read(const BackendTensor& t, std::span<std::byte> d) override { inner_->read(t, d); }
  void write(BackendTensor& t, std::span<const std::byte> s) override { inner_->write(t, s); }

 private:
  std::unique_ptr<ComputeBackend> inner_;
  Op missing_;
};

TEST(StandardSamplerDevice, DeclinesNamingTheMissingOp) {
  const std::vector<int32_t> history{1, 2};
  for (auto [op, params] : {std::pair<Op, SamplingParams>{Op::TopPDraw, {.temperature = 0.7f}},
                            {Op::Scatter, {.repetition_penalty = 1.1f}}, {Op::Div, {.repetition_penalty = 1.1f}},
                            {Op::Argmax, {}}}) {
    const Lacking be(op);
    const StandardSampler s(params);
    const auto state = state_of(history, 0, {});
    Graph g;
    const Value in = g.input(DType::F32, {10}, "logits");
    const auto ids = s.device_ids(state);
    const Value idv = ids.empty() ? Value{} : g.input(DType::I32, {static_cast<int64_t>(ids.size())}, "ids");
    const Value u = g.input(DType::F32, {1}, "u");
    const size_t nodes = g.nodes().size();
    std::string why;
    EXPECT_FALSE(s.sample_in_graph(g, in, idv, u, state, be, &why));
    EXPECT_EQ(g.nodes().size(), nodes);
    EXPECT_NE(why.find(std::string(op_name(op))), std::string::npos) << why;
  }
  // Greedy without penalty or suppression needs Argmax only.
  const Lacking be(Op::TopPDraw);
  Graph g;
  const Value in = g.input(DType::F32, {10}, "logits");
  EXPECT_TRUE(StandardSampler({}).sample_in_graph(g, in, Value{}, g.input(DType::F32, {1}, "u"), {}, be));
}

// The speculative verdict's device form (verify_in_graph: TopK and AcceptDrafts) on the CPU backend
// against the host engine's rule (core::accept_draft over distribution(), core::draw for the bonus), token
// for token: drafts drawn from the drafter's distribution as the engine draws them, target rows near and
// far from the drafter's (p = q included), bf16 logits (ties), and uniform sweeps with 0 and 1 - 2^-24.
TEST(StandardSamplerDevice, SpeculativeVerdictEqualsTheHostRule) {
  const int64_t V = 300;
  const std::vector<SamplingParams> configs = {
      {.temperature = 0.7f, .top_k = 40}, {.temperature = 1.0f},
      {.temperature = 1.0f, .top_p = 0.9f}, {.temperature = 0.8f, .min_p = 0.05f},
      {.temperature = 1.3f, .top_k = 8, .top_p = 0.95f}, {.temperature = 0.5f, .top_k = 300, .top_p = 0.8f, .min_p = 0.01f}};
  Device dev;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uni(0.0f, 1.0f);
  int64_t cases = 0, all_accepted = 0, none_accepted = 0;
  for (size_t c = 0; c < configs.size(); ++c) {
    const StandardSampler s(configs[c]);
    for (int64_t n = 1; n <= 4; ++n) {
      Graph g;
      const Value target = g.input(DType::F32, {n + 1, V}, "target");
      const Value draft = g.input(DType::F32, {n, V}, "draft");
      const Value drafts = g.input(DType::I32, {n}, "drafts");
      const Value uniforms = g.input(DType::F32, {2 * n + 1}, "uniforms");
      std::string why;
      const Value verdict = s.verify_in_graph(g, target, draft, drafts, uniforms, {}, dev.backend(), &why);
      ASSERT_TRUE(verdict) << why;
      g.mark_output(verdict);
      const auto plan = dev.backend().compile(g);
      for (int trial = 0; trial < 24; ++trial) {
        const uint32_t seed = static_cast<uint32_t>(1000 * c + 100 * n + trial);
        std::vector<float> p, q;
        for (int64_t i = 0; i <= n; ++i) {
          const auto row = trial % 3 == 0 ? bf16_logits(V, seed + 17 * i) : random_logits(V, seed + 17 * i, 3.0f);
          p.insert(p.end(), row.begin(), row.end());
        }
        for (int64_t i = 0; i < n; ++i) {  // the drafter: the target's row (p = q), a noisy copy, or another
          std::vector<float> row(p.begin() + i * V, p.begin() + (i + 1) * V);
          const auto noise = random_logits(V, seed + 1000 + i, 1.0f);
          for (int64_t j = 0; j < V; ++j)
            row[j] = trial % 4 == 1 ? row[j] : trial % 4 == 3 ? noise[j] * 3.0f : row[j] + noise[j];
          q.insert(q.end(), row.begin(), row.end());
        }
        std::vector<core::Distribution> qd(n), pd(n + 1);
        std::vector<int32_t> d(n);
        for (int64_t i = 0; i <= n; ++i) pd[i] = s.distribution(std::span<const float>(p).subspan(i * V, V), {});
        for (int64_t i = 0; i < n; ++i) {
          qd[i] = s.distribution(std::span<const float>(q).subspan(i * V, V), {});
          d[i] = core::draw(qd[i], uni(rng));
        }
        for (int sweep = 0; sweep < 8; ++sweep) {
          std::vector<float> u(2 * n + 1);
          for (float& x : u) x = sweep == 0 ? 0.0f : sweep == 1 ? 0x1.fffffep-1f : uni(rng);
          // The host engine's round: decide in order up to the first rejection, else the bonus.
          std::vector<int32_t> want{0};
          for (int64_t i = 0; i <= n; ++i) {
            const core::Verdict v = i < n ? core::accept_draft(pd[i], qd[i], d[i], u[2 * i], u[2 * i + 1])
                                          : core::Verdict{false, core::draw(pd[n], u[2 * n])};
            want.push_back(v.token);
            if (!v.accepted) break;
            ++want[0];
          }
          want.resize(n + 2, -1);
          plan->run({{{target, std::as_bytes(std::span<const float>(p))}, {draft, std::as_bytes(std::span<const float>(q))},
                      {drafts, std::as_bytes(std::span<const int32_t>(d))}, {uniforms, std::as_bytes(std::span<const float>(u))}}});
          std::vector<int32_t> got(n + 2);
          plan->read(verdict, std::as_writable_bytes(std::span<int32_t>(got)));
          ASSERT_EQ(got, want) << "config " << c << ", n " << n << ", trial " << trial << ", sweep " << sweep;
          ++cases;
          all_accepted += want[0] == n;
          none_accepted += want[0] == 0;
        }
      }
    }
  }
  std::printf("[sampler] %lld rounds: %lld with every draft accepted, %lld with none\n", static_cast<long long>(cases),
              static_cast<long long>(all_accepted), static_cast<long long>(none_accepted));
  EXPECT_GT(all_accepted, 50);
  EXPECT_GT(none_accepted, 50);
}

// What the verdict's device form declines, and why: greedy, a penalty window or end-token suppression
// (they would differ row by row with the drafts), a backend without AcceptDrafts.
TEST(StandardSamplerDevice, SpeculativeVerdictDeclinesWhatDependsOnTheDrafts) {
  Device dev;
  const std::vector<int32_t> history{1, 2, 3}, ends{7};
  struct Case {
    SamplingParams p;
    SamplingState state;
    const char* why;
  };
  const std::vector<Case> cases = {
      {{}, {}, "greedy"},
      {{.temperature = 0.8f, .repetition_penalty = 1.2f}, state_of(history, 0, {}), "repetition penalty"},
      {{.temperature = 0.8f, .min_length = 4}, state_of(history, 1, ends), "suppressed for 3 more tokens"}};
  for (const Case& c : cases) {
    Graph g;
    const Value t = g.input(DType::F32, {3, 10}, "t"), q = g.input(DType::F32, {2, 10}, "q");
    const Value d = g.input(DType::I32, {2}, "d"), u = g.input(DType::F32, {5}, "u");
    const size_t nodes = g.nodes().size();
    std::string why;
    EXPECT_FALSE(StandardSampler(c.p).verify_in_graph(g, t, q, d, u, c.state, dev.backend(), &why));
    EXPECT_EQ(g.nodes().size(), nodes);
    EXPECT_NE(why.find(c.why), std::string::npos) << why;
  }
  const Lacking be(Op::AcceptDrafts);
  Graph g;
  std::string why;
  EXPECT_FALSE(StandardSampler({.temperature = 0.8f})
                   .verify_in_graph(g, g.input(DType::F32, {3, 10}, "t"), g.input(DType::F32, {2, 10}, "q"),
                                    g.input(DType::I32, {2}, "d"), g.input(DType::F32, {5}, "u"), {}, be, &why));
  EXPECT_NE(why.find("AcceptDrafts"), std::string::npos) << why;
}

// Sampling alone at Gemma 4's vocabulary (262144), host form vs device form on the CPU backend (logits
// already in memory on both sides). Disabled by default; numbers in docs/sampling.md.
TEST(StandardSamplerDevice, DISABLED_TimingAtGemmaVocab) {
  Device dev;
  const auto logits = random_logits(262144, 1, 3.0f);
  std::vector<int32_t> history;
  for (int i = 0; i < 64; ++i) history.push_back(i * 4099 % 262144);
  const std::vector<int32_t> ends{1, 106};
  const std::vector<std::pair<const char*, SamplingParams>> cases{
      {"greedy", {}},
      {"t=0.8 top_k=64 top_p=0.95 penalty=1.1", {.temperature = 0.8f, .top_k = 64, .top_p = 0.95f, .repetition_penalty = 1.1f}},
      {"t=1 top_p=0.95 (full sort)", {.temperature = 1.0f, .top_p = 0.95f}}};
  for (const auto& [name, p] : cases) {
    const StandardSampler s(p);
    const auto state = state_of(history, 0, ends);
    auto time = [&](auto&& f) {
      double best = 1e30;
      for (int rep = 0; rep < 5; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < 20; ++i) f(i);
        best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 20);
      }
      return best;
    };
    int32_t sink = 0;
    const double host = time([&](int i) { sink += s.sample(logits, state, i / 20.0f); });
    const double device = time([&](int i) { sink += dev.sample(s, logits, state, i / 20.0f); });
    std::printf("[timing] %-40s host %.3f ms  device (CPU backend) %.3f ms  (%d)\n", name, host, device, sink & 1);
  }
}

}  // namespace
// OpenAI's presence / frequency penalties against a hand-computed reference: only this completion's
// tokens (the last `generated` ids) count, logit -= presence * (count > 0) + frequency * count.
TEST(StandardSampler, PresenceAndFrequencyPenaltiesCountGeneratedTokensOnly) {
  const StandardSampler s({.temperature = 0.0f, .presence_penalty = 0.5f, .frequency_penalty = 0.25f});
  const std::vector<float> x{1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  const std::vector<int32_t> history{0, 1, 2, 2, 3, 0};  // prompt {0, 1}, generated {2, 2, 3, 0}
  // id 0: 1 - 0.5 - 0.25; id 1 only in the prompt; id 2: 3 - 0.5 - 2 * 0.25; id 3: 4 - 0.5 - 0.25.
  EXPECT_EQ(s.adjusted_logits(x, state_of(history, 4, {})), (std::vector<float>{0.25f, 2.0f, 2.0f, 3.25f, 5.0f, 6.0f}));
  EXPECT_EQ(s.adjusted_logits(x, state_of(history, 0, {})), x);  // nothing generated yet
  // Negative values encourage repeats.
  const StandardSampler neg({.temperature = 0.0f, .presence_penalty = -1.0f, .frequency_penalty = -2.0f});
  EXPECT_EQ(neg.adjusted_logits(x, state_of(history, 4, {})), (std::vector<float>{4.0f, 2.0f, 8.0f, 7.0f, 5.0f, 6.0f}));
  EXPECT_EQ(neg.sample(x, state_of(history, 4, {}), 0.0f), 2);
  EXPECT_EQ(s.sample(x, state_of(history, 4, {}), 0.0f), 5);
}

TEST(StandardSampler, PenalisedDistributionIsTheSoftmaxOfThePenalisedLogits) {
  const StandardSampler s({.temperature = 1.0f, .presence_penalty = 1.0f, .frequency_penalty = 0.5f});
  const std::vector<float> x{0.0f, 0.0f, 0.0f};
  const std::vector<int32_t> history{1, 0, 0};  // prompt {1}, generated {0, 0}: id 0 at 0 - 1 - 2 * 0.5 = -2
  const auto d = s.distribution(x, state_of(history, 2, {}));
  const double z = 2.0 + std::exp(-2.0);
  ASSERT_EQ(d.size(), 3u);
  EXPECT_EQ(d[0].token, 1);
  EXPECT_EQ(d[1].token, 2);
  EXPECT_EQ(d[2].token, 0);
  EXPECT_NEAR(d[0].probability, 1.0 / z, 1e-6);
  EXPECT_NEAR(d[1].probability, 1.0 / z, 1e-6);
  EXPECT_NEAR(d[2].probability, std::exp(-2.0) / z, 1e-6);
}

TEST(StandardSampler, LogitBiasIsAddedAndKeepsSuppressedEndTokensOut) {
  const StandardSampler s({.temperature = 0.0f, .min_length = 2, .logit_bias = {{5, -100.0f}, {1, 10.5f}, {4, 100.0f}, {99, 3.0f}}});
  const std::vector<float> x{1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f};
  const std::vector<int32_t> ends{4};
  const auto adj = s.adjusted_logits(x, state_of({}, 0, ends));
  EXPECT_EQ(adj, (std::vector<float>{1.0f, 12.5f, 3.0f, 4.0f, -FLT_MAX, -94.0f}));  // id 99: outside, ignored
  EXPECT_EQ(s.sample(x, state_of({}, 0, ends), 0.0f), 1);
  EXPECT_EQ(s.sample(x, state_of({}, 2, ends), 0.0f), 4);  // no longer suppressed: 5 + 100
}

TEST(StandardSampler, RejectsPenaltiesAndBiasesOutOfRange) {
  EXPECT_THROW(StandardSampler({.presence_penalty = 2.5f}), Error);
  EXPECT_THROW(StandardSampler({.frequency_penalty = -2.01f}), Error);
  EXPECT_THROW(StandardSampler({.logit_bias = {{3, 100.5f}}}), Error);
  EXPECT_THROW(StandardSampler({.logit_bias = {{-1, 1.0f}}}), Error);
  EXPECT_NO_THROW(StandardSampler({.presence_penalty = -2.0f, .frequency_penalty = 2.0f, .logit_bias = {{0, -100.0f}}}));
}

// The device forms decline the OpenAI penalties and logit_bias, naming them, so that the engine samples
// and verifies on the host and says why.
TEST(StandardSamplerDevice, DeclinesPenaltiesAndLogitBiasNamingThem) {
  Device dev;
  const std::vector<int32_t> history{1, 2, 3};
  for (const auto& [p, name] : {std::pair<SamplingParams, std::string>{{.presence_penalty = 0.5f}, "presence_penalty"},
                                {{.temperature = 0.7f, .frequency_penalty = 0.5f}, "frequency_penalty"},
                                {{.temperature = 0.7f, .logit_bias = {{1, 2.0f}}}, "logit_bias"}}) {
    const StandardSampler s(p);
    const auto state = state_of(history, 1, {});
    Graph g;
    const Value in = g.input(DType::F32, {10}, "logits");
    const Value u = g.input(DType::F32, {1}, "u");
    const size_t nodes = g.nodes().size();
    std::string why;
    EXPECT_FALSE(s.sample_in_graph(g, in, Value{}, u, state, dev.backend(), &why));
    EXPECT_EQ(g.nodes().size(), nodes);
    EXPECT_NE(why.find(name), std::string::npos) << why;
    // Graphs are cached by device_key: one built without these rules must not serve a sampler with them.
    EXPECT_NE(s.device_key(state), StandardSampler({.temperature = p.temperature}).device_key(state)) << name;
    if (p.temperature > 0.0f) {
      Graph v;
      const Value t = v.input(DType::F32, {3, 10}, "t"), q = v.input(DType::F32, {2, 10}, "q");
      const Value d = v.input(DType::I32, {2}, "d"), us = v.input(DType::F32, {5}, "u");
      why.clear();
      EXPECT_FALSE(s.verify_in_graph(v, t, q, d, us, state, dev.backend(), &why));
      EXPECT_NE(why.find(name), std::string::npos) << why;
    }
  }
}

}  // namespace specula
