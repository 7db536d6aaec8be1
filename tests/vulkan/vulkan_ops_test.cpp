// The Vulkan backend against the CPU backend (an independent implementation) where Vulkan has its own
// paths: shapes that cross its tiles and row groups (1..11 activation rows, and 33-40 for the prefill
// tiles; subgroup reductions against shared memory, bit for bit), 300-slot attention, a
// 40,000-wide softmax), every MLX bit width, weights in binding windows, the sampler's draw and the
// speculative verdict (AcceptDrafts) at their boundaries, its errors, device and memory. The op conformance suites themselves (tests/backend, against
// independent references) run on Vulkan too, as "vulkan:Ops.*" and so on. Tolerances: F32 ops 1e-5 relative plus a
// small absolute term for values near 0 (the two backends sum in different orders); quantized
// matrix products use activations that the CPU's 8-bit activation kernels represent exactly, so both
// equal "SDK dequantization, then F32 product" to the same tolerance (also checked against a double
// reference here).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include <fmt/ranges.h>

#include "specula/error.hpp"
#include "specula/sampling_rule.hpp"
#include "common/sanitizers.hpp"
#include "test_util.hpp"
#include "vk_backend.hpp"

namespace specula {
namespace {

using test::bytes_of;

// One Vulkan backend for the whole suite: device creation and shader compilation are slow on lavapipe.
// Its matrix products are the fp32 shaders' on every device (the tolerances below are theirs); the
// cooperative-matrix path has its own suite (VulkanCoopMat) and bound.
std::unique_ptr<ComputeBackend> shared_vulkan, coopmat_vulkan;

// The Vulkan backends are released before main returns, not by static destructors at exit: NVIDIA's
// driver crashed (SIGSEGV) on the Vulkan objects still alive by then.
class ReleaseDevices final : public ::testing::Environment {
 public:
  void TearDown() override {
    coopmat_vulkan.reset();
    shared_vulkan.reset();
  }
};
::testing::Environment* const kReleaseDevices = ::testing::AddGlobalTestEnvironment(new ReleaseDevices);

ComputeBackend* vulkan(std::string* why = nullptr) {
  std::unique_ptr<ComputeBackend>& b = shared_vulkan;
  static std::string error;
  static bool tried = false;
  if (!tried) {
    tried = true;
    try {
      b = vulkan::make_vulkan_backend({{"cooperative_matrix", false}});
    } catch (const Error& e) {
      error = e.what();
    }
  }
  if (why) *why = error;
  return b.get();
}

#define REQUIRE_VULKAN()                                     \
  std::string why_;                                          \
  if (!vulkan(&why_)) GTEST_SKIP() << "no Vulkan device: " << why_

struct MlxWeight;

// A backend plus the weight storage its tensors point into.
struct Side {
  ComputeBackend* b;
  std::vector<std::shared_ptr<std::vector<std::byte>>> storage;
  BackendTensorPtr weight(const std::string& name, DType type, Shape shape, std::vector<std::byte> data) {
    auto held = std::make_shared<std::vector<std::byte>>(std::move(data));
    storage.push_back(held);
    TensorInfo info;
    info.name = name;
    info.type = type;
    info.shape = std::move(shape);
    info.data = std::span<const std::byte>(held->data(), held->size());
    return b->load_weight(info);
  }
  BackendTensorPtr mlx_weight(const std::string& name, Shape shape, const MlxWeight& w);
};

struct Built {
  Graph g;
  std::vector<Value> outs;
  std::vector<std::pair<Value, std::vector<std::byte>>> in;
  template <typename T>
  Value input(DType t, Shape s, const std::vector<T>& data, const std::string& name) {
    Value v = g.input(t, std::move(s), name);
    auto b = bytes_of(data);
    in.emplace_back(v, std::vector<std::byte>(b.begin(), b.end()));
    return v;
  }
  void out(Value v) {
    g.mark_output(v);
    outs.push_back(v);
  }
};

struct Result {
  std::vector<std::vector<float>> f;
  std::vector<std::vector<int32_t>> i;
};

Result run_on(ComputeBackend* b, const std::function<void(Side&, Built&)>& build) {
  Side side{b, {}};
  Built bt;
  build(side, bt);
  RunInputs in;
  for (auto& [v, bytes] : bt.in) in.inputs.emplace_back(v, std::span<const std::byte>(bytes));
  const auto plan = b->compile(bt.g);
  plan->run(in);
  Result r;
  for (Value v : bt.outs) {
    int64_t n = 1;
    for (int64_t d : bt.g.shape(v)) n *= d;
    if (bt.g.node(v).type == DType::I32) {
      std::vector<int32_t> o(static_cast<size_t>(n));
      plan->read(v, std::as_writable_bytes(std::span<int32_t>(o)));
      r.i.push_back(o);
      r.f.emplace_back();
    } else {
      std::vector<float> o(static_cast<size_t>(n));
      plan->read(v, std::as_writable_bytes(std::span<float>(o)));
      r.f.push_back(o);
      r.i.emplace_back();
    }
  }
  return r;
}

ComputeBackend* cpu() {
  static auto b = cpu::make_cpu_backend({{"threads", 1}});
  return b.get();
}
// The CPU with weights unpacked: MLX weights in MLX's float numerics, as the Vulkan backend computes them
// (packed 4-bit MLX panels take 8-bit activations).
ComputeBackend* cpu_float() {
  static auto b = cpu::make_cpu_backend({{"threads", 1}, {"pack_weights", false}});
  return b.get();
}

// Runs `build` on both backends; F32 outputs within abs + rel * |cpu|, I32 outputs equal. `reference`: the
// CPU backend compared with (cpu() unless given).
void compare(const std::function<void(Side&, Built&)>& build, double abs_tol, double rel_tol, const std::string& what,
             ComputeBackend* reference = nullptr) {
  const Result want = run_on(reference ? reference : cpu(), build);
  const Result got = run_on(vulkan(), build);
  ASSERT_EQ(want.f.size(), got.f.size());
  for (size_t k = 0; k < want.f.size(); ++k) {
    EXPECT_EQ(got.i[k], want.i[k]) << what << ": I32 output " << k;
    std::vector<double> w(want.f[k].begin(), want.f[k].end());
    test::expect_close(got.f[k], w, abs_tol, rel_tol, what + ": output " + std::to_string(k));
  }
}

// Weight bytes of `type` from random values, and the values the SDK decodes them to.
std::vector<std::byte> make_weight(DType type, int64_t rows, int64_t cols, uint32_t seed, std::vector<float>* decoded = nullptr) {
  auto w = test::random_floats(static_cast<size_t>(rows * cols), seed);
  const size_t rb = *dtype_row_bytes(type, static_cast<uint64_t>(cols));
  std::vector<std::byte> packed(rb * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) quantize_row(type, w.data() + r * cols, packed.data() + r * rb, cols);
  if (decoded) {
    decoded->resize(w.size());
    for (int64_t r = 0; r < rows; ++r) dequantize_row(type, packed.data() + r * rb, decoded->data() + r * cols, cols);
  }
  return packed;
}

// An MLX affine weight (the SDK's MLX quantizer on random values) and the values the SDK decodes it to.
struct MlxWeight {
  MlxRowParams p;
  std::vector<std::byte> packed, scales, biases;
  std::vector<float> decoded;
};

MlxWeight make_mlx(MlxRowParams p, int64_t rows, int64_t cols, uint32_t seed) {
  auto w = test::random_floats(static_cast<size_t>(rows * cols), seed);
  const size_t code_row = static_cast<size_t>(cols) * p.bits / 8;
  const size_t scale_row = static_cast<size_t>(cols / p.group_size) * (p.scale_type == DType::F32 ? 4 : 2);
  MlxWeight m{p, std::vector<std::byte>(code_row * rows), std::vector<std::byte>(scale_row * rows),
              std::vector<std::byte>(scale_row * rows), std::vector<float>(w.size())};
  for (int64_t r = 0; r < rows; ++r) {
    mlx_quantize_row(p, w.data() + r * cols, cols, m.packed.data() + r * code_row, m.scales.data() + r * scale_row,
                     m.biases.data() + r * scale_row);
    mlx_dequantize_row(p, m.packed.data() + r * code_row, m.scales.data() + r * scale_row,
                       m.biases.data() + r * scale_row, m.decoded.data() + r * cols, cols);
  }
  return m;
}

std::string mlx_name(const MlxRowParams& p) {
  return fmt::format("MLX{}b/g{}/{}", p.bits, p.group_size, dtype_name(p.scale_type));
}

BackendTensorPtr Side::mlx_weight(const std::string& name, Shape shape, const MlxWeight& w) {
  auto held = std::make_shared<MlxWeight>(w);
  TensorInfo info;
  info.name = name;
  info.type = DType::MLX_AFFINE;
  info.shape = std::move(shape);
  info.data = std::span<const std::byte>(held->packed);
  info.quant = {w.p.bits, w.p.group_size, w.p.scale_type, std::span<const std::byte>(held->scales),
                std::span<const std::byte>(held->biases)};
  storage.push_back(std::shared_ptr<std::vector<std::byte>>(held, &held->packed));  // keeps all of it
  return b->load_weight(info);
}

// Activations the CPU's 8-bit activation kernels represent exactly (one code at 127 per 32 values).
std::vector<float> exact_activations(size_t n, uint32_t seed) {
  auto x = test::random_floats(n, seed);
  for (size_t i = 0; i < n; ++i) x[i] = (i % 32 == 5 ? 127.0f : std::round(x[i] * 127.0f)) / 128.0f;
  return x;
}

class VulkanMatMul : public ::testing::TestWithParam<DType> {};

TEST_P(VulkanMatMul, MatchesCpuAndDequantizedReference) {
  REQUIRE_VULKAN();
  const DType type = GetParam();
  const int64_t blk = dtype_traits(type)->block_elems;
  // Odd output counts, 1..11 activation rows (remainders of the 8-row groups), 40 (matmul_tiled: two
  // column tiles, a full and a partial row tile), odd widths for plain types.
  std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes{{37, 256, 1}, {13, 512, 6}, {5, 256, 11}, {70, 256, 40}};
  if (blk == 1) shapes.insert(shapes.end(), {{19, 37, 3}, {19, 37, 33}});
  for (auto [O, I, N] : shapes) {
    std::vector<float> deq;
    auto packed = make_weight(type, O, I, 7, &deq);
    auto x = exact_activations(static_cast<size_t>(N * I), 8);
    const std::string what = fmt::format("matmul {} O={} I={} N={}", dtype_name(type), O, I, N);
    compare([&](Side& s, Built& b) {
      Value xv = b.input(DType::F32, {N, I}, x, "x");
      b.out(b.g.matmul(b.g.constant(s.weight("w", type, {O, I}, packed)), xv));
    }, 1e-5, 1e-5, what);
    // Independent: double-precision product of the SDK-dequantized weight.
    Result r = run_on(vulkan(), [&](Side& s, Built& b) {
      Value xv = b.input(DType::F32, {N, I}, x, "x");
      b.out(b.g.matmul(b.g.constant(s.weight("w", type, {O, I}, packed)), xv));
    });
    std::vector<double> ref(static_cast<size_t>(N * O));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o) {
        double acc = 0;
        for (int64_t i = 0; i < I; ++i) acc += double(deq[o * I + i]) * x[n * I + i];
        ref[n * O + o] = acc;
      }
    test::expect_close(r.f[0], ref, 1e-5, 1e-5, what + " vs double reference");
  }
}

TEST_P(VulkanMatMul, GetRowsDecodesLikeTheSdk) {
  REQUIRE_VULKAN();
  const DType type = GetParam();
  const int64_t C = dtype_traits(type)->block_elems == 1 ? 45 : 512, R = 11;
  auto packed = make_weight(type, R, C, 9);
  std::vector<int32_t> ids{3, 0, 10, 3, 7};
  compare([&](Side& s, Built& b) {
    Value iv = b.input(DType::I32, {5}, ids, "ids");
    b.out(b.g.get_rows(b.g.constant(s.weight("table", type, {R, C}, packed)), iv));
  }, 0, 0, std::string("get_rows ") + std::string(dtype_name(type)));
}

INSTANTIATE_TEST_SUITE_P(Types, VulkanMatMul,
                         ::testing::Values(DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1,
                                           DType::Q5_0, DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K,
                                           DType::IQ4_NL, DType::IQ4_XS),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// Prompt-sized products on cooperative matrices (matmul_coopmat.comp, where the device has them):
// activations and decoded weights are rounded to fp16 and products summed in fp32, so each output is
// within 2^-10 of the sum of |w x| (two roundings of 2^-11 each) of the double product of the
// SDK-decoded weights, plus the fp32 sums' own error. Shapes cross the 64 x 64 tiles, the 64-value steps
// (I = 96: half a step) and the windows of a weight larger than a binding (the last shape).
class VulkanCoopMat : public ::testing::TestWithParam<DType> {};

TEST_P(VulkanCoopMat, WithinFp16RoundingOfTheDequantizedProduct) {
  REQUIRE_VULKAN();
  if (!coopmat_vulkan) coopmat_vulkan = vulkan::make_vulkan_backend(nlohmann::json::object());
  ComputeBackend* cm = coopmat_vulkan.get();
  if (!vulkan::vulkan_cooperative_matrix(*cm))
    GTEST_SKIP() << "no cooperative matrices on " << cm->device().name
                 << " (the matmul shaders need VK_NV_cooperative_matrix with fp16 16x16x16 or 16x8x16 tiles)";
  const DType type = GetParam();
  const int64_t blk = dtype_traits(type)->block_elems;
  // The last shape again on a backend that binds at most 64 KiB at once: the weight in windows.
  auto windowed = vulkan::make_vulkan_backend({{"max_binding_bytes", 65536}});
  std::vector<std::tuple<int64_t, int64_t, int64_t>> shapes{{70, 256, 32}, {130, 512, 100}, {64, 1536, 64}, {37, 256, 200}};
  if (blk == 1) shapes.insert(shapes.end(), {{19, 96, 33}, {65, 160, 40}});
  shapes.emplace_back(480, 256, 32);  // the weight 130 KiB or more; x and the result within 64 KiB
  for (size_t k = 0; k < shapes.size(); ++k) {
    const auto [O, I, N] = shapes[k];
    ComputeBackend* on = k + 1 == shapes.size() ? windowed.get() : cm;
    std::vector<float> deq;
    auto packed = make_weight(type, O, I, 17, &deq);
    auto x = test::random_floats(static_cast<size_t>(N * I), 18);
    x[3] = 1e6f;  // past fp16's range: saturated at 65504, never infinite
    Result r = run_on(on, [&](Side& s, Built& b) {
      Value xv = b.input(DType::F32, {N, I}, x, "x");
      b.out(b.g.matmul(b.g.constant(s.weight("w", type, {O, I}, packed)), xv));
    });
    const std::string what = fmt::format("coopmat matmul {} O={} I={} N={}", dtype_name(type), O, I, N);
    ASSERT_EQ(r.f[0].size(), static_cast<size_t>(N * O)) << what;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o) {
        double ref = 0, mag = 0;
        for (int64_t i = 0; i < I; ++i) {
          const double xi = std::clamp<double>(x[n * I + i], -65504.0, 65504.0);
          ref += double(deq[o * I + i]) * xi;
          mag += std::abs(double(deq[o * I + i]) * xi);
        }
        const double got = r.f[0][static_cast<size_t>(n * O + o)];
        ASSERT_TRUE(std::abs(got - ref) <= std::ldexp(mag, -10) * 1.01 + 1e-6)
            << what << ": row " << n << " column " << o << " is " << got << ", expected " << ref << " within "
            << std::ldexp(mag, -10);
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, VulkanCoopMat,
                         ::testing::Values(DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_K,
                                           DType::Q5_K, DType::Q6_K, DType::IQ4_XS),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// MLX affine weights: every bit width, group size and scale type appears (not every combination: each
// case runs graphs on both backends). The CPU with its weights unpacked multiplies them with float
// activations, as MLX does (packed 4-bit panels take 8-bit ones), so the activations are plain random
// values; the double-precision product of the SDK-decoded weight checks both.
class VulkanMlx : public ::testing::TestWithParam<MlxRowParams> {};

TEST_P(VulkanMlx, MatMulAndGetRowsMatchCpu) {
  REQUIRE_VULKAN();
  const MlxRowParams p = GetParam();
  const int64_t O = 37, I = 384;  // 384: whole groups of 32, 64 and 128, several per row
  const MlxWeight w = make_mlx(p, O, I, 70 + p.bits);
  for (int64_t N : {1, 3, 17, 40}) {  // 17: two 8-row groups and a remainder, and the CPU's GEMM row count; 40: tiled
    auto x = test::random_floats(static_cast<size_t>(N * I), 71);
    const std::string what = fmt::format("matmul {} O={} I={} N={}", mlx_name(p), O, I, N);
    auto build = [&](Side& s, Built& b) {
      b.out(b.g.matmul(b.g.constant(s.mlx_weight("w", {O, I}, w)), b.input(DType::F32, {N, I}, x, "x")));
    };
    const Result want = run_on(cpu_float(), build), got = run_on(vulkan(), build);
    test::expect_close(got.f[0], std::vector<double>(want.f[0].begin(), want.f[0].end()), 1e-5, 1e-5, what);
    std::vector<double> ref(static_cast<size_t>(N * O));
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o) {
        double acc = 0;
        for (int64_t i = 0; i < I; ++i) acc += double(w.decoded[o * I + i]) * x[n * I + i];
        ref[n * O + o] = acc;
      }
    test::expect_close(got.f[0], ref, 1e-5, 1e-5, what + " vs double reference");
  }
  std::vector<int32_t> ids{36, 0, 17, 36, 5};
  compare([&](Side& s, Built& b) {
    b.out(b.g.get_rows(b.g.constant(s.mlx_weight("table", {O, I}, w)), b.input(DType::I32, {5}, ids, "ids")));
  }, 0, 0, "get_rows " + mlx_name(p));
  // Bit for bit the SDK's decode, too.
  Result r = run_on(vulkan(), [&](Side& s, Built& b) {
    b.out(b.g.get_rows(b.g.constant(s.mlx_weight("table", {O, I}, w)), b.input(DType::I32, {5}, ids, "ids")));
  });
  std::vector<double> want;
  for (int32_t id : ids)
    for (int64_t c = 0; c < I; ++c) want.push_back(w.decoded[id * I + c]);
  test::expect_close(r.f[0], want, 0, 0, "get_rows " + mlx_name(p) + " vs the SDK");
}

INSTANTIATE_TEST_SUITE_P(Params, VulkanMlx,
                         ::testing::Values(MlxRowParams{2, 32, DType::F16}, MlxRowParams{3, 64, DType::BF16},
                                           MlxRowParams{4, 128, DType::F32}, MlxRowParams{5, 32, DType::BF16},
                                           MlxRowParams{6, 64, DType::F32}, MlxRowParams{8, 128, DType::F16},
                                           MlxRowParams{4, 64, DType::BF16}, MlxRowParams{8, 32, DType::F32},
                                           MlxRowParams{3, 128, DType::F16}, MlxRowParams{6, 32, DType::F16}),
                         [](const auto& info) {
                           return fmt::format("b{}_g{}_{}", info.param.bits, info.param.group_size,
                                              dtype_name(info.param.scale_type));
                         });

TEST(VulkanOps, MlxMatMulIdSharedAndPerSlotInputs) {
  REQUIRE_VULKAN();
  const int64_t E = 5, O = 7, I = 256, N = 3, K = 2;
  for (MlxRowParams p : {MlxRowParams{4, 64, DType::BF16}, MlxRowParams{3, 32, DType::F16}, MlxRowParams{6, 128, DType::F32}}) {
    const MlxWeight w = make_mlx(p, E * O, I, 80);
    std::vector<int32_t> ids{4, 0, 2, 2, 1, 3};
    auto x1 = test::random_floats(N * I, 81), xk = test::random_floats(N * K * I, 82);
    compare([&](Side& s, Built& b) {
      Value e = b.g.constant(s.mlx_weight("experts", {E, O, I}, w));
      Value iv = b.input(DType::I32, {N, K}, ids, "ids");
      b.out(b.g.matmul_id(e, b.input(DType::F32, {N, 1, I}, x1, "x1"), iv));
      b.out(b.g.matmul_id(e, b.input(DType::F32, {N, K, I}, xk, "xk"), iv));
    }, 1e-5, 1e-5, "matmul_id " + mlx_name(p), cpu_float());
  }
}

TEST(VulkanOps, MatMulIdSharedAndPerSlotInputs) {
  REQUIRE_VULKAN();
  const int64_t E = 5, O = 7, I = 64, N = 3, K = 2;
  for (DType type : {DType::F32, DType::Q8_0}) {
    auto packed = make_weight(type, E * O, I, 31);
    std::vector<int32_t> ids{4, 0, 2, 2, 1, 3};
    auto x1 = exact_activations(N * I, 32), xk = exact_activations(N * K * I, 33);
    compare([&](Side& s, Built& b) {
      Value e = b.g.constant(s.weight("experts", type, {E, O, I}, packed));
      Value iv = b.input(DType::I32, {N, K}, ids, "ids");
      b.out(b.g.matmul_id(e, b.input(DType::F32, {N, 1, I}, x1, "x1"), iv));
      b.out(b.g.matmul_id(e, b.input(DType::F32, {N, K, I}, xk, "xk"), iv));
    }, 1e-5, 1e-5, std::string("matmul_id ") + std::string(dtype_name(type)));
  }
}

TEST(VulkanOps, ElementwiseAndRowOps) {
  REQUIRE_VULKAN();
  const int64_t N = 3, K = 5, C = 67;
  auto a = test::random_floats(N * K * C, 1, -3.0f, 3.0f);
  auto bc = test::random_floats(C, 2), bk = test::random_floats(N * K, 3), b1 = test::random_floats(1, 4);
  auto w16 = test::exact_floats(C, 5, DType::F16);
  compare([&](Side& s, Built& b) {
    auto& g = b.g;
    Value av = b.input(DType::F32, {N, K, C}, a, "a");
    b.out(g.add(av, b.input(DType::F32, {C}, bc, "bc")));
    b.out(g.mul(av, b.input(DType::F32, {N, K, 1}, bk, "bk")));
    b.out(g.add(av, b.input(DType::F32, {1}, b1, "b1")));
    Value w = g.constant(s.weight("w16", DType::F16, {C}, test::encode(w16, DType::F16)));
    b.out(g.mul(av, w));  // an F16 operand, converted first
    b.out(g.scale(av, -0.37f));
    b.out(g.gelu_tanh(av));
    b.out(g.softcap(av, 2.5f));
    b.out(g.rms_norm(av, w, 1e-6f));
    b.out(g.rms_norm(av, Value{}, 1e-3f));
    b.out(g.softmax(g.scale(av, 4.0f)));
  }, 1e-6, 1e-5, "elementwise and row ops");
  // A long row (a vocabulary-sized softmax) spanning 40 in logits: Vulkan's exp may be off by
  // 3 + 2|x| ulp (spec precision), i.e. ~1e-5 relative at |x - max| = 40, hence 3e-5 here.
  auto big = test::random_floats(40000, 6, -20.0f, 20.0f);
  compare([&](Side&, Built& b) { b.out(b.g.softmax(b.input(DType::F32, {1, 40000}, big, "x"))); }, 1e-9, 3e-5, "softmax 40000");
}

TEST(VulkanOps, Rope) {
  REQUIRE_VULKAN();
  const int64_t H = 3, D = 16;
  std::vector<int32_t> pos{0, 1, 7, 130, 4000, 70000};
  const int64_t T = static_cast<int64_t>(pos.size());
  auto x = test::random_floats(T * H * D, 4);
  struct Case { int64_t pairs; float theta, divisor, fscale; };
  for (Case c : {Case{8, 10000.0f, 16.0f, 1.0f}, Case{2, 1e6f, 16.0f, 1.0f}, Case{8, 10000.0f, 16.0f, 0.125f}, Case{0, 1e4f, 16.0f, 1.0f}})
    compare([&](Side&, Built& b) {
      b.out(b.g.rope(b.input(DType::F32, {T, H, D}, x, "x"), b.input(DType::I32, {T}, pos, "pos"), c.pairs, c.theta,
                     c.divisor, c.fscale));
    }, 2e-6, 1e-5, "rope pairs=" + std::to_string(c.pairs) + " fscale=" + std::to_string(c.fscale));
}

struct AttCase {
  int64_t T, S, Hq, Hkv, D, Dv, window;
  bool causal;
  std::vector<int32_t> kpos, qpos;
  int32_t in_use = -1;  // >= 0: the slots in use (Op::Attention's src5)
};

void check_attention(const AttCase& c, DType kv, const std::string& what) {
  auto q = test::random_floats(c.T * c.Hq * c.D, 11, -2.0f, 2.0f);
  auto k = test::exact_floats(c.S * c.Hkv * c.D, 12, kv);
  auto v = test::exact_floats(c.S * c.Hkv * c.Dv, 13, kv);
  compare([&](Side& s, Built& b) {
    auto kc = s.b->allocate("k_cache", kv, {c.S, c.Hkv, c.D});
    auto vc = s.b->allocate("v_cache", kv, {c.S, c.Hkv, c.Dv});
    s.b->write(*kc, bytes_of(k));
    s.b->write(*vc, bytes_of(v));
    b.out(b.g.attention(b.input(DType::F32, {c.T, c.Hq, c.D}, q, "q"), b.g.constant(kc), b.g.constant(vc),
                        b.input(DType::I32, {c.S}, c.kpos, "kpos"), b.input(DType::I32, {c.T}, c.qpos, "qpos"), 0.7f,
                        c.window, c.causal,
                        c.in_use >= 0 ? b.input(DType::I32, {1}, std::vector<int32_t>{c.in_use}, "in_use") : Value{}));
  }, 2e-6, 1e-5, what);
}

TEST(VulkanOps, Attention) {
  REQUIRE_VULKAN();
  check_attention({1, 8, 4, 2, 16, 16, 0, true, {8, 9, 10, 3, 4, 5, 6, 7}, {10}}, DType::F32, "ring buffer");
  check_attention({1, 8, 4, 2, 16, 16, 0, true, {8, -1, 2, 3, -1, 5, 6, 7}, {8}}, DType::F32, "empty slots");
  check_attention({6, 10, 2, 1, 8, 8, 3, true, {5, 0, 9, 2, 7, 4, 1, 8, 3, 6}, {4, 5, 6, 7, 8, 9}}, DType::F32, "window 3");
  check_attention({3, 5, 8, 2, 32, 24, 0, true, {0, 1, 2, 3, 4}, {2, 3, 4}}, DType::F32, "GQA 8/2, Dv != D");
  check_attention({4, 6, 2, 2, 8, 8, 2, false, {0, 1, 2, 3, 4, 5}, {0, 1, 2, 3}}, DType::F32, "bidirectional window 2");
  check_attention({2, 7, 4, 1, 16, 16, 4, true, {3, 4, 5, 6, 0, 1, 2}, {5, 6}}, DType::F16, "F16 cache");
  check_attention({2, 7, 4, 1, 16, 16, 4, true, {3, 4, 5, 6, 0, 1, 2}, {5, 6}}, DType::BF16, "BF16 cache");
  check_attention({1, 3, 1, 1, 4, 4, 0, true, {5, 6, -1}, {2}}, DType::F32, "nothing visible");
  check_attention({2, 300, 2, 1, 64, 64, 0, true, [] {
                     std::vector<int32_t> p(300);
                     std::iota(p.begin(), p.end(), 0);
                     return p;
                   }(), {298, 299}}, DType::F16, "300 slots");
  // The CPU reads only the slots in use (tests/backend, against a float64 reference); so must the shader:
  // the slots past them hold positions a bidirectional query would otherwise see.
  check_attention({2, 10, 4, 2, 16, 16, 0, false, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, {4, 5}, 6}, DType::F32, "6 of 10 in use");
  check_attention({1, 4, 2, 1, 8, 8, 0, false, {0, 1, 2, 3}, {3}, 0}, DType::F32, "none in use");
  std::vector<int32_t> all(300);
  std::iota(all.begin(), all.end(), 0);
  check_attention({2, 300, 2, 1, 64, 64, 0, false, all, {98, 99}, 130}, DType::F16, "130 of 300 in use, three tiles");
  // Past 512 slots with few queries x heads the slots split into chunks, one workgroup each, merged by
  // attention_combine.comp: chunks past the slots in use, chunks that see nothing (a window), a ring
  // buffer with empty slots, nothing visible anywhere, and a long context at head dim 512.
  std::vector<int32_t> long_pos(2000);
  std::iota(long_pos.begin(), long_pos.end(), 0);
  check_attention({1, 2000, 2, 1, 64, 64, 0, true, long_pos, {1999}}, DType::F32, "2000 slots in 4 chunks");
  check_attention({3, 2000, 2, 1, 64, 48, 0, true, long_pos, {1097, 1098, 1099}, 1100}, DType::F16,
                  "1100 of 2000 in use: chunks past them");
  check_attention({2, 2000, 4, 2, 32, 32, 100, true, long_pos, {1998, 1999}}, DType::F32, "window 100: one chunk sees");
  std::vector<int32_t> ring(1500);
  for (size_t s = 0; s < ring.size(); ++s) ring[s] = s % 7 == 3 ? -1 : static_cast<int32_t>((s * 611) % 1500);
  check_attention({2, 1500, 2, 2, 64, 64, 0, true, ring, {1400, 1499}}, DType::BF16, "ring of 1500 with empty slots");
  check_attention({1, 1000, 2, 1, 16, 16, 0, true, std::vector<int32_t>(1000, -1), {5}}, DType::F32, "1000 empty slots");
}

TEST(VulkanOps, TopKArgmaxTiesAndDataMovement) {
  REQUIRE_VULKAN();
  std::vector<float> x{1, 5, 3, 5, -2, 0, 7, 7, 7, 1, 2, 7};
  auto r = run_on(vulkan(), [&](Side&, Built& b) {
    Value xv = b.input(DType::F32, {2, 6}, x, "x");
    b.out(b.g.top_k(xv, 3));
    b.out(b.g.argmax(xv));
  });
  EXPECT_EQ(r.i[0], (std::vector<int32_t>{1, 3, 2, 0, 1, 2}));
  EXPECT_EQ(r.i[1], (std::vector<int32_t>{1, 0}));
  auto big = test::random_floats(3 * 1001, 40);
  for (size_t i = 0; i < big.size(); i += 7) big[i] = 0.5f;  // many ties
  std::vector<int32_t> ints(12);
  std::iota(ints.begin(), ints.end(), -4);
  auto a = test::random_floats(3 * 5, 41), bb = test::random_floats(3 * 2, 42);
  compare([&](Side&, Built& b) {
    auto& g = b.g;
    Value bv = b.input(DType::F32, {3, 1001}, big, "big");
    b.out(g.top_k(bv, 40));
    b.out(g.argmax(bv));
    Value av = b.input(DType::F32, {3, 5}, a, "a");
    b.out(g.reshape(av, {5, 3}));
    b.out(g.slice(av, 1, 3));
    b.out(g.concat(g.slice(av, 2, 3), b.input(DType::F32, {3, 2}, bb, "b")));
    Value iv = b.input(DType::I32, {3, 4}, ints, "ints");
    b.out(g.concat(g.slice(iv, 1, 2), iv));
    // GetRows of an I32 table (ids of ids), from an input and from a computed value.
    Value which = b.input(DType::I32, {2}, std::vector<int32_t>{2, 0}, "which");
    Value rows = g.get_rows(iv, which);
    b.out(rows);
    b.out(g.get_rows(g.reshape(rows, {8, 1}), g.slice(which, 0, 1)));
    b.out(g.copy(av, DType::F16));
    b.out(g.copy(g.scale(av, 3.3f), DType::BF16));
  }, 0, 0, "top_k, argmax, reshape, slice, concat, copy");
}

// TopK beyond a few picks (topk_select.comp: radix select, then a bitonic sort of the picked) gives the
// CPU's indices in the CPU's order: k from 5 to the whole row, rows of 5 to 262144 values, with ties
// (lowest index first, also where the k-th value is tied), -0 next to +0, -inf, and all-equal rows; k
// not a power of two, and a row shorter than the workgroup. The last cases are Gemma's 262144-token
// vocabulary: the sampler's top-k 40, and the whole row sorted, as top-p without a top-k asks (on
// lavapipe that sort also checks the shader stays under llvmpipe's 65535 iterations per loop).
TEST(VulkanOps, TopKSelectEqualsTheCpuAtEveryK) {
  REQUIRE_VULKAN();
  struct Case {
    int64_t rows, cols, k;
    int tie_every;  // every n-th value is 0.5 (0: none)
  };
  for (const Case& c : {Case{2, 5, 5, 0}, Case{3, 100, 7, 3}, Case{2, 1001, 40, 7}, Case{1, 4096, 257, 2},
                        Case{2, 777, 777, 5}, Case{1, 300, 256, 1}, Case{1, 70000, 1000, 11}, Case{1, 131073, 131073, 0},
                        Case{2, 262144, 40, 0}, Case{1, 262144, 262144, 0}}) {
    auto x = test::random_floats(static_cast<size_t>(c.rows * c.cols), 70 + static_cast<uint32_t>(c.k), -4.0f, 4.0f);
    for (size_t i = 0; c.tie_every > 0 && i < x.size(); i += static_cast<size_t>(c.tie_every)) x[i] = 0.5f;
    if (c.cols >= 100) {  // signed zeros and minus infinity (a suppressed token) in the first row
      x[10] = -0.0f, x[11] = 0.0f, x[12] = -0.0f;
      x[20] = -std::numeric_limits<float>::infinity(), x[21] = -std::numeric_limits<float>::infinity();
    }
    compare([&](Side&, Built& b) { b.out(b.g.top_k(b.input(DType::F32, {c.rows, c.cols}, x, "x"), c.k)); }, 0, 0,
            fmt::format("top_k {} of {}", c.k, c.cols));
  }
}

// TopPDraw follows the SDK's float32 rule on the GPU too: the CPU's token for every uniform of a sweep,
// over peaked and flat logits, top-p, min-p, temperatures from 0.2 to 2 and 1 to 4096 candidates, and
// u = 1 over a tail of zero weights.
TEST(VulkanOps, TopPDrawEqualsTheCpuTokenForToken) {
  REQUIRE_VULKAN();
  struct Case {
    int64_t k;
    float t, top_p, min_p, scale;
  };
  int compared = 0;
  for (const Case& c : {Case{1, 1.0f, 1.0f, 0.0f, 1.0f}, Case{40, 0.7f, 0.9f, 0.0f, 3.0f}, Case{64, 0.2f, 1.0f, 0.0f, 5.0f},
                        Case{200, 1.0f, 0.95f, 0.05f, 2.0f}, Case{256, 2.0f, 0.5f, 0.0f, 0.5f},
                        Case{4096, 1.0f, 0.9f, 0.0f, 4.0f}, Case{50, 1.0f, 1.0f, 1.0f, 1.0f},
                        Case{64, 1.0f, 1.0f, 0.0f, 60.0f}}) {
    auto x = test::random_floats(c.k, 60 + static_cast<uint32_t>(c.k), -c.scale, c.scale);
    std::sort(x.begin(), x.end(), std::greater<>());
    std::vector<int32_t> ids(x.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(7 * i + 3);
    // A sweep, plus the uniforms right at the rule's own running sums (and one float either side), where
    // one different rounding anywhere in the weights or sums changes the token.
    std::vector<float> us;
    for (int s = 0; s < 64; ++s) us.push_back(s == 63 ? 0x1.fffffep-1f : static_cast<float>(s) / 63.0f);
    // u = 1: no running sum exceeds the mass, so the draw falls back to the last kept candidate with a
    // nonzero weight (the widely spread logits' tail weighs 0: not the last kept one).
    us.push_back(1.0f);
    const TopPSet set = top_p_set(x, 1.0f / c.t, c.top_p, c.min_p);
    float cum = 0.0f;
    for (size_t k = 0; k < std::min<size_t>(set.keep, 8); ++k) {
      cum += set.w[k];
      const float at = cum / set.mass;
      for (float v : {std::nextafter(at, 0.0f), at, std::nextafter(at, 1.0f)})
        if (v >= 0.0f && v < 1.0f) us.push_back(v);
    }
    for (float uv : us) {
      const std::vector<float> u{uv};
      compare([&](Side&, Built& bt) {
        bt.out(bt.g.top_p_draw(bt.input(DType::F32, {c.k}, x, "logits"), bt.input(DType::F32, {1}, u, "u"),
                               bt.input(DType::I32, {c.k}, ids, "ids"), c.t, c.top_p, c.min_p));
      }, 0, 0, fmt::format("top_p_draw k {} t {} top_p {} min_p {} u {}", c.k, c.t, c.top_p, c.min_p, u[0]));
      ++compared;
    }
  }
  EXPECT_GT(compared, 7 * 64);
}

// One sampled speculative round (Op::AcceptDrafts): the target's logits [n + 1, V], the drafter's [n, V],
// the drafts, the TopK widths of both and the sampling parameters.
struct DraftRound {
  int64_t n = 1, V = 0, k = 1, kq = 1;
  std::vector<float> target, draft;
  std::vector<int32_t> drafts;
  float t = 1.0f, top_p = 1.0f, min_p = 0.0f;
};

// The round's output [a, t_0 .. t_a, -1 ...] on backend `b` for each uniform vector: one graph (the TopK
// of both logits on that backend, then AcceptDrafts), compiled once and run per vector.
std::vector<std::vector<int32_t>> accept_drafts_on(ComputeBackend* b, const DraftRound& r,
                                                   const std::vector<std::vector<float>>& uniforms) {
  Built bt;
  auto& g = bt.g;
  Value target = bt.input(DType::F32, {r.n + 1, r.V}, r.target, "target");
  Value draft = bt.input(DType::F32, {r.n, r.V}, r.draft, "draft");
  Value drafts = bt.input(DType::I32, {r.n}, r.drafts, "drafts");
  Value u = g.input(DType::F32, {2 * r.n + 1}, "uniforms");
  Value out = g.accept_drafts(target, g.top_k(target, r.k), draft, g.top_k(draft, r.kq), drafts, u, r.t, r.top_p,
                              r.min_p);
  g.mark_output(out);
  const auto plan = b->compile(g);
  std::vector<std::vector<int32_t>> outs;
  for (const auto& uv : uniforms) {
    RunInputs in;
    for (auto& [v, bytes] : bt.in) in.inputs.emplace_back(v, std::span<const std::byte>(bytes));
    in.inputs.emplace_back(u, bytes_of(uv));
    plan->run(in);
    std::vector<int32_t> o(static_cast<size_t>(r.n + 2));
    plan->read(out, std::as_writable_bytes(std::span<int32_t>(o)));
    outs.push_back(std::move(o));
  }
  return outs;
}

// The k highest of a row by (logit, then lower id): TopK's contract.
std::vector<int32_t> host_top(const float* x, int64_t V, int64_t k) {
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(),
                    [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
  ids.resize(static_cast<size_t>(k));
  return ids;
}

// A row's distribution on the host (as the CPU backend's RowSet), only to place uniforms at the rule's
// boundaries; the reference is the CPU backend itself.
struct HostRow {
  const float* x;
  std::vector<int32_t> top;
  TopPSet set;
  float top_scaled, inv_t;
  HostRow(const float* row, int64_t V, int64_t k, float inv_temperature, float top_p, float min_p)
      : x(row), top(host_top(row, V, k)), inv_t(inv_temperature) {
    std::vector<float> v;
    for (int32_t t : top) v.push_back(row[t]);
    set = top_p_set(v, inv_t, top_p, min_p);
    top_scaled = v[0] * inv_t;
  }
  float weight(int32_t t) const {
    const int32_t b = top[set.keep - 1];
    return x[t] > x[b] || (x[t] == x[b] && t <= b) ? rule_exp(x[t] * inv_t - top_scaled) : 0.0f;
  }
};

// AcceptDrafts follows the SDK's float32 rule on the GPU too: the CPU's verdict and tokens, bit for bit,
// for 1 to 4 drafts over a 1000-token vocabulary; TopK rows from the graph's own TopK (1, 8, 64 / 40,
// 40 / 64 and the whole vocabulary); independent, tied (bf16-rounded), equal (p = q), close and widely
// spread logits (weights that underflow to 0 inside the kept set); drafts from the drafter's top list,
// the target's and anywhere; temperatures 0.25 to 1.5 with and without top-p and min-p; and uniforms 0,
// 1 - 2^-24, 1 (the draws' fallback to the last nonzero weight), random, and at the first draft's
// acceptance boundary and its residual's running sums (and one float either side).
TEST(VulkanOps, AcceptDraftsEqualsTheCpuTokenForToken) {
  REQUIRE_VULKAN();
  constexpr int64_t V = 1000;
  struct Params {
    float t, top_p, min_p;
  };
  struct Tops {
    int64_t k, kq;
  };
  const Params params[] = {{1.0f, 1.0f, 0.0f}, {0.7f, 0.9f, 0.0f}, {1.0f, 0.95f, 0.05f}, {0.25f, 1.0f, 0.0f},
                           {1.5f, 0.8f, 0.02f}};
  const Tops tops[] = {{1, 1}, {8, 8}, {64, 40}, {40, 64}, {V, V}};
  enum Kind { Independent, Tied, Equal, Close, Wide, Kinds };
  const char* kind_names[] = {"independent", "tied", "equal", "close", "wide"};
  auto bf16 = [](float x) { return bf16_to_fp32(fp32_to_bf16(x)); };
  std::mt19937 rng(2024);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  int rounds = 0, compared = 0;
  std::vector<int> accepted(5, 0);  // how many rounds accepted a drafts, over all n
  for (int64_t n = 1; n <= 4; ++n) {
    for (int kind = 0; kind < Kinds; ++kind) {
      const uint32_t seed = static_cast<uint32_t>(100 * n + 10 * kind);
      const float scale = kind == Wide ? 60.0f : kind == Tied ? 2.0f : 4.0f;
      DraftRound r;
      r.n = n;
      r.V = V;
      r.target = test::random_floats(static_cast<size_t>((n + 1) * V), seed, -scale, scale);
      r.draft = test::random_floats(static_cast<size_t>(n * V), seed + 1, -scale, scale);
      if (kind == Tied)
        for (auto* v : {&r.target, &r.draft})
          for (float& x : *v) x = bf16(x);
      if (kind == Equal || kind == Close)
        for (size_t j = 0; j < r.draft.size(); ++j)
          r.draft[j] = r.target[j] + (kind == Close ? 0.05f * r.draft[j] : 0.0f);
      for (size_t ti = 0; ti < std::size(tops); ++ti) {
        r.k = tops[ti].k;
        r.kq = tops[ti].kq;
        // Drafts: the drafter's first choice, another of its top few, the target's first choice, any id.
        r.drafts.assign(static_cast<size_t>(n), 0);
        for (int64_t i = 0; i < n; ++i) {
          const auto qt = host_top(r.draft.data() + i * V, V, std::min<int64_t>(r.kq, 8));
          const int how = static_cast<int>(rng() % 4);
          r.drafts[static_cast<size_t>(i)] =
              how == 0 ? qt[0]
              : how == 1 ? qt[rng() % qt.size()]
              : how == 2 ? host_top(r.target.data() + i * V, V, 1)[0]
                         : static_cast<int32_t>(rng() % V);
        }
        // lavapipe runs the one-thread shader over a whole 1000-candidate row in milliseconds: fewer
        // parameter sets and uniforms at the larger widths keep the test at a few seconds.
        const bool wide_top = r.k >= 40, whole = r.k == V;
        for (int pi = 0; pi < (wide_top ? 1 : 2); ++pi) {
          const Params& pr = params[(static_cast<size_t>(n + kind) + ti + 2 * static_cast<size_t>(pi)) % std::size(params)];
          r.t = pr.t, r.top_p = pr.top_p, r.min_p = pr.min_p;
          const size_t m = static_cast<size_t>(2 * n + 1);
          std::vector<std::vector<float>> us;
          for (float c : {0.0f, 0x1.fffffep-1f, 1.0f}) us.emplace_back(m, c);
          for (int s = 0; s < (whole ? 1 : 2); ++s) {
            us.emplace_back(m);
            for (float& x : us.back()) x = unit(rng);
          }
          // The first draft at its acceptance boundary u = (pd q_mass) / (qd p_mass), and the residual
          // draw at the running sums of r (the first draft rejected: u_accept = 1).
          const float inv_t = 1.0f / r.t;
          const HostRow p(r.target.data(), V, r.k, inv_t, r.top_p, r.min_p);
          const HostRow q(r.draft.data(), V, r.kq, inv_t, r.top_p, r.min_p);
          const int32_t d = r.drafts[0];
          const float pd = p.weight(d), qd = q.weight(d);
          auto around = [&](float at, size_t slot, float first) {
            for (float v : {std::nextafter(at, 0.0f), at, std::nextafter(at, 1.0f)}) {
              if (!(v >= 0.0f && v < 1.0f)) continue;
              us.emplace_back(m);
              for (float& x : us.back()) x = unit(rng);
              us.back()[0] = first;
              us.back()[slot] = v;
            }
          };
          if (qd > 0.0f) around(pd * q.set.mass / (qd * p.set.mass), 0, 0.0f);
          std::vector<float> rk;
          float total = 0.0f;
          for (size_t k = 0; k < p.set.keep; ++k) {
            const float diff = p.set.w[k] * q.set.mass - q.weight(p.top[k]) * p.set.mass;
            rk.push_back(diff >= std::numeric_limits<float>::min() ? diff : 0.0f);
            total += rk.back();
          }
          float cum = 0.0f;
          for (size_t k = 0; total > 0.0f && k < std::min<size_t>(rk.size(), whole ? 1 : 2); ++k) {
            cum += rk[k];
            around(cum / total, 1, 1.0f);
          }
          const auto want = accept_drafts_on(cpu(), r, us);
          const auto got = accept_drafts_on(vulkan(), r, us);
          ASSERT_EQ(want.size(), us.size());
          ASSERT_EQ(got.size(), us.size());
          for (size_t j = 0; j < us.size(); ++j) {
            EXPECT_EQ(got[j], want[j]) << fmt::format(
                "n {} {} logits, top {} / {}, t {} top_p {} min_p {}, uniforms [{}]", n, kind_names[kind], r.k, r.kq,
                r.t, r.top_p, r.min_p, fmt::join(us[j], ", "));
            ++compared;
            accepted[static_cast<size_t>(std::clamp(want[j][0], 0, 4))] += 1;
            const int64_t a = want[j][0];
            ASSERT_GE(a, 0);
            ASSERT_LE(a, n);
            for (int64_t e = 0; e < n + 2; ++e)
              EXPECT_EQ(want[j][static_cast<size_t>(e)] < 0, e > a + 1) << "the emitted tokens, then -1";
          }
          ++rounds;
        }
      }
    }
  }
  EXPECT_EQ(rounds, 4 * Kinds * (2 * 2 + 3));

  // A residual term below FLT_MIN counts as 0 on every device: p = q but for one weight just above
  // 2^-126 (logit -86.5 against the top's 0) that the drafter has a few ulps lower, so p w_1 q_mass -
  // q w_1 p_mass is subnormal; the rejected draft (token 0, u_accept = 1) is then replaced by the draw
  // from p itself (u_residual = 0: token 0), not from that one subnormal residual (token 1).
  {
    DraftRound r;
    r.n = 1;
    r.V = 16;
    r.k = r.kq = 4;
    r.target.assign(32, -200.0f);
    r.target[0] = 0.0f, r.target[1] = -86.5f;
    r.draft = std::vector<float>(r.target.begin(), r.target.begin() + 16);
    r.draft[1] = std::nextafter(-86.5f, -100.0f);
    r.drafts = {0};
    const std::vector<std::vector<float>> us{{1.0f, 0.0f, 0.5f}};
    const auto want = accept_drafts_on(cpu(), r, us), got = accept_drafts_on(vulkan(), r, us);
    EXPECT_EQ(want[0], (std::vector<int32_t>{0, 0, -1}));
    EXPECT_EQ(got[0], want[0]);
  }
  // The longest walk lavapipe's loop budget lets compile (4 drafts, top-p and min-p, 1578 candidates a
  // row; VulkanErrors.AcceptDraftsPastLavapipesLoopLimitIsRefused): flat logits keep nearly every
  // candidate, p = q accepts every draft and the bonus draw at u = 1 walks the whole set, about 37 K loop
  // iterations in all (1800 candidates, past 65535, gave another bonus token on lavapipe).
  {
    DraftRound r;
    r.n = 4;
    r.V = 2000;
    r.k = r.kq = 1578;
    r.target = test::random_floats(5 * 2000, 9, -0.01f, 0.01f);
    r.draft = std::vector<float>(r.target.begin(), r.target.begin() + 4 * 2000);
    for (int64_t i = 0; i < 4; ++i) r.drafts.push_back(host_top(r.target.data() + i * 2000, 2000, 1)[0]);
    r.top_p = 0.99999f;
    r.min_p = 0.05f;
    const std::vector<std::vector<float>> us{{0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 1.0f}};
    const auto want = accept_drafts_on(cpu(), r, us), got = accept_drafts_on(vulkan(), r, us);
    EXPECT_EQ(want[0][0], 4);
    EXPECT_EQ(got[0], want[0]);
  }
  EXPECT_GT(compared, 1000);
  // Every outcome was met: no draft accepted, some, and all of them.
  EXPECT_GT(accepted[0], 100);
  EXPECT_GT(accepted[1], 20);
  EXPECT_GT(accepted[4], 5);
}

TEST(VulkanOps, WriteRowsDecodeLoopAndPlanReuse) {
  REQUIRE_VULKAN();
  // The decode pattern over 6 steps with a ring of 4 slots: the same graph structure every step, so
  // the Vulkan backend replays one plan with new inputs; caches persist between runs.
  const int64_t S = 4, H = 2, D = 8;
  struct State {
    BackendTensorPtr kc, vc, pc;
  };
  auto step_graph = [&](State& st, int32_t p, Built& b) {
    auto k = test::random_floats(H * D, 100 + p), v = test::random_floats(H * D, 200 + p), q = test::random_floats(H * D, 300 + p);
    std::vector<int32_t> slot{p % static_cast<int32_t>(S)}, pos{p};
    Value sv = b.input(DType::I32, {1}, slot, "slot");
    Value pv = b.input(DType::I32, {1}, pos, "pos");
    Value K = b.g.write_rows(st.kc, b.input(DType::F32, {1, H, D}, k, "k"), sv);
    Value V = b.g.write_rows(st.vc, b.input(DType::F32, {1, H, D}, v, "v"), sv);
    Value P = b.g.write_rows(st.pc, pv, sv);
    b.out(b.g.attention(b.input(DType::F32, {1, H, D}, q, "q"), K, V, P, pv, 1.0f, 3, true));
    b.out(P);
  };
  State cs, vs;
  for (auto [st, be] : {std::pair{&cs, cpu()}, std::pair{&vs, vulkan()}}) {
    st->kc = be->allocate("k", DType::F16, {S, H, D});
    st->vc = be->allocate("v", DType::BF16, {S, H, D});
    st->pc = be->allocate("pos", DType::I32, {S});
    std::vector<int32_t> empty(S, -1);
    be->write(*st->pc, bytes_of(empty));
  }
  for (int32_t p = 0; p < 6; ++p) {
    auto want = run_on(cpu(), [&](Side&, Built& b) { step_graph(cs, p, b); });
    auto got = run_on(vulkan(), [&](Side&, Built& b) { step_graph(vs, p, b); });
    EXPECT_EQ(got.i[1], want.i[1]) << "positions after step " << p;
    test::expect_close(got.f[0], std::vector<double>(want.f[0].begin(), want.f[0].end()), 2e-6, 1e-5,
                       "decode step " + std::to_string(p));
  }
  std::vector<float> kv(S * H * D), kc(S * H * D);
  vulkan()->read(*vs.kc, std::as_writable_bytes(std::span<float>(kv)));
  cpu()->read(*cs.kc, std::as_writable_bytes(std::span<float>(kc)));
  EXPECT_EQ(kv, kc) << "F16 cache contents (rounded identically)";
}

TEST(VulkanOps, WeightsAboveTheBindingLimitRunInWindows) {
  REQUIRE_VULKAN();
  // max_binding_bytes lowers maxStorageBufferRange (128 MiB on lavapipe, more on GPUs) so the row
  // windows that large embeddings and output projections need are exercised on small weights.
  auto small = vulkan::make_vulkan_backend({{"max_binding_bytes", 65536}, {"cooperative_matrix", false}});
  for (DType type : {DType::F32, DType::Q8_0, DType::Q6_K}) {
    const int64_t O = 601, I = 256, E = 4, Oe = 37;
    auto packed = make_weight(type, O, I, 61);
    auto experts = make_weight(type, E * Oe, I, 62);
    // matmul_tiled over 32 rows, window by window: 400 rows of the weight keep its result in one binding.
    const int64_t Ot = 400;
    auto x32 = exact_activations(32 * I, 67);
    auto x = exact_activations(3 * I, 63);
    std::vector<int32_t> ids{600, 0, 250, 599, 7};
    std::vector<int32_t> eids{3, 0, 1, 3, 2, 1};
    auto build = [&](Side& s, Built& b) {
      Value w = b.g.constant(s.weight("w", type, {O, I}, packed));
      Value xv = b.input(DType::F32, {3, I}, x, "x");
      b.out(b.g.matmul(w, xv));
      b.out(b.g.get_rows(w, b.input(DType::I32, {5}, ids, "ids")));
      Value e = b.g.constant(s.weight("experts", type, {E, Oe, I}, experts));
      b.out(b.g.matmul_id(e, b.g.reshape(xv, {3, 1, I}), b.input(DType::I32, {3, 2}, eids, "eids")));
      const size_t tiled_bytes = packed.size() / static_cast<size_t>(O) * static_cast<size_t>(Ot);
      Value wt = b.g.constant(s.weight("wt", type, {Ot, I}, {packed.begin(), packed.begin() + static_cast<std::ptrdiff_t>(tiled_bytes)}));
      b.out(b.g.matmul(wt, b.input(DType::F32, {32, I}, x32, "x32")));
    };
    const Result want = run_on(cpu(), build), got = run_on(small.get(), build);
    for (size_t k = 0; k < want.f.size(); ++k)
      test::expect_close(got.f[k], std::vector<double>(want.f[k].begin(), want.f[k].end()), 1e-5, 1e-5,
                         std::string("windows ") + std::string(dtype_name(type)) + " output " + std::to_string(k));
  }
  // MLX: codes, scales and biases windowed alike. 5 bits in groups of 128 with BF16 scales: 160 code
  // bytes and 4 scale bytes a row, so windows hold multiples of 4 rows (4 experts of 61 rows) to keep
  // every section's offset aligned.
  const MlxRowParams p{5, 128, DType::BF16};
  const int64_t O = 601, I = 256, E = 8, Oe = 61;
  const MlxWeight w = make_mlx(p, O, I, 64), experts = make_mlx(p, E * Oe, I, 65);
  const MlxWeight wt = make_mlx(p, 480, I, 69);  // 2 windows of codes; 32 x 480 results fit one binding
  auto x = test::random_floats(3 * I, 66), x32 = test::random_floats(32 * I, 68);
  std::vector<int32_t> ids{600, 0, 407, 408, 599, 250};
  std::vector<int32_t> eids{7, 0, 3, 4, 5, 1};
  auto build = [&](Side& s, Built& b) {
    Value wv = b.g.constant(s.mlx_weight("w", {O, I}, w));
    Value xv = b.input(DType::F32, {3, I}, x, "x");
    b.out(b.g.matmul(wv, xv));
    b.out(b.g.get_rows(wv, b.input(DType::I32, {6}, ids, "ids")));
    Value e = b.g.constant(s.mlx_weight("experts", {E, Oe, I}, experts));
    b.out(b.g.matmul_id(e, b.g.reshape(xv, {3, 1, I}), b.input(DType::I32, {3, 2}, eids, "eids")));
    b.out(b.g.matmul(b.g.constant(s.mlx_weight("wt", {480, I}, wt)), b.input(DType::F32, {32, I}, x32, "x32")));
  };
  const Result want = run_on(cpu(), build), got = run_on(small.get(), build);
  for (size_t k = 0; k < want.f.size(); ++k)
    test::expect_close(got.f[k], std::vector<double>(want.f[k].begin(), want.f[k].end()), k == 1 ? 0 : 1e-5,
                       k == 1 ? 0 : 1e-5, "windows " + mlx_name(p) + " output " + std::to_string(k));
}

TEST(VulkanOps, SubgroupReductionsEqualSharedMemoryBitForBit) {
  REQUIRE_VULKAN();
  SKIP_UNDER_SANITIZERS();  // a second device and its shader compilation on lavapipe; no host code of its own
  // With `subgroups: false` every step of a row's reduction goes through shared memory. The shuffles
  // must add the same partial sums in the same order: equal bits, for 1 to 64 threads a row (widths of
  // 1 to 64 chunks; lavapipe's subgroups are 8 wide, so 16-64 mix both kinds of step), 1-8 rows, MatMulId.
  auto shared_only = vulkan::make_vulkan_backend({{"subgroups", false}, {"cooperative_matrix", false}});
  for (int64_t I : {32, 256, 768, 2048}) {
    const int64_t O = 19, N = 7, E = 3, Oe = 5;
    auto packed = make_weight(DType::Q8_0, O, I, 90);
    auto experts = make_weight(DType::F16, E * Oe, I, 91);
    auto x = test::random_floats(static_cast<size_t>(N * I), 92);
    std::vector<int32_t> eids{2, 0, 1, 1, 0, 2, 2};
    auto build = [&](Side& s, Built& b) {
      Value xv = b.input(DType::F32, {N, I}, x, "x");
      Value w = b.g.constant(s.weight("w", DType::Q8_0, {O, I}, packed));
      b.out(b.g.matmul(w, xv));
      b.out(b.g.matmul(w, b.g.slice(b.g.reshape(xv, {1, N * I}), 0, I)));  // one row
      Value e = b.g.constant(s.weight("experts", DType::F16, {E, Oe, I}, experts));
      b.out(b.g.matmul_id(e, b.g.reshape(xv, {N, 1, I}), b.input(DType::I32, {N, 1}, eids, "eids")));
    };
    const Result want = run_on(shared_only.get(), build), got = run_on(vulkan(), build);
    for (size_t k = 0; k < want.f.size(); ++k) EXPECT_EQ(got.f[k], want.f[k]) << "I=" << I << " output " << k;
  }
}

// lavapipe (llvmpipe) stops a shader invocation's loops after 65535 iterations and goes on with wrong
// values: attention over 8000 slots of head dim 256 did so before its inner loops went eight at a time
// and decode split its slots into chunks. What would still pass the limit (a 512-token prompt chunk
// over 30000 slots) is refused when the graph is compiled, with the context that fits; a GPU compiles
// the same graphs.
TEST(VulkanErrors, LoopsPastLavapipesLimitAreRefusedNotWrong) {
  REQUIRE_VULKAN();
  ComputeBackend* vk = vulkan();
  const bool llvmpipe = vk->device().name.find("llvmpipe") != std::string::npos;
  auto compile_error = [&](const std::function<void(Graph&)>& build) {
    Graph g;
    build(g);
    try {
      vk->compile(g);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  auto attention = [&](int64_t T, int64_t S) {
    return compile_error([&](Graph& g) {
      auto kc = vk->allocate("k_cache", DType::F16, {S, 1, 512});
      auto vc = vk->allocate("v_cache", DType::F16, {S, 1, 512});
      g.mark_output(g.attention(g.input(DType::F32, {T, 1, 512}, "q"), g.constant(kc), g.constant(vc),
                                g.input(DType::I32, {S}, "kpos"), g.input(DType::I32, {T}, "qpos"), 1.0f, 0, true));
    });
  };
  auto draw = [&](int64_t K) {
    return compile_error([&](Graph& g) {
      g.mark_output(g.top_p_draw(g.input(DType::F32, {K}, "logits"), g.input(DType::F32, {1}, "u"),
                                 g.input(DType::I32, {K}, "ids"), 1.0f, 0.9f, 0.0f));
    });
  };
  EXPECT_EQ(attention(512, 8192), "");  // a context the limit allows
  EXPECT_EQ(attention(1, 100000), "");  // decode: the slots split into chunks, each within the limit
  EXPECT_EQ(draw(4096), "");
  const std::string long_context = attention(512, 30000), whole_vocab = draw(262144);
  if (!llvmpipe) {
    EXPECT_EQ(long_context, "");
    EXPECT_EQ(whole_vocab, "");
    return;
  }
  for (const char* want : {"Vulkan backend: Attention '", "over 30000 cache slots (head dims 512 / 512) for 512 queries", "llvmpipe",
                           "65535 iterations", "use a context of at most", "backend: {plugin: cpu}"})
    EXPECT_NE(long_context.find(want), std::string::npos) << "missing '" << want << "' in: " << long_context;
  for (const char* want : {"TopPDraw", "over 262144 candidates", "top_k to at most 12000", "sampler.device: off"})
    EXPECT_NE(whole_vocab.find(want), std::string::npos) << "missing '" << want << "' in: " << whole_vocab;
}

// AcceptDrafts walks every row's TopK a few times in one thread, so a round over a whole 262144-token
// vocabulary (top-k off) would pass lavapipe's loop limit: it is refused when compiled, with the top_k
// that fits for that many drafts, and the suggested top_k compiles. A draft outside the vocabulary
// fails the run naming it, as on the CPU backend.
TEST(VulkanErrors, AcceptDraftsPastLavapipesLoopLimitIsRefused) {
  REQUIRE_VULKAN();
  ComputeBackend* vk = vulkan();
  const bool llvmpipe = vk->device().name.find("llvmpipe") != std::string::npos;
  // Inputs 0-5 (target, its top, draft, its top, drafts, uniforms), then the node "verdict".
  auto round = [](Graph& g, int64_t n, int64_t V, int64_t K, float top_p, float min_p) {
    const Value target = g.input(DType::F32, {n + 1, V}, "target"), target_top = g.input(DType::I32, {n + 1, K}, "target_top");
    const Value draft = g.input(DType::F32, {n, V}, "draft"), draft_top = g.input(DType::I32, {n, K}, "draft_top");
    const Value drafts = g.input(DType::I32, {n}, "drafts"), uniforms = g.input(DType::F32, {2 * n + 1}, "uniforms");
    Value v = g.accept_drafts(target, target_top, draft, draft_top, drafts, uniforms, 1.0f, top_p, min_p);
    g.mark_output(g.named(v, "verdict"));
    return v;
  };
  auto compile_error = [&](int64_t n, int64_t V, int64_t K) {
    Graph g;
    round(g, n, V, K, 0.9f, 0.05f);
    try {
      vk->compile(g);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  // 4 passes over K for each of the 9 rows, 2 K for the residual, 15 for the rest: at most 38 K + 15.
  EXPECT_EQ(compile_error(4, 1000, 1000), "");
  EXPECT_EQ(compile_error(4, 262144, 1578), "");
  const std::string over = compile_error(4, 262144, 1579), whole_vocab = compile_error(4, 262144, 262144);
  if (!llvmpipe) {
    EXPECT_EQ(over, "");
    EXPECT_EQ(whole_vocab, "");
  } else {
    EXPECT_NE(over.find("top_k to at most 1578 for 4 drafts"), std::string::npos) << over;
    for (const char* want : {"Vulkan backend: AcceptDrafts 'verdict'",
                             "of 4 drafts over top 262144 (target) and 262144 (drafter) candidates", "llvmpipe",
                             "65535 iterations", "top_k to at most 1578 for 4 drafts", "draft fewer tokens",
                             "sampler.device: off", "backend: {plugin: cpu}"})
      EXPECT_NE(whole_vocab.find(want), std::string::npos) << "missing '" << want << "' in: " << whole_vocab;
  }

  Graph g;
  const int64_t n = 2, V = 16, K = 4;
  Value out = round(g, n, V, K, 1.0f, 0.0f);
  const auto plan = vk->compile(g);
  const std::vector<float> target = test::random_floats((n + 1) * V, 5), draft = test::random_floats(n * V, 6),
                           u{0.5f, 0.5f, 0.5f, 0.5f, 0.5f};
  std::vector<int32_t> tt, dt;
  for (int64_t r = 0; r <= n; ++r) {
    for (int32_t t : host_top(target.data() + r * V, V, K)) tt.push_back(t);
    if (r < n)
      for (int32_t t : host_top(draft.data() + r * V, V, K)) dt.push_back(t);
  }
  auto run = [&](const std::vector<int32_t>& drafts) {
    RunInputs in;
    in.inputs = {{Value{0}, bytes_of(target)}, {Value{1}, bytes_of(tt)}, {Value{2}, bytes_of(draft)},
                 {Value{3}, bytes_of(dt)},     {Value{4}, bytes_of(drafts)}, {Value{5}, bytes_of(u)}};
    try {
      plan->run(in);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    std::vector<int32_t> o(n + 2);
    plan->read(out, std::as_writable_bytes(std::span<int32_t>(o)));
    return fmt::format("[{}]", fmt::join(o, ", "));
  };
  const std::string bad = run({3, 16});
  EXPECT_NE(bad.find("AcceptDrafts 'verdict': id 16 at index 1 is outside [0, 16)"), std::string::npos) << bad;
  EXPECT_EQ(run({3, 5}).rfind("[", 0), 0u);  // the error record is reset per run
}

TEST(VulkanErrors, BadOptionsDeviceAndIds) {
  REQUIRE_VULKAN();
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(message([] { vulkan::make_vulkan_backend({{"threads", 2}}); }).find("unknown option 'threads'"), std::string::npos);
  EXPECT_NE(message([] { vulkan::make_vulkan_backend({{"device", 99}}); }).find("'device' = 99"), std::string::npos);
  EXPECT_NE(message([] { vulkan::make_vulkan_backend({{"device", "no such gpu"}}); }).find("names none"), std::string::npos);
  EXPECT_NE(message([] { vulkan::make_vulkan_backend({{"device", -1}}); }).find("device index"), std::string::npos);
  EXPECT_NE(message([] { vulkan::make_vulkan_backend({{"subgroups", 1}}); }).find("'subgroups' = 1"), std::string::npos);

  ComputeBackend* vk = vulkan();
  EXPECT_TRUE(vk->supports(Op::MatMul, DType::Q4_K).ok);
  EXPECT_TRUE(vk->supports(Op::MatMul, DType::IQ4_NL).ok);
  const Support no = vk->supports(Op::MatMul, DType::I16);
  EXPECT_FALSE(no.ok);
  EXPECT_NE(no.reason.find("I16"), std::string::npos) << no.reason;
  EXPECT_FALSE(vk->supports(Op::Attention, DType::Q8_0).ok);

  Side s{vk, {}};
  // MLX affine weights decode as the weight of MatMul, MatMulId and GetRows only; a malformed one is
  // refused when loaded, naming it.
  for (Op op : {Op::MatMul, Op::MatMulId, Op::GetRows}) EXPECT_TRUE(vk->supports(op, DType::MLX_AFFINE).ok) << op_name(op);
  const Support no_mlx = vk->supports(Op::Add, DType::MLX_AFFINE);
  EXPECT_FALSE(no_mlx.ok);
  EXPECT_NE(no_mlx.reason.find("MLX affine weights only as the weight of MatMul, MatMulId and GetRows, not in Add"),
            std::string::npos) << no_mlx.reason;
  EXPECT_FALSE(vk->supports(Op::Attention, DType::MLX_AFFINE).ok);
  const MlxWeight mlx_ok = make_mlx({4, 32, DType::F16}, 4, 32, 5);
  MlxWeight mlx_bad = mlx_ok;
  mlx_bad.scales.resize(2);
  const std::string ml = message([&] { s.mlx_weight("blk.0.ffn_up.weight", {4, 32}, mlx_bad); });
  EXPECT_NE(ml.find("MLX weight 'blk.0.ffn_up.weight' [4, 32]: scales (2 bytes) and biases (8 bytes) must each have 8 bytes"),
            std::string::npos) << ml;
  mlx_bad = mlx_ok;
  mlx_bad.p.bits = 7;
  const std::string mb = message([&] { s.mlx_weight("blk.0.ffn_up.weight", {4, 32}, mlx_bad); });
  EXPECT_NE(mb.find("'blk.0.ffn_up.weight': bits 7 / group size 32 is not supported"), std::string::npos) << mb;
  {
    auto mw = s.mlx_weight("mlx_w", {4, 32}, mlx_ok);
    Graph g;
    Value x = g.input(DType::F32, {4, 32}, "x");
    g.mark_output(g.named(g.mul(x, g.constant(mw)), "scaled"));
    const std::string mm = message([&] { vk->compile(g); });
    EXPECT_NE(mm.find("Mul 'scaled': operand 'mlx_w' is MLX_AFFINE"), std::string::npos) << mm;
    EXPECT_NE(mm.find("not in Mul"), std::string::npos) << mm;
    Graph g1;
    auto f = s.weight("f", DType::F32, {5, 32}, test::encode(test::random_floats(160, 6), DType::F32));
    g1.mark_output(g1.named(g1.matmul(g1.constant(f), g1.constant(mw)), "y"));
    const std::string mx = message([&] { vk->compile(g1); });
    EXPECT_NE(mx.find("MLX affine weights are decoded only as the weight (first operand)"), std::string::npos) << mx;
  }
  std::vector<float> xs(32, 1.0f);

  Graph g2;
  Value ids = g2.input(DType::I32, {3}, "ids");
  auto table = s.weight("emb", DType::F32, {4, 32}, test::encode(test::random_floats(128, 3), DType::F32));
  g2.mark_output(g2.named(g2.get_rows(g2.constant(table), ids), "embed"));
  std::vector<int32_t> bad{1, 4, 0};
  const auto p2 = vk->compile(g2);
  const std::string m2 = message([&] { p2->run({{{ids, bytes_of(bad)}}}); });
  EXPECT_NE(m2.find("GetRows 'embed': id 4 at index 1 is outside [0, 4)"), std::string::npos) << m2;
  std::vector<int32_t> good{1, 3, 0};
  EXPECT_NO_THROW(p2->run({{{ids, bytes_of(good)}}}));  // the error record is reset per run

  const std::string m3 = message([&] { p2->run({{{ids, bytes_of(xs)}}}); });
  EXPECT_NE(m3.find("needs 12 bytes"), std::string::npos) << m3;
  Graph g3;
  Value x3 = g3.input(DType::F32, {2}, "x");
  g3.mark_output(g3.scale(x3, 2.0f));
  const auto p3 = vk->compile(g3);
  std::vector<float> two(2);
  const std::string m4 = message([&] { p3->read(Value{1}, std::as_writable_bytes(std::span<float>(two))); });
  EXPECT_NE(m4.find("before the graph has run"), std::string::npos) << m4;
}

TEST(VulkanDevice, InfoNamesTheDevice) {
  REQUIRE_VULKAN();
  const DeviceInfo d = vulkan()->device();
  EXPECT_NE(d.name.find("Vulkan 1."), std::string::npos) << d.name;
  EXPECT_GT(d.memory_bytes, 0u);
  EXPECT_EQ(vulkan()->name(), "vulkan");
}

// Weights share device allocations (a driver allows a few thousand) and reads and writes reuse one
// staging buffer: 300 weights take at most three vkAllocateMemory calls (blocks and the staging
// buffer), each still reads back its own values, and 20 round trips through a tensor allocate nothing.
TEST(VulkanDevice, WeightsShareAllocationsAndTransfersReuseStaging) {
  REQUIRE_VULKAN();
  auto be = vulkan::make_vulkan_backend(nlohmann::json::object());
  const uint64_t start = vulkan::vulkan_memory_allocations(*be);
  std::vector<BackendTensorPtr> weights;
  std::vector<std::vector<float>> values;
  for (int i = 0; i < 300; ++i) {
    values.push_back(test::random_floats(16 * 65, 700 + static_cast<uint32_t>(i)));
    TensorInfo info;
    info.name = "w" + std::to_string(i);
    info.shape = {16, 65};  // 4160 bytes: offsets inside a block are not multiples of the row size
    info.data = std::as_bytes(std::span<const float>(values.back()));
    weights.push_back(be->load_weight(info));
  }
  EXPECT_LE(vulkan::vulkan_memory_allocations(*be) - start, 3u);
  for (int i : {0, 1, 150, 299}) {
    std::vector<float> back(values[static_cast<size_t>(i)].size());
    be->read(*weights[static_cast<size_t>(i)], std::as_writable_bytes(std::span<float>(back)));
    EXPECT_EQ(back, values[static_cast<size_t>(i)]) << "weight " << i;
  }
  auto t = be->allocate("state", DType::F32, {4096});
  const uint64_t before = vulkan::vulkan_memory_allocations(*be);
  std::vector<float> x = test::random_floats(4096, 9), y(4096);
  for (int r = 0; r < 20; ++r) {
    be->write(*t, std::as_bytes(std::span<const float>(x)));
    be->read(*t, std::as_writable_bytes(std::span<float>(y)));
  }
  EXPECT_EQ(y, x);
  EXPECT_EQ(vulkan::vulkan_memory_allocations(*be), before);
}

}  // namespace
}  // namespace specula
