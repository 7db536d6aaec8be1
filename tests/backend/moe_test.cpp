// Mixture-of-experts products on the CPU backend: MatMulId over packed experts (CpuTensor::packed with one
// group of panels per expert; GGUF types and MLX 4-bit) gives, bit for bit, what MatMul gives on that
// expert's matrix alone, whatever the number of rows that select the expert; with pack_weights off, what
// the unpacked MatMul gives (below 16 rows, where the unpacked tiles' bits do not depend on the row count
// either).
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <string>
#include <vector>

#include "test_util.hpp"

namespace specula {
namespace {

// `rows` rows of I values at w as a weight of `shape` in `type`; MLX_AFFINE: 4 bits in groups of 64 with bf16
// scales (mlx-community's layout). Quantized row by row, so a slice of rows quantizes to a slice of bytes.
BackendTensorPtr weight(test::Fixture& fx, const std::string& name, DType type, Shape shape, const float* w,
                        int64_t rows, int64_t I) {
  if (type != DType::MLX_AFFINE) {
    const size_t rb = *dtype_row_bytes(type, static_cast<uint64_t>(I));
    std::vector<std::byte> q(rb * static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) quantize_row(type, w + r * I, q.data() + r * rb, I);
    return fx.weight(name, type, std::move(shape), std::move(q));
  }
  const MlxRowParams p{4, 64, DType::BF16};
  const size_t cb = static_cast<size_t>(I) / 2, sb = static_cast<size_t>(I / 64) * 2;
  auto codes = std::make_shared<std::vector<std::byte>>(cb * rows);
  auto scales = std::make_shared<std::vector<std::byte>>(sb * rows);
  auto biases = std::make_shared<std::vector<std::byte>>(sb * rows);
  for (int64_t r = 0; r < rows; ++r)
    mlx_quantize_row(p, w + r * I, I, codes->data() + r * cb, scales->data() + r * sb, biases->data() + r * sb);
  fx.storage.insert(fx.storage.end(), {codes, scales, biases});
  TensorInfo info;
  info.name = name;
  info.type = DType::MLX_AFFINE;
  info.shape = std::move(shape);
  info.data = std::span<const std::byte>(*codes);
  info.quant = {p.bits, p.group_size, p.scale_type, std::span<const std::byte>(*scales),
                std::span<const std::byte>(*biases)};
  return fx.backend->load_weight(info);
}

std::string type_name(DType t) { return t == DType::MLX_AFFINE ? "MLX4" : std::string(dtype_name(t)); }

class PackedExperts : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(PackedExperts, MatMulIdEqualsMatMulPerExpert) {
  const auto [type, pack] = GetParam();
  test::Fixture fx;
  fx.backend = cpu::make_cpu_backend({{"threads", 2}, {"pack_weights", pack}});
  const int64_t E = 5, I = 512, K = 2;
  // O = 32: whole panels; 24 and 7: each expert's last panel padded; 400: enough work that both threads
  // share the one pass over the selected experts, a share starting inside an expert.
  for (int64_t O : {32, 24, 7, 400}) {
    auto w = test::random_floats(static_cast<size_t>(E * O * I), 41 + static_cast<uint32_t>(O));
    auto experts = weight(fx, "experts", type, {E, O, I}, w.data(), E * O, I);
    // Each expert alone, as a matrix of its own (packed on its own when pack is on).
    std::vector<BackendTensorPtr> alone;
    for (int64_t e = 0; e < E; ++e)
      alone.push_back(weight(fx, "expert" + std::to_string(e), type, {O, I}, w.data() + e * O * I, O, I));
    // N = 20 gives some expert 16 rows and more (the prefill row count of unpacked weights). Unpacked
    // weights round differently from 16 rows on (docs/backends.md), so there only N up to 5 (at most 10
    // rows on either side) is held to the bits of MatMul.
    for (int64_t N : {1, 2, 5, 20}) {
      if (!pack && N > 5) continue;
      for (bool shared : {true, false}) {
        const int64_t xk = shared ? 1 : K;
        auto x = test::random_floats(static_cast<size_t>(N * xk * I), 50 + static_cast<uint32_t>(N));
        std::vector<int32_t> ids(static_cast<size_t>(N * K));
        // Distinct experts per row (top-k), spread unevenly: expert 0 in every row, the rest in turn.
        for (int64_t n = 0; n < N; ++n) {
          ids[static_cast<size_t>(n * K)] = static_cast<int32_t>((n * 3) % E);
          ids[static_cast<size_t>(n * K + 1)] = static_cast<int32_t>((n * 3) % E == 0 ? 1 + n % (E - 1) : 0);
        }
        Graph g;
        Value xv = g.input(DType::F32, {N, xk, I}, "x");
        Value iv = g.input(DType::I32, {N, K}, "ids");
        Value y = g.matmul_id(g.constant(experts), xv, iv);
        g.mark_output(y);
        // Every x row against every expert alone.
        Value xa = g.reshape(xv, {N * xk, I});
        std::vector<Value> ref;
        for (int64_t e = 0; e < E; ++e) {
          ref.push_back(g.matmul(g.constant(alone[static_cast<size_t>(e)]), xa));
          g.mark_output(ref.back());
        }
        fx.run(g, {{{xv, test::bytes_of(x)}, {iv, test::bytes_of(ids)}}});
        const auto got = fx.read_f32(g, y);
        std::vector<std::vector<float>> want;
        for (int64_t e = 0; e < E; ++e) want.push_back(fx.read_f32(g, ref[static_cast<size_t>(e)]));
        const std::string what = type_name(type) + (pack ? " packed" : " unpacked") +
                                 " O=" + std::to_string(O) + " N=" + std::to_string(N) +
                                 (shared ? " shared x" : " per-slot x");
        int mismatches = 0;
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = 0; k < K; ++k) {
            const int64_t e = ids[static_cast<size_t>(n * K + k)], xr = n * xk + (shared ? 0 : k);
            for (int64_t o = 0; o < O; ++o) {
              const float a = got[static_cast<size_t>((n * K + k) * O + o)];
              const float b = want[static_cast<size_t>(e)][static_cast<size_t>(xr * O + o)];
              if (std::bit_cast<uint32_t>(a) != std::bit_cast<uint32_t>(b) && mismatches++ < 3)
                ADD_FAILURE() << what << ": row (" << n << ", " << k << ") expert " << e << " output " << o << " is "
                              << a << ", MatMul of the expert alone gives " << b;
            }
          }
        EXPECT_EQ(mismatches, 0) << what;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, PackedExperts,
                         ::testing::Combine(::testing::Values(DType::Q8_0, DType::Q4_0, DType::Q5_1, DType::Q5_0, DType::IQ4_NL, DType::IQ4_XS, DType::Q4_K,
                                                              DType::Q6_K, DType::MLX_AFFINE),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return type_name(std::get<0>(info.param)) + (std::get<1>(info.param) ? "_packed" : "_unpacked");
                         });

// Packed and unpacked experts compute the same products up to rounding (the packed panels round
// differently from the tiles, docs/backends.md), so the packed layout holds the right rows.
TEST(PackedExpertsRounding, CloseToUnpacked) {
  for (DType type : {DType::Q8_0, DType::Q4_0, DType::Q5_0, DType::IQ4_XS, DType::Q4_K, DType::Q6_K}) {
    const int64_t E = 3, O = 24, I = 256, N = 4, K = 2;
    const size_t rb = *dtype_row_bytes(type, static_cast<uint64_t>(I));
    auto w = test::random_floats(static_cast<size_t>(E * O * I), 61);
    std::vector<std::byte> q(rb * static_cast<size_t>(E * O));
    for (int64_t r = 0; r < E * O; ++r) quantize_row(type, w.data() + r * I, q.data() + r * rb, I);
    auto x = test::random_floats(static_cast<size_t>(N * I), 62);
    const std::vector<int32_t> ids{2, 0, 1, 2, 0, 1, 2, 1};
    std::vector<float> out[2];
    for (bool pack : {false, true}) {
      test::Fixture fx;
      fx.backend = cpu::make_cpu_backend({{"threads", 2}, {"pack_weights", pack}});
      auto experts = fx.weight("experts", type, {E, O, I}, q);
      Graph g;
      Value xv = g.input(DType::F32, {N, 1, I}, "x");
      Value iv = g.input(DType::I32, {N, K}, "ids");
      Value y = g.matmul_id(g.constant(experts), xv, iv);
      g.mark_output(y);
      fx.run(g, {{{xv, test::bytes_of(x)}, {iv, test::bytes_of(ids)}}});
      out[pack] = fx.read_f32(g, y);
    }
    std::vector<double> want(out[0].begin(), out[0].end());
    test::expect_close(out[1], want, 0.02, 1e-3, std::string(dtype_name(type)) + " packed vs unpacked experts");
  }
}

}  // namespace
}  // namespace specula
