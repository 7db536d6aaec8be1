// Block codecs: scalar conversions against the compiler's _Float16, round trips of every block type
// with stated error bounds, MLX affine packing against an independent bit-stream reading.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdio>
#include <random>

#include "specula/error.hpp"
#include "specula/quant.hpp"

using namespace specula;

namespace {

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
uint32_t to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

std::vector<float> normal(size_t n, uint32_t seed, float sigma = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

double rel_rms(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0, s = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    e += (a[i] - b[i]) * double(a[i] - b[i]);
    s += a[i] * double(a[i]);
  }
  return std::sqrt(e / s);
}

}  // namespace

#if defined(__FLT16_MAX__)
TEST(Quant, Fp16MatchesCompilerFloat16) {
  for (uint32_t h = 0; h < 65536; ++h) {
    _Float16 ref;
    const uint16_t hb = static_cast<uint16_t>(h);
    std::memcpy(&ref, &hb, 2);
    const float f = fp16_to_fp32(hb);
    if (std::isnan(static_cast<float>(ref))) {
      EXPECT_TRUE(std::isnan(f));
      continue;
    }
    ASSERT_EQ(to_bits(f), to_bits(static_cast<float>(ref))) << h;
    ASSERT_EQ(fp32_to_fp16(f), hb) << h;  // exact values survive the round trip
  }
  std::mt19937 rng(1);
  for (int i = 0; i < 2000000; ++i) {
    // Random bit patterns cover subnormals, ties, overflow and NaN.
    const float f = from_bits(rng());
    const _Float16 ref = static_cast<_Float16>(f);
    uint16_t rb;
    std::memcpy(&rb, &ref, 2);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(f))));
      continue;
    }
    ASSERT_EQ(fp32_to_fp16(f), rb) << f;
  }
}
#endif

TEST(Quant, Bf16RoundsToNearestEven) {
  EXPECT_EQ(fp32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3F808000)), 0x3F80);  // tie, even stays
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3F818000)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(fp32_to_bf16(from_bits(0x3F808001)), 0x3F81);
  EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(from_bits(0x7F800001)))));  // NaN stays NaN
  EXPECT_EQ(bf16_to_fp32(0xC040), -3.0f);
}

struct Bound {
  DType type;
  double max_rel_rms;  // relative RMS error of quantize->dequantize on N(0,1) data
};

class RoundTrip : public ::testing::TestWithParam<Bound> {};

TEST_P(RoundTrip, ErrorWithinBound) {
  const Bound b = GetParam();
  const int64_t n = 256 * 16;
  const auto x = normal(n, 42);
  std::vector<std::byte> q(*dtype_row_bytes(b.type, n));
  quantize_row(b.type, x.data(), q.data(), n);
  std::vector<float> y(n);
  dequantize_row(b.type, q.data(), y.data(), n);
  const double err = rel_rms(x, y);
  std::printf("  %s relative RMS round-trip error %.5f (bound %.3f)\n", std::string(dtype_name(b.type)).c_str(), err,
              b.max_rel_rms);
  EXPECT_LT(err, b.max_rel_rms) << dtype_name(b.type);
  // Scaled data gives the same relative error (the codecs are scale-free up to f16 rounding).
  auto x2 = x;
  for (auto& v : x2) v *= 1e-3f;
  quantize_row(b.type, x2.data(), q.data(), n);
  dequantize_row(b.type, q.data(), y.data(), n);
  EXPECT_LT(rel_rms(x2, y), b.max_rel_rms * 1.05) << dtype_name(b.type);
  // All-zero rows decode to zeros.
  std::vector<float> z(n, 0.0f);
  quantize_row(b.type, z.data(), q.data(), n);
  dequantize_row(b.type, q.data(), y.data(), n);
  for (float v : y) ASSERT_EQ(v, 0.0f) << dtype_name(b.type);
}

// Bounds: a uniform b-bit quantizer over ~±3 sigma gives roughly 6/2^b/sqrt(12) relative RMS error;
// the bounds allow some slack for block maxima and scale quantization.
INSTANTIATE_TEST_SUITE_P(AllTypes, RoundTrip,
                         ::testing::Values(Bound{DType::F32, 1e-9}, Bound{DType::F16, 1e-3}, Bound{DType::BF16, 4e-3},
                                           Bound{DType::Q8_0, 0.01}, Bound{DType::Q6_K, 0.04},
                                           Bound{DType::Q5_0, 0.06}, Bound{DType::Q5_1, 0.05},
                                           Bound{DType::Q5_K, 0.05}, Bound{DType::Q4_0, 0.12},
                                           Bound{DType::Q4_1, 0.10}, Bound{DType::Q4_K, 0.10},
                                           Bound{DType::IQ4_NL, 0.10}, Bound{DType::IQ4_XS, 0.10}),
                         [](const auto& info) { return std::string(dtype_name(info.param.type)); });

TEST(Quant, RowLengthMustBeWholeBlocks) {
  std::vector<float> x(48);
  std::vector<std::byte> q(64);
  EXPECT_THROW(quantize_row(DType::Q4_0, x.data(), q.data(), 48), Error);
  EXPECT_THROW(dequantize_row(DType::Q4_K, q.data(), x.data(), 32), Error);
  EXPECT_THROW(dequantize_row(DType::MLX_AFFINE, q.data(), x.data(), 32), Error);
}

TEST(Quant, MlxPackingIsALittleEndianBitStream) {
  // Codes c_i = i mod 2^bits; read back bit by bit independently of the codec.
  for (uint32_t bits : {2u, 3u, 4u, 5u, 6u, 8u}) {
    const uint32_t gs = 32, n = 64;
    std::vector<float> w(n);
    for (uint32_t i = 0; i < n; ++i) w[i] = static_cast<float>(i % (1u << bits));
    // Force each group's range to the full code range so the quantizer picks scale 1, bias 0.
    const MlxRowParams p{bits, gs, DType::F32};
    std::vector<std::byte> packed(n * bits / 8);
    float scales[2], biases[2];
    // Make the min 0 and max 2^bits-1 in both groups.
    w[0] = 0.0f;
    w[gs - 1] = float((1u << bits) - 1);
    w[gs] = 0.0f;
    w[n - 1] = float((1u << bits) - 1);
    mlx_quantize_row(p, w.data(), n, packed.data(), scales, biases);
    for (uint32_t i = 0; i < n; ++i) {
      uint32_t code = 0;
      for (uint32_t b = 0; b < bits; ++b) {
        const uint32_t bit = i * bits + b;
        code |= ((static_cast<uint8_t>(packed[bit / 8]) >> (bit % 8)) & 1u) << b;
      }
      const float decoded = scales[i / gs] * code + biases[i / gs];
      ASSERT_NEAR(decoded, w[i], 1e-4) << "bits " << bits << " i " << i;
    }
    std::vector<float> y(n);
    mlx_dequantize_row(p, packed.data(), scales, biases, y.data(), n);
    for (uint32_t i = 0; i < n; ++i) ASSERT_NEAR(y[i], w[i], 1e-4) << "bits " << bits;
  }
}

TEST(Quant, MlxRoundTripAllBitsAndGroups) {
  const int64_t n = 512;
  const auto x = normal(n, 3);
  for (uint32_t bits : {2u, 3u, 4u, 5u, 6u, 8u})
    for (uint32_t gs : {32u, 64u, 128u})
      for (DType st : {DType::F32, DType::F16, DType::BF16}) {
        const MlxRowParams p{bits, gs, st};
        const size_t sb = dtype_traits(st)->block_bytes;
        std::vector<std::byte> packed(n * bits / 8), scales(n / gs * sb), biases(n / gs * sb);
        mlx_quantize_row(p, x.data(), n, packed.data(), scales.data(), biases.data());
        std::vector<float> y(n);
        mlx_dequantize_row(p, packed.data(), scales.data(), biases.data(), y.data(), n);
        // Each value is within half a step of its group's grid, except that MLX re-derives the scale
        // from the larger-magnitude edge (s = edge / rint(edge / s0)), which can clamp the far end of
        // the range by up to range / (2^bits) (|edge| >= range/2); plus the scale's storage rounding.
        for (int64_t g = 0; g < n / gs; ++g) {
          float lo = x[g * gs], hi = lo;
          for (uint32_t c = 0; c < gs; ++c) {
            lo = std::min(lo, x[g * gs + c]);
            hi = std::max(hi, x[g * gs + c]);
          }
          const float step = (hi - lo) / float((1u << bits) - 1);
          const float tol = 0.5f * step * 1.02f + (hi - lo) / float(1u << bits) + (st == DType::F32 ? 1e-5f : st == DType::F16 ? 2e-3f : 3e-2f) *
                                                       std::max(std::fabs(lo), std::fabs(hi));
          for (uint32_t c = 0; c < gs; ++c)
            ASSERT_NEAR(y[g * gs + c], x[g * gs + c], tol) << "bits " << bits << " gs " << gs << " " << dtype_name(st);
        }
      }
  const MlxRowParams bad{7, 64, DType::F16};
  std::vector<float> y(n);
  EXPECT_THROW(mlx_dequantize_row(bad, x.data(), x.data(), x.data(), y.data(), n), Error);
}
