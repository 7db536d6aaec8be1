// The device sampler's ops (Div, Clamp, Scatter, TopPDraw) on the CPU backend against references
// written here from compute.hpp's wording, including the edge cases: repeated ids, top_p = 1,
// uniform 0 and just below 1, zero-weight candidates, and the builders' shape checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <functional>
#include <cmath>
#include <limits>
#include <random>
#include <set>

#include "specula/error.hpp"
#include "test_util.hpp"

namespace specula {
namespace {

TEST(SamplingOps, DivIsIeeeDivisionWithBroadcast) {
  test::Fixture fx;
  const auto a = test::random_floats(12, 1, -3.0f, 3.0f);
  const std::vector<float> b{0.7f, -1.3f, 3.0f};
  Graph g;
  Value av = g.input(DType::F32, {4, 3}, "a"), bv = g.input(DType::F32, {3}, "b");
  Value one = g.input(DType::F32, {1}, "one");
  Value y = g.div(av, bv), z = g.div(av, one);
  g.mark_output(y);
  g.mark_output(z);
  const std::vector<float> s{1.1f};
  fx.run(g, {{{av, test::bytes_of(a)}, {bv, test::bytes_of(b)}, {one, test::bytes_of(s)}}});
  const auto got = fx.read_f32(g, y), got1 = fx.read_f32(g, z);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(got[i], a[i] / b[i % 3]) << i;  // bit for bit: a quotient, not a * (1 / b)
    EXPECT_EQ(got1[i], a[i] / 1.1f) << i;
  }
}

TEST(SamplingOps, ClampBoundsAndFills) {
  test::Fixture fx;
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x{-inf, -2.0f, -0.0f, 0.0f, 0.5f, 3.0f, inf, -FLT_MAX};
  Graph g;
  Value xv = g.input(DType::F32, {8}, "x");
  Value c = g.clamp(xv, -1.0f, 1.0f), pos = g.clamp(xv, 0.0f, inf), fill = g.clamp(xv, 2.5f, 2.5f);
  for (Value v : {c, pos, fill}) g.mark_output(v);
  fx.run(g, {{{xv, test::bytes_of(x)}}});
  const auto gc = fx.read_f32(g, c), gp = fx.read_f32(g, pos), gf = fx.read_f32(g, fill);
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(gc[i], std::min(std::max(x[i], -1.0f), 1.0f)) << i;
    EXPECT_EQ(gp[i], x[i] < 0.0f ? 0.0f : x[i]) << i;
    EXPECT_EQ(gf[i], 2.5f) << i;
  }
  EXPECT_THROW(g.clamp(xv, 1.0f, 0.0f), Error);
}

TEST(SamplingOps, ScatterCopiesAndOverwrites) {
  test::Fixture fx;
  const auto a = test::random_floats(10, 2);
  const std::vector<int32_t> ids{3, 0, 9, 3, 3};  // repeated ids carry equal values
  const std::vector<float> vals{7.0f, -1.0f, 2.0f, 7.0f, 7.0f};
  Graph g;
  Value av = g.input(DType::F32, {10}, "a"), iv = g.input(DType::I32, {5}, "ids"),
        vv = g.input(DType::F32, {5}, "values");
  Value y = g.scatter(av, iv, vv);
  g.mark_output(y);
  g.mark_output(av);
  fx.run(g, {{{av, test::bytes_of(a)}, {iv, test::bytes_of(ids)}, {vv, test::bytes_of(vals)}}});
  std::vector<float> want = a;
  for (size_t m = 0; m < ids.size(); ++m) want[static_cast<size_t>(ids[m])] = vals[m];
  EXPECT_EQ(fx.read_f32(g, y), want);
  // The source is untouched (a copy), and an id outside [0, N) is a run-time error naming the op.
  EXPECT_EQ(fx.read_f32(g, av), a);
  const std::vector<int32_t> bad{3, 0, 10, 1, 2};
  try {
    fx.run(g, {{{av, test::bytes_of(a)}, {iv, test::bytes_of(bad)}, {vv, test::bytes_of(vals)}}});
    ADD_FAILURE() << "an id of 10 in a [10] scatter must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Scatter"), std::string::npos) << e.what();
  }
  EXPECT_THROW(g.scatter(av, iv, g.input(DType::F32, {4}, "short")), Error);
  EXPECT_THROW(g.scatter(av, vv, vv), Error);
}

// The draw written from compute.hpp's wording with long double sums as a sanity bound, and the exact
// double form the op promises.
int32_t ref_draw(const std::vector<float>& x, const std::vector<int32_t>& ids, float u, float t, float top_p,
                 float min_p = 0.0f) {
  const double it = 1.0 / static_cast<double>(t);
  const double m = *std::max_element(x.begin(), x.end());
  std::vector<double> p(x.size());
  double sum = 0;
  for (size_t k = 0; k < x.size(); ++k) sum += p[k] = std::exp(x[k] * it - m * it);
  for (double& v : p) v /= sum;
  if (min_p > 0.0f) {
    size_t n = 1;
    while (n < p.size() && p[n] >= min_p * p[0]) ++n;
    p.resize(n);
    double kept = 0;
    for (double v : p) kept += v;
    for (double& v : p) v /= kept;
  }
  size_t keep = p.size();
  if (top_p < 1.0f) {
    double c = 0;
    for (size_t k = 0; k < p.size(); ++k)
      if ((c += p[k]) >= top_p) {
        keep = k + 1;
        break;
      }
  }
  double mass = 0;
  for (size_t k = 0; k < keep; ++k) mass += p[k];
  double c = 0;
  for (size_t k = 0; k < keep; ++k)
    if ((c += p[k]) > std::clamp(u, 0.0f, 1.0f) * mass) return ids[k];
  return ids[keep - 1];
}

struct DrawGraph {
  Graph g;
  Value x, u, ids, out;
  DrawGraph(int64_t k, float t, float top_p, float min_p = 0.0f) {
    x = g.input(DType::F32, {k}, "logits");
    u = g.input(DType::F32, {1}, "uniform");
    ids = g.input(DType::I32, {k}, "ids");
    out = g.top_p_draw(x, u, ids, t, top_p, min_p);
    g.mark_output(out);
  }
  std::unique_ptr<CompiledGraph> plan;
  const ComputeBackend* compiled_for = nullptr;
  int32_t run(ComputeBackend& be, const std::vector<float>& logits, const std::vector<int32_t>& id, float uniform) {
    if (compiled_for != &be) plan = be.compile(g), compiled_for = &be;
    plan->run({{{x, test::bytes_of(logits)}, {u, std::as_bytes(std::span<const float>(&uniform, 1))},
                {ids, test::bytes_of(id)}}});
    int32_t r = -1;
    plan->read(out, std::as_writable_bytes(std::span<int32_t>(&r, 1)));
    return r;
  }
};

TEST(SamplingOps, TopPDrawMatchesReferenceOverUniforms) {
  test::Fixture fx;
  std::mt19937 rng(5);
  int compared = 0;
  for (auto [k, t, top_p, min_p] :
       {std::tuple<int64_t, float, float, float>{1, 1.0f, 1.0f, 0.0f}, {7, 0.7f, 0.9f, 0.0f}, {50, 1.3f, 1.0f, 0.0f},
        {50, 0.3f, 0.5f, 0.0f}, {200, 1.0f, 0.95f, 0.0f}, {50, 1.0f, 1.0f, 0.05f}, {200, 0.8f, 0.9f, 0.2f},
        {7, 1.0f, 1.0f, 1.0f}}) {
    std::vector<float> x(static_cast<size_t>(k));
    std::normal_distribution<float> d(0.0f, 3.0f);
    for (float& v : x) v = d(rng);
    std::sort(x.begin(), x.end(), std::greater<>());
    std::vector<int32_t> ids(x.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(1000 + 3 * i);
    DrawGraph dg(k, t, top_p, min_p);
    for (int s = 0; s <= 256; ++s) {
      const float u = s == 256 ? 0x1.fffffep-1f : static_cast<float>(s) / 256.0f;  // 0 ... just below 1
      ASSERT_EQ(dg.run(*fx.backend, x, ids, u), ref_draw(x, ids, u, t, top_p, min_p))
          << "k " << k << " min_p " << min_p << " u " << u;
      ++compared;
    }
  }
  EXPECT_EQ(compared, 8 * 257);
}

TEST(SamplingOps, TopPDrawEdges) {
  test::Fixture fx;
  // Zero-weight candidates (logits far below the top): never drawn, even at u just below 1.
  const std::vector<float> x{2.0f, 1.0f, -1e30f, -std::numeric_limits<float>::infinity()};
  const std::vector<int32_t> ids{10, 11, 12, 13};
  DrawGraph all(4, 1.0f, 1.0f);
  for (float u : {0.0f, 0.5f, 0.99f, 0x1.fffffep-1f}) EXPECT_LT(all.run(*fx.backend, x, ids, u), 12) << u;
  EXPECT_EQ(all.run(*fx.backend, x, ids, 0.0f), 10);  // u = 0: the first candidate
  // u = 1 is outside the contract ([0, 1)): no running sum exceeds the whole mass, so the last kept
  // candidate with a nonzero weight is returned (never a zero-probability one), as the host sampler does.
  EXPECT_EQ(all.run(*fx.backend, x, ids, 1.0f), 11);
  // Exactly representable boundary: four equal logits, top_p = 0.5 keeps exactly two.
  const std::vector<float> flat(4, 0.25f);
  DrawGraph half(4, 1.0f, 0.5f);
  std::set<int32_t> seen;
  for (int s = 0; s < 1000; ++s) seen.insert(half.run(*fx.backend, flat, ids, s / 1000.0f));
  EXPECT_EQ(seen, (std::set<int32_t>{10, 11}));
  // Builder checks name the op.
  Graph g;
  Value xv = g.input(DType::F32, {4}, "x"), uv = g.input(DType::F32, {1}, "u"), iv = g.input(DType::I32, {3}, "ids");
  EXPECT_THROW(g.top_p_draw(xv, uv, iv, 1.0f, 1.0f), Error);
  Value i4 = g.input(DType::I32, {4}, "ids4");
  EXPECT_THROW(g.top_p_draw(xv, uv, i4, 0.0f, 1.0f), Error);
  EXPECT_THROW(g.top_p_draw(xv, uv, i4, 1.0f, 0.0f), Error);
  EXPECT_THROW(g.top_p_draw(xv, uv, i4, 1.0f, 1.0f, 1.5f), Error);
  EXPECT_THROW(g.top_p_draw(xv, xv, i4, 1.0f, 1.0f), Error);
  EXPECT_EQ(op_name(Op::TopPDraw), "TopPDraw");
  EXPECT_EQ(op_name(Op::Scatter), "Scatter");
}


// AcceptDrafts' builder names the operand and the shape it expected (the verdict itself is tested against
// the host engine's rule in sampler_tests, StandardSamplerDevice.SpeculativeVerdictEqualsTheHostRule).
TEST(SamplingOps, AcceptDraftsBuilderNamesTheMismatch) {
  Graph g;
  const Value p = g.input(DType::F32, {3, 10}, "p"), pt = g.input(DType::I32, {3, 4}, "pt");
  const Value q = g.input(DType::F32, {2, 10}, "q"), qt = g.input(DType::I32, {2, 4}, "qt");
  const Value d = g.input(DType::I32, {2}, "d"), u = g.input(DType::F32, {5}, "u");
  EXPECT_EQ(g.shape(g.accept_drafts(p, pt, q, qt, d, u, 0.8f, 0.9f, 0.05f)), (Shape{4}));
  auto message = [&](auto&& build) {
    try {
      build();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { g.accept_drafts(p, pt, q, qt, d, g.input(DType::F32, {4}, "u4"), 0.8f, 1.0f); })
                .find("two per draft and one for the bonus"), std::string::npos);
  EXPECT_NE(message([&] { g.accept_drafts(p, pt, p, qt, d, u, 0.8f, 1.0f); }).find("draft logits"), std::string::npos);
  EXPECT_NE(message([&] { g.accept_drafts(p, pt, q, g.input(DType::I32, {2, 11}, "wide"), d, u, 0.8f, 1.0f); })
                .find("TopK rows"), std::string::npos);
  EXPECT_NE(message([&] { g.accept_drafts(p, pt, q, qt, g.input(DType::F32, {2}, "fd"), u, 0.8f, 1.0f); })
                .find("drafts"), std::string::npos);
  EXPECT_NE(message([&] { g.accept_drafts(p, pt, q, qt, d, u, 0.0f, 1.0f); }).find("temperature"), std::string::npos);
  EXPECT_EQ(op_name(Op::AcceptDrafts), "AcceptDrafts");
}

}  // namespace
}  // namespace specula
