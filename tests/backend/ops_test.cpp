// Every op of the CPU backend against a naive reference written here (double precision, plain loops).
// Tolerances: F32 math is compared at a few ulps of the result scale (abs 1e-5..1e-4 plus rel 1e-5);
// weights are generated exactly representable in their storage type, so F16/BF16 weights get the
// same tolerance as F32.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <vector>
#include <chrono>
#include <thread>
#include <cmath>
#include <cstring>
#include <limits>
#include <mutex>
#include <numeric>
#include <random>

#include "specula/error.hpp"
#include "test_util.hpp"
#include "kernels.hpp"
#include "thread_pool.hpp"

namespace specula {
namespace {

using test::expect_close;

std::vector<double> ref_matmul(const std::vector<float>& w, const std::vector<float>& x, int64_t O, int64_t I) {
  const int64_t N = static_cast<int64_t>(x.size()) / I;
  std::vector<double> y(static_cast<size_t>(N * O));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) {
      double s = 0;
      for (int64_t i = 0; i < I; ++i) s += double(w[o * I + i]) * x[n * I + i];
      y[n * O + o] = s;
    }
  return y;
}

class MatMulTypes : public ::testing::TestWithParam<DType> {};

TEST_P(MatMulTypes, MatchesReference) {
  const DType type = GetParam();
  test::Fixture fx;
  // N = 20 on a matrix of 2^20 values runs the tiled oneDNN GEMM path (gemm_min_rows, kGemmMinElements),
  // the others the float kernels.
  for (auto [O, I, N] : {std::tuple<int64_t, int64_t, int64_t>{37, 64, 1}, {19, 36, 3}, {64, 256, 3}, {70, 72, 20},
                         {1024, 1024, 20}}) {
    auto w = test::exact_floats(static_cast<size_t>(O * I), 7, type);
    auto x = test::random_floats(static_cast<size_t>(N * I), 8);
    Graph g;
    Value xv = g.input(DType::F32, {N, I}, "x");
    Value y = g.matmul(g.constant(fx.weight("w", type, {O, I}, w)), xv);
    g.mark_output(y);
    fx.run(g, {{{xv, test::bytes_of(x)}}});
    // F32 sums of I products round by about 1e-6 sqrt(I) here (random values in [-1, 1]).
    const double tol = std::max(1e-5, 1e-6 * std::sqrt(double(I)));
    expect_close(fx.read_f32(g, y), ref_matmul(w, x, O, I), tol, 1e-5, "matmul " + std::string(dtype_name(type)));
  }
}
INSTANTIATE_TEST_SUITE_P(Float, MatMulTypes, ::testing::Values(DType::F32, DType::F16, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Quantized weights: the matmul must equal "dequantize with the SDK codec, then multiply in F32".
class QuantMatMul : public ::testing::TestWithParam<DType> {};

TEST_P(QuantMatMul, EqualsDequantizeThenMatMul) {
  const DType type = GetParam();
  test::Fixture fx;
  // N = 17 exceeds gemm_min_rows for types without a fused kernel (the GEMM for a matrix of 2^20 values,
  // the kernel for a small one); N = 7 exercises a remainder of the fused kernels' four-row blocking.
  for (auto [O, I, N] : {std::tuple<int64_t, int64_t, int64_t>{13, 256, 1}, {70, 512, 4}, {9, 768, 17}, {21, 256, 7},
                         {1024, 1024, 17}}) {
    auto w = test::random_floats(static_cast<size_t>(O * I), 21);
    const size_t rb = *dtype_row_bytes(type, static_cast<uint64_t>(I));
    std::vector<std::byte> packed(rb * static_cast<size_t>(O));
    std::vector<float> deq(w.size());
    for (int64_t o = 0; o < O; ++o) {
      quantize_row(type, w.data() + o * I, packed.data() + o * rb, I);
      dequantize_row(type, packed.data() + o * rb, deq.data() + o * I, I);
    }
    auto wt = fx.weight("wq", type, {O, I}, std::move(packed));
    // Two activations: random ones, and ones exactly representable as 8-bit codes times 2^-7 per
    // 32-value block (one code at 127 per block), which a kernel that quantizes activations to 8 bits
    // reproduces exactly.
    auto x = test::random_floats(static_cast<size_t>(N * I), 22);
    auto xe = test::random_floats(static_cast<size_t>(N * I), 23);
    for (size_t i = 0; i < xe.size(); ++i) xe[i] = (i % 32 == 5 ? 127.0f : std::round(xe[i] * 127.0f)) / 128.0f;
    for (bool exact : {false, true}) {
      const auto& xv_data = exact ? xe : x;
      Graph g;
      Value xv = g.input(DType::F32, {N, I}, "x");
      Value y = g.matmul(g.constant(wt), xv);
      g.mark_output(y);
      fx.run(g, {{{xv, test::bytes_of(xv_data)}}});
      // Exact activations: F32 rounding only. Random activations: kernels that quantize them to 8 bits
      // per 32 values (as llama.cpp does) add rounding noise of std sqrt(I) * rms(w) * (1/127)/sqrt(12)
      // ~= 0.0013 sqrt(I) for w, x uniform in [-1, 1]; the tolerance is 5 of those.
      const double tol = exact ? 2e-5 * std::sqrt(double(I)) : 0.0065 * std::sqrt(double(I));
      expect_close(fx.read_f32(g, y), ref_matmul(deq, xv_data, O, I), tol, 1e-5,
                   std::string(dtype_name(type)) + (exact ? " exact-x" : " random-x") + " matmul O=" +
                       std::to_string(O) + " N=" + std::to_string(N));
    }
  }
}
INSTANTIATE_TEST_SUITE_P(Blocks, QuantMatMul,
                         ::testing::Values(DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                                           DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

TEST(Ops, MlxAffineMatMulAndGetRows) {
  test::Fixture fx;
  const int64_t O = 6, I = 128;
  const MlxRowParams p{4, 64, DType::BF16};
  auto w = test::random_floats(static_cast<size_t>(O * I), 31);
  const size_t packed_row = I * p.bits / 8, scale_row = (I / p.group_size) * 2;
  auto packed = std::make_shared<std::vector<std::byte>>(packed_row * O);
  auto scales = std::make_shared<std::vector<std::byte>>(scale_row * O);
  auto biases = std::make_shared<std::vector<std::byte>>(scale_row * O);
  std::vector<float> deq(w.size());
  for (int64_t o = 0; o < O; ++o) {
    mlx_quantize_row(p, w.data() + o * I, I, packed->data() + o * packed_row, scales->data() + o * scale_row,
                     biases->data() + o * scale_row);
    mlx_dequantize_row(p, packed->data() + o * packed_row, scales->data() + o * scale_row,
                       biases->data() + o * scale_row, deq.data() + o * I, I);
  }
  fx.storage.insert(fx.storage.end(), {packed, scales, biases});
  TensorInfo info;
  info.name = "mlx";
  info.type = DType::MLX_AFFINE;
  info.shape = {O, I};
  info.data = std::span<const std::byte>(*packed);
  info.quant = {p.bits, p.group_size, p.scale_type, std::span<const std::byte>(*scales), std::span<const std::byte>(*biases)};
  auto wt = fx.backend->load_weight(info);
  auto x = test::random_floats(2 * I, 32);
  std::vector<int32_t> ids{5, 2};
  Graph g;
  Value xv = g.input(DType::F32, {2, I}, "x");
  Value iv = g.input(DType::I32, {2}, "ids");
  Value y = g.matmul(g.constant(wt), xv);
  Value rows = g.get_rows(g.constant(wt), iv);
  g.mark_output(y);
  g.mark_output(rows);
  fx.run(g, {{{xv, test::bytes_of(x)}, {iv, test::bytes_of(ids)}}});
  // The CPU backend packs 4-bit MLX weights and multiplies them with activations rounded to 8 bits per 32
  // values (as for the GGUF types): each product may be off by what that rounding moves, at most
  // sum |w| * (the block's largest |x|) / 254, and by float rounding.
  const std::vector<float> got = fx.read_f32(g, y);
  const std::vector<double> exact = ref_matmul(deq, x, O, I);
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t o = 0; o < O; ++o) {
      double bound = 1e-4 * (1 + std::abs(exact[r * O + o]));
      for (int64_t c = 0; c < I; ++c) {
        float amax = 0;
        for (int64_t k = c / 32 * 32; k < c / 32 * 32 + 32; ++k) amax = std::max(amax, std::abs(x[r * I + k]));
        bound += std::abs(deq[o * I + c]) * amax / 254;
      }
      EXPECT_NEAR(got[r * O + o], exact[r * O + o], bound) << "MLX matmul, row " << r << " output " << o;
    }
  std::vector<double> want;
  for (int32_t id : ids)
    for (int64_t c = 0; c < I; ++c) want.push_back(deq[id * I + c]);
  expect_close(fx.read_f32(g, rows), want, 0, 0, "MLX get_rows");

  info.quant.scales = info.quant.scales.first(scale_row);
  try {
    fx.backend->load_weight(info);
    ADD_FAILURE() << "short scales must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'mlx'"), std::string::npos) << e.what();
  }
}

TEST(Ops, MatMulBatchedLeadingAxes) {
  test::Fixture fx;
  const int64_t O = 5, I = 8;
  auto w = test::random_floats(O * I, 1);
  auto x = test::random_floats(2 * 3 * I, 2);
  Graph g;
  Value xv = g.input(DType::F32, {2, 3, I}, "x");
  Value y = g.matmul(g.constant(fx.weight("w", DType::F32, {O, I}, w)), xv);
  EXPECT_EQ(g.shape(y), (Shape{2, 3, O}));
  g.mark_output(y);
  fx.run(g, {{{xv, test::bytes_of(x)}}});
  expect_close(fx.read_f32(g, y), ref_matmul(w, x, O, I), 1e-5, 1e-5, "batched matmul");
}

TEST(Ops, GetRowsAnyType) {
  for (DType type : {DType::F32, DType::F16, DType::BF16}) {
    test::Fixture fx;
    const int64_t R = 11, C = 24;
    auto table = test::exact_floats(R * C, 3, type);
    std::vector<int32_t> ids{4, 0, 10, 4};
    Graph g;
    Value iv = g.input(DType::I32, {4}, "ids");
    Value rows = g.get_rows(g.constant(fx.weight("table", type, {R, C}, table)), iv);
    g.mark_output(rows);
    fx.run(g, {{{iv, test::bytes_of(ids)}}});
    std::vector<double> want;
    for (int32_t id : ids)
      for (int64_t c = 0; c < C; ++c) want.push_back(table[id * C + c]);
    expect_close(fx.read_f32(g, rows), want, 0, 0, "get_rows");

    std::vector<int32_t> bad{3, 11, 0, 0};
    try {
      fx.run(g, {{{iv, test::bytes_of(bad)}}});
      ADD_FAILURE() << "an id past the table must fail";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("id 11"), std::string::npos) << e.what();
    }
  }
}

// An I32 table gives I32 rows, from a constant or a computed value (a drafter maps a candidate index to a
// vocab id so); an id outside the table fails naming it.
TEST(Ops, GetRowsOfIdsStaysI32) {
  test::Fixture fx;
  const std::vector<int32_t> table{10, 11, 12, 20, 21, 22, 30, 31, 32, 40, 41, 42};  // [4, 3]
  auto t = fx.backend->allocate("ordering", DType::I32, {4, 3});
  fx.backend->write(*t, test::bytes_of(table));
  Graph g;
  Value iv = g.input(DType::I32, {2}, "ids");
  Value rows = g.get_rows(g.constant(t), iv);                                  // [2, 3]
  EXPECT_EQ(g.node(rows).type, DType::I32);
  Value one = g.input(DType::I32, {1}, "one");
  Value picked = g.get_rows(g.reshape(rows, {6, 1}), one);                   // computed table
  g.mark_output(rows);
  g.mark_output(picked);
  const std::vector<int32_t> ids{3, 1}, at{4};
  fx.run(g, {{{iv, test::bytes_of(ids)}, {one, test::bytes_of(at)}}});
  EXPECT_EQ(fx.read_i32(g, rows), (std::vector<int32_t>{40, 41, 42, 20, 21, 22}));
  EXPECT_EQ(fx.read_i32(g, picked), (std::vector<int32_t>{21}));
  const std::vector<int32_t> bad{0, 4};
  try {
    fx.run(g, {{{iv, test::bytes_of(bad)}, {one, test::bytes_of(at)}}});
    ADD_FAILURE() << "an id past the table must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("id 4"), std::string::npos) << e.what();
  }
}

TEST(Ops, MatMulIdSharedAndPerSlotInputs) {
  test::Fixture fx;
  const int64_t E = 4, O = 6, I = 16, N = 3, K = 2;
  auto experts = test::exact_floats(E * O * I, 5, DType::BF16);
  auto wt = fx.weight("experts", DType::BF16, {E, O, I}, experts);
  std::vector<int32_t> ids{3, 1, 0, 3, 2, 2};
  for (bool shared : {true, false}) {
    const int64_t xk = shared ? 1 : K;
    auto x = test::random_floats(N * xk * I, 6);
    Graph g;
    Value xv = g.input(DType::F32, {N, xk, I}, "x");
    Value iv = g.input(DType::I32, {N, K}, "ids");
    Value y = g.matmul_id(g.constant(wt), xv, iv);
    g.mark_output(y);
    fx.run(g, {{{xv, test::bytes_of(x)}, {iv, test::bytes_of(ids)}}});
    std::vector<double> want;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const int64_t e = ids[n * K + k];
        const float* xr = x.data() + (n * xk + (shared ? 0 : k)) * I;
        for (int64_t o = 0; o < O; ++o) {
          double s = 0;
          for (int64_t i = 0; i < I; ++i) s += double(experts[(e * O + o) * I + i]) * xr[i];
          want.push_back(s);
        }
      }
    expect_close(fx.read_f32(g, y), want, 1e-5, 1e-5, shared ? "matmul_id shared x" : "matmul_id per-slot x");
  }
}

TEST(Ops, AddMulBroadcast) {
  test::Fixture fx;
  const Shape as{2, 3, 4};
  auto a = test::random_floats(24, 1);
  for (Shape bs : {Shape{2, 3, 4}, Shape{4}, Shape{1}, Shape{3, 1}, Shape{2, 3, 1}, Shape{2, 1, 4}}) {
    int64_t bn = 1;
    for (auto d : bs) bn *= d;
    auto b = test::random_floats(static_cast<size_t>(bn), 2);
    for (Op op : {Op::Add, Op::Mul}) {
      Graph g;
      Value av = g.input(DType::F32, as, "a");
      Value bv = g.input(DType::F32, bs, "b");
      Value y = op == Op::Add ? g.add(av, bv) : g.mul(av, bv);
      g.mark_output(y);
      fx.run(g, {{{av, test::bytes_of(a)}, {bv, test::bytes_of(b)}}});
      std::vector<double> want;
      for (int64_t i = 0; i < 2; ++i)
        for (int64_t j = 0; j < 3; ++j)
          for (int64_t k = 0; k < 4; ++k) {
            // b index: right-aligned, broadcast axes read index 0.
            const int64_t idx[3] = {i, j, k};
            int64_t off = 0;
            for (size_t d = 0; d < bs.size(); ++d) {
              const int64_t ad = 3 - static_cast<int64_t>(bs.size()) + static_cast<int64_t>(d);
              off = off * bs[d] + (bs[d] == 1 ? 0 : idx[ad]);
            }
            const double av_ = a[(i * 3 + j) * 4 + k], bv_ = b[static_cast<size_t>(off)];
            want.push_back(op == Op::Add ? av_ + bv_ : av_ * bv_);
          }
      expect_close(fx.read_f32(g, y), want, 1e-7, 1e-6, std::string(op_name(op)) + " with b " + std::to_string(bs.size()) + "-d");
    }
  }
}

TEST(Ops, MulByBf16Weight) {
  test::Fixture fx;
  auto a = test::random_floats(12, 1);
  auto s = test::exact_floats(1, 2, DType::BF16);
  Graph g;
  Value av = g.input(DType::F32, {3, 4}, "a");
  Value y = g.mul(av, g.constant(fx.weight("layer_scalar", DType::BF16, {1}, s)));
  g.mark_output(y);
  fx.run(g, {{{av, test::bytes_of(a)}}});
  std::vector<double> want;
  for (float v : a) want.push_back(double(v) * s[0]);
  expect_close(fx.read_f32(g, y), want, 1e-7, 1e-6, "mul by bf16 scalar");
}

// The vectorised tanh (gelu_tanh, softcap) over a dense range, both sides of its 0.625 switch and into
// saturation: within 3 ulp-ish (4e-7 relative) of double precision, plus a tiny absolute term near 0.
TEST(Ops, TanhOpsDenseRange) {
  test::Fixture fx;
  const int64_t N = 20001;
  std::vector<float> x(N);
  for (int64_t i = 0; i < N; ++i) x[static_cast<size_t>(i)] = -25.0f + 50.0f * static_cast<float>(i) / (N - 1);
  Graph g;
  Value xv = g.input(DType::F32, {N}, "x");
  Value ge = g.gelu_tanh(xv);
  Value cap = g.softcap(xv, 30.0f);
  g.mark_output(ge);
  g.mark_output(cap);
  fx.run(g, {{{xv, test::bytes_of(x)}}});
  std::vector<double> w_ge, w_cap;
  for (float f : x) {
    const double v = f;
    w_ge.push_back(0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))));
    w_cap.push_back(30.0 * std::tanh(v / 30.0));
  }
  // Vulkan specifies tanh, exp and division to a few ulp each (the CPU's are within one): four times the
  // bounds there.
  const double k = test::on_vulkan() ? 4.0 : 1.0;
  expect_close(fx.read_f32(g, ge), w_ge, k * 1e-7, k * 4e-7, "gelu_tanh dense");
  expect_close(fx.read_f32(g, cap), w_cap, k * 1e-7, k * 4e-7, "softcap dense");
}

TEST(Ops, UnaryOps) {
  test::Fixture fx;
  const int64_t R = 3, C = 37;
  auto x = test::random_floats(R * C, 9, -4.0f, 4.0f);
  auto nw = test::exact_floats(C, 10, DType::BF16);
  auto normw = fx.weight("norm", DType::BF16, {C}, nw);
  Graph g;
  Value xv = g.input(DType::F32, {R, C}, "x");
  Value sc = g.scale(xv, 0.25f);
  Value ge = g.gelu_tanh(xv);
  Value cap = g.softcap(xv, 3.0f);
  Value sm = g.softmax(xv);
  Value rn = g.rms_norm(xv, Value{}, 1e-6f);
  Value rw = g.rms_norm(xv, g.constant(normw), 1e-6f);
  for (Value v : {sc, ge, cap, sm, rn, rw}) g.mark_output(v);
  fx.run(g, {{{xv, test::bytes_of(x)}}});
  std::vector<double> w_sc, w_ge, w_cap, w_sm, w_rn, w_rw;
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x.data() + r * C;
    double mx = -1e300, sum = 0, ss = 0;
    for (int64_t c = 0; c < C; ++c) mx = std::max(mx, double(xr[c]));
    for (int64_t c = 0; c < C; ++c) sum += std::exp(double(xr[c]) - mx), ss += double(xr[c]) * xr[c];
    const double inv = 1.0 / std::sqrt(ss / C + 1e-6);
    for (int64_t c = 0; c < C; ++c) {
      const double v = xr[c];
      w_sc.push_back(v * 0.25);
      w_ge.push_back(0.5 * v * (1 + std::tanh(std::sqrt(2 / M_PI) * (v + 0.044715 * v * v * v))));
      w_cap.push_back(3.0 * std::tanh(v / 3.0));
      w_sm.push_back(std::exp(v - mx) / sum);
      w_rn.push_back(v * inv);
      w_rw.push_back(v * inv * nw[static_cast<size_t>(c)]);
    }
  }
  expect_close(fx.read_f32(g, sc), w_sc, 0, 1e-7, "scale");
  expect_close(fx.read_f32(g, ge), w_ge, 1e-6, 1e-5, "gelu_tanh");
  expect_close(fx.read_f32(g, cap), w_cap, 1e-6, 1e-5, "softcap");
  expect_close(fx.read_f32(g, sm), w_sm, 1e-7, 1e-5, "softmax");
  expect_close(fx.read_f32(g, rn), w_rn, 1e-6, 1e-5, "rms_norm");
  expect_close(fx.read_f32(g, rw), w_rw, 1e-6, 1e-5, "rms_norm with bf16 weight");
}

// RoPE reference: rotate_half on the full head dim, inv_freq zero past `pairs` (the proportional
// scheme of Gemma 4 full layers when pairs < D/2).
std::vector<double> ref_rope(const std::vector<float>& x, const std::vector<int32_t>& pos, int64_t H, int64_t D,
                             int64_t pairs, double theta, double divisor, double fscale) {
  const int64_t T = static_cast<int64_t>(pos.size()), half = D / 2;
  std::vector<double> y(x.begin(), x.end());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t k = 0; k < half; ++k) {
        const double inv = k < pairs ? fscale * std::pow(theta, -2.0 * k / divisor) : 0.0;
        const double a = pos[t] * inv;
        const double x0 = x[(t * H + h) * D + k], x1 = x[(t * H + h) * D + k + half];
        y[(t * H + h) * D + k] = x0 * std::cos(a) - x1 * std::sin(a);
        y[(t * H + h) * D + k + half] = x1 * std::cos(a) + x0 * std::sin(a);
      }
  return y;
}

TEST(Ops, RopeStandardAndProportional) {
  test::Fixture fx;
  const int64_t H = 3, D = 16;
  std::vector<int32_t> pos{0, 1, 7, 130, 4000};
  const int64_t T = static_cast<int64_t>(pos.size());
  auto x = test::random_floats(T * H * D, 4);
  struct Case { int64_t pairs; float theta, divisor, fscale; };
  for (Case c : {Case{8, 10000.0f, 16.0f, 1.0f}, Case{2, 1e6f, 16.0f, 1.0f}, Case{8, 10000.0f, 16.0f, 0.25f}, Case{0, 1e4f, 16.0f, 1.0f}}) {
    Graph g;
    Value xv = g.input(DType::F32, {T, H, D}, "x");
    Value pv = g.input(DType::I32, {T}, "pos");
    Value y = g.rope(xv, pv, c.pairs, c.theta, c.divisor, c.fscale);
    g.mark_output(y);
    fx.run(g, {{{xv, test::bytes_of(x)}, {pv, test::bytes_of(pos)}}});
    // F32 angles at position 4000 carry ~4000 * 2^-24 rad of error, as in the F32 reference
    // implementations; hence 1e-3 absolute.
    expect_close(fx.read_f32(g, y), ref_rope(x, pos, H, D, c.pairs, c.theta, c.divisor, c.fscale), 1e-3, 0,
                 "rope pairs=" + std::to_string(c.pairs));
  }
}

// The backend keeps RoPE's angles by rotation and position; kept ones, and ones computed again after the
// tables were cleared at their bound, are the bits of freshly computed ones.
TEST(Ops, RopeTablesKeepTheBitsOfFreshAngles) {
  const cpu::RopeTables::Rotation local{1e4f, 256.0f, 1.0f, 128}, global{1e6f, 512.0f, 1.0f, 64};
  cpu::RopeTables kept;
  std::vector<int32_t> many(6000);
  std::iota(many.begin(), many.end(), 0);
  std::vector<const float*> out(many.size());
  kept.lookup(local, many.data(), 6000, out.data());
  kept.lookup(global, many.data(), 6000, out.data());
  std::iota(many.begin(), many.end(), 6000);
  kept.lookup(local, many.data(), 6000, out.data());  // past 8192 positions: cleared first
  for (const auto& r : {local, global}) {
    const std::vector<int32_t> pos{3, 11999, 5999, 3, 70000};
    std::vector<const float*> a(pos.size()), b(pos.size());
    kept.lookup(r, pos.data(), static_cast<int64_t>(pos.size()), a.data());
    cpu::RopeTables fresh;
    fresh.lookup(r, pos.data(), static_cast<int64_t>(pos.size()), b.data());
    for (size_t t = 0; t < pos.size(); ++t)
      EXPECT_EQ(std::memcmp(a[t], b[t], static_cast<size_t>(2 * r.pairs) * 4), 0) << "position " << pos[t];
    EXPECT_EQ(a[0], a[3]) << "a position repeated within one lookup shares its table";
  }
}

// Attention reference: explicit mask from positions, softmax in double.
struct AttCase {
  int64_t T, S, Hq, Hkv, D, Dv;
  int64_t window;
  bool causal;
  std::vector<int32_t> kpos, qpos;
  int32_t in_use = -1;  // >= 0: Op::Attention's slots in use (src5); slots past it are not read
};

std::vector<double> ref_attention(const AttCase& c, const std::vector<float>& q, const std::vector<float>& k,
                                  const std::vector<float>& v, float scale) {
  std::vector<double> out(static_cast<size_t>(c.T * c.Hq * c.Dv), 0.0);
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t h = 0; h < c.Hq; ++h) {
      const int64_t hk = h * c.Hkv / c.Hq;  // repeat_interleave of KV heads
      std::vector<double> sc;
      std::vector<int64_t> slots;
      const int64_t live = c.in_use >= 0 ? std::min<int64_t>(c.in_use, c.S) : c.S;
      for (int64_t s = 0; s < live; ++s) {
        const int64_t kp = c.kpos[s], qp = c.qpos[t];
        if (kp < 0) continue;
        if (c.causal && kp > qp) continue;
        if (c.window > 0 && (qp - kp >= c.window || kp - qp >= c.window)) continue;
        double d = 0;
        for (int64_t i = 0; i < c.D; ++i) d += double(q[(t * c.Hq + h) * c.D + i]) * k[(s * c.Hkv + hk) * c.D + i];
        sc.push_back(d * scale);
        slots.push_back(s);
      }
      if (sc.empty()) continue;
      const double mx = *std::max_element(sc.begin(), sc.end());
      double sum = 0;
      for (auto& e : sc) sum += (e = std::exp(e - mx));
      for (size_t j = 0; j < sc.size(); ++j)
        for (int64_t d = 0; d < c.Dv; ++d)
          out[(t * c.Hq + h) * c.Dv + d] += sc[j] / sum * v[(slots[j] * c.Hkv + hk) * c.Dv + d];
    }
  return out;
}

void check_attention(const AttCase& c, DType kv_type, const std::string& what) {
  test::Fixture fx;
  auto q = test::random_floats(c.T * c.Hq * c.D, 11, -2.0f, 2.0f);
  auto k = test::exact_floats(c.S * c.Hkv * c.D, 12, kv_type);
  auto v = test::exact_floats(c.S * c.Hkv * c.Dv, 13, kv_type);
  const float scale = 0.7f;
  // K and V as a persistent cache tensor (the usual case), written through write().
  auto kc = fx.backend->allocate("k_cache", kv_type, {c.S, c.Hkv, c.D});
  auto vc = fx.backend->allocate("v_cache", kv_type, {c.S, c.Hkv, c.Dv});
  fx.backend->write(*kc, test::bytes_of(k));
  fx.backend->write(*vc, test::bytes_of(v));
  Graph g;
  Value qv = g.input(DType::F32, {c.T, c.Hq, c.D}, "q");
  Value kp = g.input(DType::I32, {c.S}, "kpos");
  Value qp = g.input(DType::I32, {c.T}, "qpos");
  const std::vector<int32_t> in_use{c.in_use};
  Value live = c.in_use >= 0 ? g.input(DType::I32, {1}, "in_use") : Value{};
  Value y = g.attention(qv, g.constant(kc), g.constant(vc), kp, qp, scale, c.window, c.causal, live);
  g.mark_output(y);
  RunInputs in{{{qv, test::bytes_of(q)}, {kp, test::bytes_of(c.kpos)}, {qp, test::bytes_of(c.qpos)}}};
  if (live) in.inputs.emplace_back(live, test::bytes_of(in_use));
  fx.run(g, in);
  expect_close(fx.read_f32(g, y), ref_attention(c, q, k, v, scale), 2e-6, 1e-5, what);
}

TEST(Attention, RingBufferCacheOutOfOrderWithEmptySlots) {
  // A ring of 8 slots after 11 tokens: slot s holds position p with p % 8 == s; one slot still empty
  // in a second case.
  AttCase c{1, 8, 4, 2, 16, 16, 0, true, {8, 9, 10, 3, 4, 5, 6, 7}, {10}};
  check_attention(c, DType::F32, "ring buffer, decode");
  c.kpos = {8, -1, 2, 3, -1, 5, 6, 7};
  c.qpos = {8};
  check_attention(c, DType::F32, "ring buffer with empty slots");
}

TEST(Attention, SlidingWindowCausalPrefill) {
  // 6 new tokens at positions 4..9 over a cache holding 0..9 in shuffled slots; window 3.
  AttCase c{6, 10, 2, 1, 8, 8, 3, true, {5, 0, 9, 2, 7, 4, 1, 8, 3, 6}, {4, 5, 6, 7, 8, 9}};
  check_attention(c, DType::F32, "sliding window 3");
  c.window = 1;  // each query sees only itself
  check_attention(c, DType::F32, "sliding window 1");
}

TEST(Attention, GqaAndValueWidth) {
  AttCase c{3, 5, 8, 2, 32, 24, 0, true, {0, 1, 2, 3, 4}, {2, 3, 4}};
  check_attention(c, DType::F32, "GQA 8/2, Dv != D");
}

TEST(Attention, Bidirectional) {
  AttCase c{4, 6, 2, 2, 8, 8, 0, false, {0, 1, 2, 3, 4, 5}, {0, 1, 2, 3}};
  check_attention(c, DType::F32, "bidirectional");
  c.window = 2;
  check_attention(c, DType::F32, "bidirectional window 2");
}

TEST(Attention, F16AndBf16Caches) {
  AttCase c{2, 7, 4, 1, 16, 16, 4, true, {3, 4, 5, 6, 0, 1, 2}, {5, 6}};
  check_attention(c, DType::F16, "F16 cache");
  check_attention(c, DType::BF16, "BF16 cache");
}

TEST(Attention, ReadsOnlyTheSlotsInUse) {
  // Slots 6..9 hold positions a bidirectional query would see: with 6 slots in use they must not count.
  AttCase c{2, 10, 4, 2, 16, 16, 0, false, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {4, 5}, 6};
  check_attention(c, DType::F32, "6 of 10 slots in use");
  c.in_use = 40;  // more than the slots: all of them
  check_attention(c, DType::F32, "in use past the end");
  c.in_use = 0;  // none: zeros
  check_attention(c, DType::F16, "no slot in use");
}

// Attention of T query rows at once (a verification, a prompt chunk: the rows of a block share each cache
// row's load) against each row alone on one thread with the AVX2 set (a decode step's values), bit for bit,
// on every instruction set and 1, 2 and 3 threads; the ring-buffer slots, windows and head groups of Gemma 4's
// layers (8 query heads a KV head, 2 a KV head; D a multiple of 16 or of 8 only). The kernels directly: the
// Vulkan backend runs the Attention.* suite and promises no such thing.
TEST(AttentionKernel, RowsTogetherGiveEachRowsBits) {
  struct Case {
    int64_t T, S, Hq, Hkv, D, window;
    DType kv;
  };
  const std::vector<Case> cases{{9, 40, 8, 1, 64, 0, DType::F32},  {5, 40, 16, 8, 40, 0, DType::F16},
                                {9, 40, 8, 2, 24, 6, DType::BF16}, {20, 30, 4, 1, 16, 7, DType::F32},
                                {3, 12, 2, 2, 8, 2, DType::F32},   {1, 33, 8, 1, 48, 0, DType::F16}};
  cpu::ThreadPool one(1), two(2), three(3);
  const cpu::KernelSet& avx2 = cpu::select_kernels("avx2");
  for (const Case& c : cases) {
    const std::string what = fmt::format("T {} Hq {} Hkv {} D {} window {}", c.T, c.Hq, c.Hkv, c.D, c.window);
    const auto q = test::random_floats(c.T * c.Hq * c.D, 21, -2.0f, 2.0f);
    const auto k = test::encode(test::exact_floats(c.S * c.Hkv * c.D, 22, c.kv), c.kv);
    const auto v = test::encode(test::exact_floats(c.S * c.Hkv * c.D, 23, c.kv), c.kv);
    // A ring of S slots after S + 5 tokens, one slot still empty: the T new rows are the last positions.
    std::vector<int32_t> kpos(static_cast<size_t>(c.S)), qpos(static_cast<size_t>(c.T));
    const int32_t last = static_cast<int32_t>(c.S + 4);
    for (int64_t s = 0; s < c.S; ++s) kpos[static_cast<size_t>(s)] = last - static_cast<int32_t>((last - s) % c.S);
    kpos[3] = -1;
    for (int64_t t = 0; t < c.T; ++t) qpos[static_cast<size_t>(t)] = last - static_cast<int32_t>(c.T - 1 - t);
    auto run = [&](cpu::ThreadPool& pool, const cpu::KernelSet& set, int64_t t0, int64_t rows) {
      cpu::AttentionArgs a{};
      a.q = q.data() + t0 * c.Hq * c.D;
      a.k = k.data();
      a.v = v.data();
      a.k_type = a.v_type = c.kv;
      a.key_pos = kpos.data();
      a.query_pos = qpos.data() + t0;
      a.T = rows;
      a.S = c.S;
      a.Hq = c.Hq;
      a.Hkv = c.Hkv;
      a.D = a.Dv = c.D;
      a.scale = 0.3f;
      a.window = c.window;
      a.causal = true;
      std::vector<float> out(static_cast<size_t>(rows * c.Hq * c.D), -1.0f);
      cpu::attention(pool, set, a, out.data());
      return out;
    };
    std::vector<float> alone;
    for (int64_t t = 0; t < c.T; ++t) {
      const auto row = run(one, avx2, t, 1);
      alone.insert(alone.end(), row.begin(), row.end());
    }
    for (cpu::Isa isa : cpu::supported_isas())
      for (cpu::ThreadPool* pool : {&one, &two, &three}) {
        const auto together = run(*pool, cpu::select_kernels(cpu::isa_name(isa)), 0, c.T);
        EXPECT_EQ(std::memcmp(together.data(), alone.data(), alone.size() * 4), 0)
            << what << ", " << cpu::isa_name(isa) << ", " << pool->size() << " threads";
      }
  }
}

// The attention softmax's exp (exp8) against std::exp, bit for bit, on every set: every 251st float (all
// signs, exponents, subnormals, infinities, NaNs among them), the edges of its range, a partial last vector.
TEST(CpuKernels, ExpHasStdExpsBits) {
  std::vector<float> x;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += 251) x.push_back(std::bit_cast<float>(static_cast<uint32_t>(b)));
  for (float e : {0.0f, -0.0f, -0x1.9fe368p6f, std::nextafter(-0x1.9fe368p6f, 0.0f), -0x1.9d1d9ep6f, -87.33f,
                  0x1.62e42ep6f, std::nextafter(0x1.62e42ep6f, 100.0f), 1e-30f, -1e-30f, 0.5f, -0.5f,
                  std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::quiet_NaN()})
    x.push_back(e);
  ASSERT_GT(x.size() % 8, 0u);  // a partial last vector too
  for (cpu::Isa isa : cpu::supported_isas()) {
    const cpu::KernelSet& set = cpu::select_kernels(cpu::isa_name(isa));
    std::vector<float> got(x.size());
    set.exp(x.data(), static_cast<int64_t>(x.size()), got.data());
    int64_t wrong = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = std::exp(x[i]);
      if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want) && !(std::isnan(want) && std::isnan(got[i])))
        if (++wrong <= 5) ADD_FAILURE() << cpu::isa_name(isa) << ": exp(" << x[i] << ") = " << got[i] << ", std::exp " << want;
    }
    EXPECT_EQ(wrong, 0) << cpu::isa_name(isa) << ", of " << x.size();
  }
}

TEST(Attention, QueryThatSeesNothingGivesZero) {
  AttCase c{1, 3, 1, 1, 4, 4, 0, true, {5, 6, -1}, {2}};
  check_attention(c, DType::F32, "nothing visible");
}

TEST(Ops, TopKAndArgmaxTies) {
  test::Fixture fx;
  std::vector<float> x{1, 5, 3, 5, -2, 0,   7, 7, 7, 1, 2, 7};
  Graph g;
  Value xv = g.input(DType::F32, {2, 6}, "x");
  Value tk = g.top_k(xv, 3);
  Value am = g.argmax(xv);
  g.mark_output(tk);
  g.mark_output(am);
  fx.run(g, {{{xv, test::bytes_of(x)}}});
  EXPECT_EQ(fx.read_i32(g, tk), (std::vector<int32_t>{1, 3, 2, 0, 1, 2}));
  EXPECT_EQ(fx.read_i32(g, am), (std::vector<int32_t>{1, 0}));
}

// TopK against a full stable sort by logit (ties: lower index) at small k (the scan against the worst so
// far) and large k (the partial sort), with coarse values so that ties are everywhere, also at the K-th.
TEST(Ops, TopKEqualsAStableSortAtEveryK) {
  test::Fixture fx;
  std::mt19937 rng(3);
  for (const int64_t cols : {1, 7, 64, 1000, 4096}) {
    for (const int64_t k : {int64_t{1}, int64_t{3}, cols / 8, cols / 8 + 1, cols / 2, cols}) {
      if (k < 1 || k > cols) continue;
      const int64_t rows = 3;
      std::vector<float> x(static_cast<size_t>(rows * cols));
      std::uniform_int_distribution<int> coarse(-20, 20);
      for (float& v : x) v = static_cast<float>(coarse(rng)) * 0.25f;
      Graph g;
      const Value xv = g.input(DType::F32, {rows, cols}, "x");
      const Value tk = g.top_k(xv, k);
      g.mark_output(tk);
      fx.run(g, {{{xv, test::bytes_of(x)}}});
      const std::vector<int32_t> got = fx.read_i32(g, tk);
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<int32_t> order(static_cast<size_t>(cols));
        std::iota(order.begin(), order.end(), 0);
        const float* xr = x.data() + r * cols;
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return xr[a] > xr[b]; });
        ASSERT_EQ(std::vector<int32_t>(got.begin() + r * k, got.begin() + (r + 1) * k),
                  std::vector<int32_t>(order.begin(), order.begin() + k))
            << "cols " << cols << ", k " << k << ", row " << r;
      }
    }
  }
}

TEST(Ops, ReshapeSliceConcat) {
  test::Fixture fx;
  std::vector<float> a(12), b(6);
  std::iota(a.begin(), a.end(), 0.0f);
  std::iota(b.begin(), b.end(), 100.0f);
  Graph g;
  Value av = g.input(DType::F32, {3, 4}, "a");
  Value bv = g.input(DType::F32, {3, 2}, "b");
  Value r = g.reshape(av, {2, 6});
  Value s = g.slice(av, 1, 2);
  Value c = g.concat(s, bv);
  for (Value v : {r, s, c}) g.mark_output(v);
  fx.run(g, {{{av, test::bytes_of(a)}, {bv, test::bytes_of(b)}}});
  EXPECT_EQ(fx.read_f32(g, r), a);
  EXPECT_EQ(fx.read_f32(g, s), (std::vector<float>{1, 2, 5, 6, 9, 10}));
  EXPECT_EQ(fx.read_f32(g, c), (std::vector<float>{1, 2, 100, 101, 5, 6, 102, 103, 9, 10, 104, 105}));
}

TEST(Ops, CopyRoundsToNearestEven) {
  test::Fixture fx;
  // 1 + 2^-8 is halfway between two BF16 values (1 and 1 + 2^-7): ties go to the even one (1).
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: goes to 1 + 2^-6.
  // For F16 (10 mantissa bits) the same with 2^-11.
  std::vector<float> x{1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, -2.5f, 65504.0f};
  Graph g;
  Value xv = g.input(DType::F32, {6}, "x");
  Value b = g.copy(xv, DType::BF16);
  Value h = g.copy(xv, DType::F16);
  g.mark_output(b);
  g.mark_output(h);
  fx.run(g, {{{xv, test::bytes_of(x)}}});
  auto gb = fx.read_f32(g, b), gh = fx.read_f32(g, h);
  EXPECT_EQ(gb[0], 1.0f);
  EXPECT_EQ(gb[1], 1.0f + 0x1p-6f);
  EXPECT_EQ(gb[4], -2.5f);
  EXPECT_EQ(gb[5], 65536.0f);  // 65504 = 0xFFE0 * 2^0: rounds up to 2^16 in BF16
  EXPECT_EQ(gh[2], 1.0f);
  EXPECT_EQ(gh[3], 1.0f + 0x1p-9f);
  EXPECT_EQ(gh[4], -2.5f);
  EXPECT_EQ(gh[5], 65504.0f);
}

TEST(Ops, WriteRowsThenAttentionInOneGraph) {
  // The decode pattern: write this step's K/V and position into ring-buffer caches, then attend
  // over the caches (through the WriteRows values) in the same graph.
  test::Fixture fx;
  const int64_t S = 4, H = 1, D = 8;
  auto kc = fx.backend->allocate("k", DType::F16, {S, H, D});
  auto vc = fx.backend->allocate("v", DType::F16, {S, H, D});
  auto pc = fx.backend->allocate("pos", DType::I32, {S});
  std::vector<int32_t> empty(S, -1);
  fx.backend->write(*pc, test::bytes_of(empty));
  std::vector<float> all_k, all_v;
  for (int32_t p = 0; p < 6; ++p) {
    auto k = test::exact_floats(H * D, 100 + p, DType::F16);
    auto v = test::exact_floats(H * D, 200 + p, DType::F16);
    auto q = test::random_floats(H * D, 300 + p);
    std::vector<int32_t> slot{p % static_cast<int32_t>(S)}, pos{p};
    Graph g;
    Value kv = g.input(DType::F32, {1, H, D}, "k_new");
    Value vv = g.input(DType::F32, {1, H, D}, "v_new");
    Value qv = g.input(DType::F32, {1, H, D}, "q");
    Value sv = g.input(DType::I32, {1}, "slot");
    Value pv = g.input(DType::I32, {1}, "pos");
    Value K = g.write_rows(kc, kv, sv);
    Value V = g.write_rows(vc, vv, sv);
    Value P = g.write_rows(pc, pv, sv);
    Value y = g.attention(qv, K, V, P, pv, 1.0f, 3, true);
    g.mark_output(y);
    fx.run(g, {{{kv, test::bytes_of(k)}, {vv, test::bytes_of(v)}, {qv, test::bytes_of(q)},
                         {sv, test::bytes_of(slot)}, {pv, test::bytes_of(pos)}}});
    all_k.insert(all_k.end(), k.begin(), k.end());
    all_v.insert(all_v.end(), v.begin(), v.end());
    // Reference: attention over every position so far as one contiguous, ordered cache.
    AttCase c{1, p + 1, H, H, D, D, 3, true, {}, {p}};
    for (int32_t i = 0; i <= p; ++i) c.kpos.push_back(i);
    expect_close(fx.read_f32(g, y), ref_attention(c, q, all_k, all_v, 1.0f), 2e-6, 1e-5,
                 "decode step " + std::to_string(p));
  }
  std::vector<int32_t> pos(S);
  fx.backend->read(*pc, std::as_writable_bytes(std::span<int32_t>(pos)));
  EXPECT_EQ(pos, (std::vector<int32_t>{4, 5, 2, 3}));

  Graph g;
  Value rows = g.input(DType::F32, {1, H, D}, "rows");
  Value bad = g.input(DType::I32, {1}, "slot");
  g.write_rows(kc, rows, bad);
  std::vector<float> zeros(H * D);
  std::vector<int32_t> slot{static_cast<int32_t>(S)};
  try {
    fx.run(g, {{{rows, test::bytes_of(zeros)}, {bad, test::bytes_of(slot)}}});
    ADD_FAILURE() << "writing past the cache must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("id 4"), std::string::npos) << e.what();
  }
}

TEST(Backend, RunAndReadErrors) {
  test::Fixture fx;
  Graph g;
  Value x = g.input(DType::F32, {2, 3}, "x");
  Value y = g.scale(x, 2.0f);
  Value z = g.scale(y, 2.0f);
  g.mark_output(z);
  std::vector<float> five(5), six(6, 1.0f);
  auto expect_msg = [](auto&& f, const std::string& part) {
    try {
      f();
      ADD_FAILURE() << "expected an error containing " << part;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_msg([&] { fx.run(g, {}); }, "input 'x'");
  expect_msg([&] { fx.run(g, {{{x, test::bytes_of(five)}}}); }, "needs 24 bytes but was given 20");
  fx.run(g, {{{x, test::bytes_of(six)}}});
  EXPECT_EQ(fx.read_f32(g, z), std::vector<float>(6, 4.0f));
  expect_msg([&] { fx.read_f32(g, y); }, "not marked as an output");
  Graph other;
  other.mark_output(other.input(DType::F32, {1}, "o"));
  fx.plan = fx.backend->compile(other);
  expect_msg([&] { fx.read_f32(other, Value{0}); }, "before the graph has run");
  other.scale(Value{0}, 2.0f);
  expect_msg([&] { fx.plan->run({{{Value{0}, test::bytes_of(std::vector<float>{1})}}}); },
             "compile it again after changing it");
  auto w = fx.weight("w", DType::F32, {2}, std::vector<float>{1, 2});
  expect_msg([&] { fx.backend->write(*w, test::bytes_of(six)); }, "read-only");
  std::vector<std::byte> short_data(7);
  TensorInfo info{"short", DType::F16, {2, 2}, std::span<const std::byte>(short_data), {}};
  expect_msg([&] { fx.backend->load_weight(info); }, "needs 8 bytes but has 7");
}

TEST(Backend, LoadWeightIsZeroCopyAndReadDecodes) {
  test::Fixture fx;
  auto vals = test::exact_floats(8, 1, DType::BF16);
  auto w = fx.weight("w", DType::BF16, {2, 4}, vals);
  std::vector<float> back(8);
  fx.backend->read(*w, std::as_writable_bytes(std::span<float>(back)));
  EXPECT_EQ(back, vals);
  // Zero-copy: changing the bytes the TensorInfo pointed at changes what the backend reads.
  auto& held = *fx.storage.back();
  uint16_t two = 0x4000;  // 2.0 in BF16
  std::memcpy(held.data(), &two, 2);
  fx.backend->read(*w, std::as_writable_bytes(std::span<float>(back)));
  EXPECT_EQ(back[0], 2.0f);
}

TEST(Backend, SupportsAnswers) {
  test::Fixture fx;
  const ComputeBackend& b = *fx.backend;
  EXPECT_TRUE(b.supports(Op::MatMul, DType::BF16).ok);
  EXPECT_TRUE(b.supports(Op::MatMul, DType::F16).ok);
  EXPECT_TRUE(b.supports(Op::Attention, DType::F16).ok);
  EXPECT_TRUE(b.supports(Op::MatMul, DType::Q4_K).ok);
  EXPECT_TRUE(b.supports(Op::GetRows, DType::Q6_K).ok);
  EXPECT_TRUE(b.supports(Op::MatMul, DType::MLX_AFFINE).ok);
  EXPECT_FALSE(b.supports(Op::MatMul, DType::I64).ok);
  auto kq = b.supports(Op::Attention, DType::Q8_0);
  EXPECT_FALSE(kq.ok);
  EXPECT_NE(kq.reason.find("Q8_0"), std::string::npos) << kq.reason;
  auto cp = b.supports(Op::Copy, DType::Q4_K);
  EXPECT_FALSE(cp.ok);
  EXPECT_NE(cp.reason.find("Q4_K"), std::string::npos);
  EXPECT_FALSE(b.supports(Op::Input, DType::Q4_0).ok);
  EXPECT_FALSE(b.supports(Op::MatMul, static_cast<DType>(999)).ok);
  EXPECT_TRUE(b.supports(Op::WriteRows, DType::I32).ok);
}

TEST(Backend, ThreadCountDoesNotChangeResults) {
  const int64_t O = 33, I = 96, N = 4;
  auto w = test::exact_floats(O * I, 3, DType::BF16);
  auto x = test::random_floats(N * I, 4);
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 3}) {
    test::Fixture fx(threads);
    Graph g;
    Value xv = g.input(DType::F32, {N, I}, "x");
    Value y = g.softmax(g.matmul(g.constant(fx.weight("w", DType::BF16, {O, I}, w)), xv));
    g.mark_output(y);
    fx.run(g, {{{xv, test::bytes_of(x)}}});
    results.push_back(fx.read_f32(g, y));
  }
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

}  // namespace
}  // namespace specula

namespace specula {
namespace {

// Element-wise ops give a value the same bits however the pool splits the array: the chunk ends move with
// the thread count and with the number of rows, and a verification's rows must get a decode step's bits.
// (A scalar std::tanh tail at misaligned chunk ends once flipped near-tied argmaxes between the two.) Every
// kernel set gives the bits of the AVX2 set (8 lanes against AVX-512's 16).
TEST(ElementwiseOps, BitsDoNotDependOnThreadsRowsOrKernelSet) {
  const int64_t cols = 6144, most = 9;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  std::vector<float> x(static_cast<size_t>(most * cols + 5));
  for (float& v : x) v = dist(rng);
  x[3] = 0.0f, x[4] = -0.0f, x[5] = 0.6249f, x[6] = -0.6251f, x[7] = 200.0f, x[8] = -200.0f;  // the branches' edges
  cpu::ThreadPool one(1), two(2), three(3);
  using Op = void (*)(cpu::ThreadPool&, const cpu::KernelSet&, const float*, int64_t, float*);
  const Op ops[] = {[](cpu::ThreadPool& p, const cpu::KernelSet& k, const float* in, int64_t n, float* out) { cpu::gelu_tanh(p, k, in, n, out); },
                    [](cpu::ThreadPool& p, const cpu::KernelSet& k, const float* in, int64_t n, float* out) { cpu::softcap(p, k, in, n, 30.0f, out); }};
  const cpu::KernelSet& avx2 = cpu::select_kernels("avx2");
  for (const Op op : ops) {
    // Each row alone on one thread with the AVX2 set: a decode step's values.
    std::vector<float> alone(x.size());
    for (int64_t r = 0; r * cols < static_cast<int64_t>(x.size()); ++r) {
      const int64_t n = std::min<int64_t>(cols, static_cast<int64_t>(x.size()) - r * cols);
      op(one, avx2, x.data() + r * cols, n, alone.data() + r * cols);
    }
    for (cpu::Isa isa : cpu::supported_isas())
      for (cpu::ThreadPool* pool : {&one, &two, &three})
        for (int64_t rows : {int64_t{1}, int64_t{5}, int64_t{7}, most}) {
          const int64_t n = rows == most ? static_cast<int64_t>(x.size()) : rows * cols;
          std::vector<float> y(static_cast<size_t>(n));
          op(*pool, cpu::select_kernels(cpu::isa_name(isa)), x.data(), n, y.data());
          for (int64_t i = 0; i < n; ++i)
            ASSERT_EQ(std::memcmp(&y[static_cast<size_t>(i)], &alone[static_cast<size_t>(i)], 4), 0)
                << cpu::isa_name(isa) << ", " << pool->size() << " threads, " << rows << " rows, value " << i << ": "
                << y[static_cast<size_t>(i)] << " != " << alone[static_cast<size_t>(i)];
        }
  }
}

TEST(ThreadPool, WorkerExceptionReachesCallerAndPoolSurvives) {
  cpu::ThreadPool pool(2);
  // Chunk [1, 2) throws, on whichever thread claims it.
  EXPECT_THROW(pool.parallel_for(2, 1, [](int64_t b, int64_t) {
    if (b == 1) throw Error("worker failed");
  }), Error);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(100, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sum += i;
  });
  EXPECT_EQ(sum.load(), 4950);
}

// Chunks are claimed dynamically: every index is covered exactly once, in chunks of at least `grain`,
// even when one thread is much slower than the other.
TEST(ThreadPool, DynamicChunksCoverEveryIndexOnce) {
  cpu::ThreadPool pool(2);
  std::vector<std::atomic<int>> hits(1000);
  std::atomic<int64_t> shortest{1 << 30};
  pool.parallel_for(1000, 7, [&](int64_t b, int64_t e) {
    if (b == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a late or slow thread
    int64_t prev = shortest.load();
    while (e - b < prev && !shortest.compare_exchange_weak(prev, e - b)) {
    }
    for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)]++;
  });
  for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i;
  EXPECT_GE(shortest.load(), 7);
}

// A worker that went to sleep (idle for longer than its spin) is woken for the next job: run() only
// takes the mutex when a worker is asleep, so a lost wake-up would show as jobs done by one thread alone.
TEST(ThreadPool, SleepingWorkerWakesForTheNextJob) {
  cpu::ThreadPool pool(2);
  int both = 0;
  for (int round = 0; round < 20; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // past the ~100 us spin: the worker sleeps
    std::atomic<int> seen{0};
    pool.run([&](int t, int) {
      seen.fetch_or(1 << t);
      // The caller waits (up to a second) for the worker to join, so a woken worker always gets in.
      if (t == 0)
        for (int i = 0; i < 1000 && !(seen.load() & 2); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    });
    both += seen.load() == 3;
  }
  EXPECT_EQ(both, 20);
}

// Two or three chunks' worth of work on two threads is split in two, so equal threads finish together.
TEST(ThreadPool, FewChunksComeInAMultipleOfTheThreads) {
  cpu::ThreadPool pool(2);
  for (int64_t n : {10, 15, 29}) {
    std::mutex m;
    std::vector<int64_t> sizes;
    pool.parallel_for(n, 5, [&](int64_t b, int64_t e) {
      std::lock_guard<std::mutex> lock(m);
      sizes.push_back(e - b);
    });
    EXPECT_EQ(sizes.size() % 2, 0u) << "n " << n;
    EXPECT_EQ(std::accumulate(sizes.begin(), sizes.end(), int64_t{0}), n);
  }
}

// Each compiled graph keeps the outputs of its own last run: runs of other graphs (which share the
// backend's buffers) leave them alone, so contexts, drafter and sampler graphs interleave freely.
TEST(CpuBackend, CompiledGraphsKeepTheirOwnOutputs) {
  test::Fixture fx;
  auto build = [](Graph& g, float factor) {
    Value x = g.input(DType::F32, {4}, "x");
    Value y = g.scale(g.gelu_tanh(x), factor);
    g.mark_output(y);
    g.mark_output(g.reshape(y, {2, 2}));
    return x;
  };
  Graph a, b;
  const Value xa = build(a, 2.0f), xb = build(b, -3.0f);
  const auto pa = fx.backend->compile(a), pb = fx.backend->compile(b);
  const std::vector<float> in{0.5f, -1.0f, 2.0f, 0.0f};
  auto read = [](const CompiledGraph& p, Value v) {
    std::vector<float> out(4);
    p.read(v, std::as_writable_bytes(std::span<float>(out)));
    return out;
  };
  pa->run({{{xa, test::bytes_of(in)}}});
  const std::vector<float> first = read(*pa, Value{2});
  for (int k = 0; k < 3; ++k) pb->run({{{xb, test::bytes_of(in)}}});
  EXPECT_EQ(read(*pa, Value{2}), first);
  EXPECT_EQ(read(*pa, Value{3}), first);  // a reshape of an output reads the same bytes
  const std::vector<float> other = read(*pb, Value{2});
  for (size_t i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(other[i], -1.5f * first[i]) << i;
  pa->run({{{xa, test::bytes_of(std::vector<float>(4, 0.0f))}}});
  EXPECT_EQ(read(*pa, Value{2}), std::vector<float>(4, 0.0f));
  EXPECT_EQ(read(*pb, Value{2}), other);
}

// Persistent tensors start as zeros, small ones (the heap) and large ones (an anonymous mapping whose
// pages the kernel zeroes on first touch), on both sides of the 2 MB boundary, and hold what is written.
TEST(CpuBackend, AllocatedTensorsStartZeroedAtEverySize) {
  test::Fixture fx;
  for (int64_t rows : {int64_t{3}, int64_t{(2 << 20) / 64 - 1}, int64_t{(2 << 20) / 64}, int64_t{1 << 20}}) {
    auto t = fx.backend->allocate("cache", DType::F32, {rows, 16});
    std::vector<float> got(static_cast<size_t>(rows * 16), 1.0f);
    fx.backend->read(*t, std::as_writable_bytes(std::span<float>(got)));
    EXPECT_EQ(std::count(got.begin(), got.end(), 0.0f), static_cast<std::ptrdiff_t>(got.size())) << rows << " rows";
    std::iota(got.begin(), got.end(), 0.0f);
    fx.backend->write(*t, std::as_bytes(std::span<const float>(got)));
    std::vector<float> back(got.size());
    fx.backend->read(*t, std::as_writable_bytes(std::span<float>(back)));
    EXPECT_EQ(back, got) << rows << " rows";
  }
}

}  // namespace
}  // namespace specula
