// Graph builder: shape and type inference of every op, and errors that name the op, the node and the
// shapes involved.
#include <gtest/gtest.h>

#include <string>

#include "specula/compute.hpp"
#include "specula/error.hpp"
#include "specula/op_profile.hpp"
#include "test_util.hpp"

namespace specula {
namespace {

// Runs `f`, expects a specula::Error, and checks its message contains every one of `parts`.
template <typename F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected a specula::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
  }
}

struct GraphTest : ::testing::Test {
  test::Fixture fx{1};
  BackendTensorPtr w(const std::string& name, Shape shape, DType type = DType::F32) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    return fx.weight(name, type, shape, test::exact_floats(static_cast<size_t>(n), 1, type));
  }
};

TEST_F(GraphTest, InfersShapesAndTypes) {
  Graph g;
  Value ids = g.input(DType::I32, {3}, "ids");
  Value pos = g.input(DType::I32, {3}, "pos");
  Value emb = g.get_rows(g.constant(w("embed", {10, 16})), ids);
  EXPECT_EQ(g.shape(emb), (Shape{3, 16}));
  EXPECT_EQ(g.node(emb).type, DType::F32);
  Value y = g.matmul(g.constant(w("proj", {8, 16}, DType::BF16)), emb);
  EXPECT_EQ(g.shape(y), (Shape{3, 8}));
  Value q = g.reshape(y, {3, 2, 4});
  EXPECT_EQ(g.shape(g.rope(q, pos, 1, 10000.0f, 4.0f)), (Shape{3, 2, 4}));
  Value kv = g.reshape(g.slice(y, 0, 4), {3, 1, 4});
  Value att = g.attention(q, kv, kv, pos, pos, 1.0f, 0, true);
  EXPECT_EQ(g.shape(att), (Shape{3, 8}));
  EXPECT_EQ(g.shape(g.concat(att, y)), (Shape{3, 16}));
  Value tk = g.top_k(y, 3);
  EXPECT_EQ(g.shape(tk), (Shape{3, 3}));
  EXPECT_EQ(g.node(tk).type, DType::I32);
  EXPECT_EQ(g.shape(g.argmax(y)), (Shape{3, 1}));
  EXPECT_EQ(g.node(g.copy(y, DType::F16)).type, DType::F16);
  Value e = g.matmul_id(g.constant(w("experts", {4, 6, 8})), g.reshape(y, {3, 1, 8}), g.input(DType::I32, {3, 2}, "sel"));
  EXPECT_EQ(g.shape(e), (Shape{3, 2, 6}));
  EXPECT_EQ(g.shape(g.mul(e, g.input(DType::F32, {3, 2, 1}, "gate"))), (Shape{3, 2, 6}));
  auto cache = fx.backend->allocate("cache", DType::F16, {5, 1, 4});
  Value wr = g.write_rows(cache, kv, g.input(DType::I32, {3}, "slots"));
  EXPECT_EQ(g.shape(wr), (Shape{5, 1, 4}));
  EXPECT_EQ(g.node(wr).type, DType::F16);
  EXPECT_EQ(g.node(wr).src[0], g.constant(cache).id) << "one Constant node per tensor";
  EXPECT_EQ(g.node(g.named(att, "blk.0.attn")).name, "blk.0.attn");
}

TEST_F(GraphTest, MatMulMismatchNamesOpNodeAndShapes) {
  Graph g;
  Value x = g.input(DType::F32, {2, 15}, "x");
  Value wq = g.constant(w("blk.0.attn_q.weight", {8, 16}));
  expect_error([&] { g.matmul(wq, x); }, {"MatMul", "'x'", "[2, 15]", "'blk.0.attn_q.weight'", "[8, 16]"});
}

TEST_F(GraphTest, BroadcastMismatch) {
  Graph g;
  Value a = g.input(DType::F32, {2, 3, 4}, "a");
  Value b = g.input(DType::F32, {3, 2}, "b");
  expect_error([&] { g.add(a, b); }, {"Add", "[3, 2]", "[2, 3, 4]", "broadcast"});
  EXPECT_EQ(g.shape(g.add(a, g.input(DType::F32, {1}, "one"))), (Shape{2, 3, 4}));
  EXPECT_EQ(g.shape(g.mul(a, g.input(DType::F32, {3, 1}, "col"))), (Shape{2, 3, 4}));
}

TEST_F(GraphTest, AttentionChecks) {
  Graph g;
  Value q = g.input(DType::F32, {2, 3, 8}, "q");
  Value k = g.input(DType::F32, {5, 2, 8}, "k");
  Value pk = g.input(DType::I32, {5}, "kpos");
  Value pq = g.input(DType::I32, {2}, "qpos");
  expect_error([&] { g.attention(q, k, k, pk, pq, 1.0f, 0, true); }, {"Attention", "query heads 3", "[2, 3, 8]", "[5, 2, 8]"});
  Value q4 = g.input(DType::F32, {2, 4, 8}, "q4");
  Value k7 = g.input(DType::F32, {5, 2, 7}, "k7");
  expect_error([&] { g.attention(q4, k7, k7, pk, pq, 1.0f, 0, true); }, {"Attention", "'k7'", "[5, 2, 7]", "head dim 8"});
  expect_error([&] { g.attention(q4, k, k, pq, pq, 1.0f, 0, true); }, {"Attention", "key positions", "'qpos'"});
  expect_error([&] { g.attention(q4, k, k, pk, pq, 1.0f, -1, true); }, {"Attention", "window -1"});
  Value kq = g.constant(w("kq", {5, 2, 8}, DType::F32));
  EXPECT_EQ(g.shape(g.attention(q4, kq, k, pk, pq, 1.0f, 4, false)), (Shape{2, 32}));
  expect_error([&] { g.attention(q4, k, k, pk, pq, 1.0f, 0, true, pk); }, {"Attention", "slots in use", "I32 [1]"});
  Value live = g.input(DType::I32, {1}, "live");
  const Value a = g.attention(q4, k, k, pk, pq, 1.0f, 0, true, live);
  EXPECT_EQ(g.node(a).src[5], live.id);
  EXPECT_EQ(g.node(g.attention(q4, k, k, pk, pq, 1.0f, 0, true)).src[5], -1);
}

TEST_F(GraphTest, OtherOpErrors) {
  Graph g;
  Value x = g.input(DType::F32, {2, 6}, "x");
  Value ids = g.input(DType::I32, {2}, "ids");
  Value fids = g.input(DType::F32, {2}, "fids");
  expect_error([&] { g.get_rows(g.constant(w("tab", {4, 6})), fids); }, {"GetRows", "'fids'", "I32"});
  expect_error([&] { g.reshape(x, {5, 2}); }, {"Reshape", "[5, 2]", "[2, 6]", "12"});
  expect_error([&] { g.slice(x, 4, 3); }, {"Slice", "[4, 7)", "[2, 6]"});
  expect_error([&] { g.concat(x, g.input(DType::F32, {3, 6}, "y")); }, {"Concat", "[2, 6]", "[3, 6]"});
  expect_error([&] { g.top_k(x, 7); }, {"TopK", "k = 7", "[2, 6]"});
  expect_error([&] { g.rms_norm(x, g.constant(w("norm", {5})), 1e-6f); }, {"RmsNorm", "'norm'", "[5]", "6"});
  expect_error([&] { g.rope(g.reshape(x, {2, 2, 3}), ids, 1, 1e4f, 3.0f); }, {"Rope", "even"});
  expect_error([&] { g.rope(g.reshape(x, {2, 1, 6}), ids, 4, 1e4f, 6.0f); }, {"Rope", "rotated_pairs 4", "D/2 = 3"});
  expect_error([&] { g.softcap(x, 0.0f); }, {"Softcap", "cap 0"});
  expect_error([&] { g.copy(x, DType::Q8_0); }, {"Copy", "Q8_0"});
  expect_error([&] { g.matmul_id(g.constant(w("ex", {3, 4, 6})), g.reshape(x, {2, 1, 6}), g.input(DType::I32, {3, 2}, "sel")); },
               {"MatMulId", "'sel'", "[3, 2]"});
  auto cache = fx.backend->allocate("kcache", DType::F16, {4, 5});
  expect_error([&] { g.write_rows(cache, x, ids); }, {"WriteRows", "kcache", "[2, 6]", "5 values per row"});
  expect_error([&] { g.matmul(g.constant(w("w", {3, 6})), Value{}); }, {"MatMul", "'x' is missing"});
  expect_error([&] { g.node(Value{99}); }, {"#99"});
  expect_error([&] { g.input(DType::Q4_K, {2}, "bad"); }, {"Input", "'bad'", "Q4_K"});
}

TEST_F(GraphTest, MarkOutputOnce) {
  Graph g;
  Value x = g.input(DType::F32, {2}, "x");
  Value y = g.scale(x, 2.0f);
  g.mark_output(y);
  g.mark_output(y);
  EXPECT_EQ(g.outputs().size(), 1u);
  EXPECT_EQ(op_name(Op::Attention), "Attention");
}

// The profile keeps each graph kind's first run apart (it pays one-time costs: weight packing, the first
// touch of new buffers) and averages the runs after it; a kind run once is reported from that run, saying so.
TEST_F(GraphTest, ProfileLeavesOutEachKindsFirstRun) {
  auto product = [&](int64_t rows) {
    Graph g;
    Value y = g.matmul(g.constant(w("blk.0.ffn_up.weight", {8, 16})), g.input(DType::F32, {rows, 16}, "x"));
    g.mark_output(y);
    return std::pair{std::move(g), y};
  };
  const auto [three, y3] = product(3);
  const auto [one, y1] = product(1);
  OpProfile p;
  for (double seconds : {1.0, 0.002, 0.004}) {  // a first run of 1 s, then 2 and 4 ms
    p.begin_run(three);
    p.record(three, y3.id, seconds, "blk.0.ffn_up.weight", 6000000);  // 2 GB/s after the first run
  }
  p.begin_run(one);
  p.record(one, y1.id, 0.005, "blk.0.ffn_up.weight", 6000000);
  const std::string report = p.report();
  for (const char* want : {"with 3 activation rows (2 runs after the first, 3.000 ms per run; the first, left out: 1000.000 ms)",
                           "with 1 activation row (1 run, 5.000 ms: its first, one-time costs included)",
                           "\n  MatMul                               1       3.000   100.0       2.0\n",
                           "\n  blk.*.ffn_up.weight                  1       3.000   100.0       2.0\n"})
    EXPECT_NE(report.find(want), std::string::npos) << "missing '" << want << "' in:\n" << report;
}

}  // namespace
}  // namespace specula
