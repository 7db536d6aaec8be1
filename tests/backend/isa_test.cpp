// The CPU backend's kernel sets (plugins/cpu/isa.hpp) called directly: every set this CPU runs gives
// bit-identical products (few rows and prompt chunks), an activation row's result does not depend on how
// many rows below kPrefillRows share the call
// (so a speculative verification batch scores a token exactly as a single decode step does), and the
// products equal "dequantize with the SDK codec, multiply in double" within the 8-bit activation error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "isa.hpp"
#include "specula/dtype.hpp"
#include "specula/quant.hpp"

namespace specula {
namespace {

using cpu::KernelSet;

struct Product {
  DType type;
  int64_t O, I;
  std::vector<std::byte> w;
  size_t row_bytes;
  std::vector<float> x;  // [rows, I]
};

Product make(DType type, int64_t O, int64_t I, int64_t rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  Product p{type, O, I, {}, *dtype_row_bytes(type, static_cast<uint64_t>(I)), {}};
  p.w.resize(p.row_bytes * static_cast<size_t>(O));
  std::vector<float> row(static_cast<size_t>(I));
  for (int64_t o = 0; o < O; ++o) {
    for (auto& v : row) v = dist(rng);
    quantize_row(type, row.data(), p.w.data() + static_cast<size_t>(o) * p.row_bytes, I);
  }
  p.x.resize(static_cast<size_t>(rows * I));
  for (auto& v : p.x) v = dist(rng);
  return p;
}

// Activation rows [rows, I] as the records the kernel reads, record_bytes(I) apart.
std::vector<std::byte> records(const cpu::QuantKernel& q, const float* x, int64_t rows, int64_t I) {
  const size_t stride = q.record_bytes(I);
  std::vector<std::byte> rec(stride * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) q.quantize(x + r * I, I, rec.data() + static_cast<size_t>(r) * stride);
  return rec;
}

// y[rows, O] through one kernel set, as the backend calls it.
std::vector<float> run(const KernelSet& ks, const Product& p, int64_t row0, int64_t rows) {
  std::vector<float> y(static_cast<size_t>(rows * p.O), std::nanf(""));
  const float* x = p.x.data() + row0 * p.I;
  const cpu::QuantKernel* q = cpu::quant_kernel(ks, p.type);
  if (q) {
    const size_t stride = q->record_bytes(p.I);
    const std::vector<std::byte> rec = records(*q, x, rows, p.I);
    const cpu::RowsKernel k = rows >= cpu::kPrefillRows && q->prefill ? q->prefill : q->rows;
    k(p.w.data(), p.row_bytes, p.O, rec.data(), stride, rows, p.I, y.data(), p.O);
  } else {
    cpu::RowsKernel k = p.type == DType::F32 ? ks.f32 : p.type == DType::F16 ? ks.f16 : ks.bf16;
    k(p.w.data(), p.row_bytes, p.O, reinterpret_cast<const std::byte*>(x), static_cast<size_t>(p.I) * 4, rows, p.I,
      y.data(), p.O);
  }
  return y;
}

std::vector<const KernelSet*> sets() {
  std::vector<const KernelSet*> out;
  for (cpu::Isa i : cpu::supported_isas()) out.push_back(&cpu::select_kernels(cpu::isa_name(i)));
  return out;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, 4) == 0; }

class KernelSets : public ::testing::TestWithParam<DType> {};

TEST_P(KernelSets, BitIdenticalAcrossSetsAndBatchSizes) {
  const DType type = GetParam();
  const bool k_quant = type == DType::Q4_K || type == DType::Q5_K || type == DType::Q6_K || type == DType::IQ4_XS;
  // 37 weight rows: tiles of 4 and a remainder; 125 blocks of 32 (an odd count: AVX-512's half step; long
  // enough that several activation rows go in column chunks) or 3 super-blocks; 29 = 16 + 13 floats leave
  // a scalar tail.
  const int64_t I = k_quant ? 768 : dtype_traits(type)->quantized ? 4000 : 29 * 16 + 13;
  const int64_t rows = 11, prompt = 2 * cpu::kPrefillRows + 3;  // few rows; a prompt chunk (prefill kernels)
  const Product p = make(type, 37, I, prompt, 17);
  const auto all = sets();
  ASSERT_FALSE(all.empty());
  const std::vector<float> ref = run(*all[0], p, 0, rows);
  const std::vector<float> ref_prompt = run(*all[0], p, 0, prompt);
  for (const KernelSet* ks : all) {
    const std::vector<float> y = run(*ks, p, 0, prompt);
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_TRUE(same_bits(y[i], ref_prompt[i])) << ks->name << " vs " << all[0]->name << ", " << dtype_name(type)
                                                  << " prompt of " << prompt << " rows, element " << i;
  }
  for (const KernelSet* ks : all) {
    for (int64_t batch : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{9}, rows}) {
      for (int64_t r0 = 0; r0 + batch <= rows; r0 += batch) {
        const std::vector<float> y = run(*ks, p, r0, batch);
        for (int64_t r = 0; r < batch; ++r)
          for (int64_t o = 0; o < p.O; ++o) {
            const float a = y[static_cast<size_t>(r * p.O + o)], b = ref[static_cast<size_t>((r0 + r) * p.O + o)];
            ASSERT_TRUE(same_bits(a, b)) << ks->name << " vs " << all[0]->name << ", " << dtype_name(type) << " batch "
                                         << batch << " row " << r0 + r << " col " << o << ": " << a << " != " << b;
          }
      }
    }
  }
  // Against the dequantized weights in double: the activations' 8-bit rounding bounds the error.
  std::vector<float> wrow(static_cast<size_t>(I));
  const bool quant = dtype_traits(type)->quantized;
  double worst = 0;
  for (int64_t o = 0; o < p.O; ++o) {
    dequantize_row(type, p.w.data() + static_cast<size_t>(o) * p.row_bytes, wrow.data(), I);
    for (int64_t r = 0; r < prompt; ++r) {
      double s = 0, mag = 0;
      for (int64_t i = 0; i < I; ++i) {
        s += double(wrow[i]) * p.x[r * I + i];
        mag += std::abs(double(wrow[i]) * p.x[r * I + i]);
      }
      worst = std::max(worst, std::abs(ref_prompt[static_cast<size_t>(r * p.O + o)] - s) / mag);
      if (r < rows) worst = std::max(worst, std::abs(ref[static_cast<size_t>(r * p.O + o)] - s) / mag);
    }
  }
  EXPECT_LT(worst, quant ? 1e-2 : 1e-6) << dtype_name(type) << ": error relative to sum |w x|";
}

// Packed weights (QuantKernel::pack): every row count gives the same bits, on every set, for a matrix whose
// last panel is partial, split into shares of whole panels as the backend splits it. Q8_0 / Q4_0 / Q5_0 /
// IQ4_NL / IQ4_XS panels give the prefill panels' bits; the K-quant panels and the affine ones (Q4_1, Q5_1:
// no prefill panels, their prompts go to the float GEMM) their own, within the 8-bit activation error of
// the dequantized weights.
class PackedKernels : public ::testing::TestWithParam<DType> {};

TEST_P(PackedKernels, EveryRowCountGivesTheSameBits) {
  const DType type = GetParam();
  const bool k_quant = type == DType::Q4_K || type == DType::Q5_K || type == DType::Q6_K;
  const bool super_blocks = k_quant || type == DType::IQ4_XS;  // 256-value super-blocks
  const int64_t O = 3 * cpu::kPanelRows + 5, I = super_blocks ? 256 * 5 : 32 * 37;
  const int64_t rows = 2 * cpu::kPrefillRows + 3;
  const Product p = make(type, O, I, rows, 23);
  const auto all = sets();
  std::vector<float> ref;
  for (const KernelSet* ks : all) {
    const cpu::QuantKernel* q = cpu::quant_kernel(*ks, type);
    ASSERT_TRUE(q && q->pack && q->packed && q->panel_bytes) << ks->name << " packs " << dtype_name(type);
    const size_t pb = q->panel_bytes(I);
    const int64_t panels = (O + cpu::kPanelRows - 1) / cpu::kPanelRows;
    std::vector<std::byte> packed(pb * static_cast<size_t>(panels));
    q->pack(p.w.data(), p.row_bytes, O, I, packed.data());
    const size_t stride = q->record_bytes(I);
    const std::vector<std::byte> rec = records(*q, p.x.data(), rows, I);
    if (ref.empty()) {
      ref.resize(static_cast<size_t>(rows * O));
      if (k_quant || !q->prefill)
        q->packed(packed.data(), pb, O, rec.data(), stride, rows, I, ref.data(), O);
      else
        q->prefill(p.w.data(), p.row_bytes, O, rec.data(), stride, rows, I, ref.data(), O);
    }
    for (int64_t batch = 1; batch <= rows; ++batch)
      for (int64_t r0 = 0; r0 + batch <= rows; r0 += batch) {
        std::vector<float> y(static_cast<size_t>(batch * O), std::nanf(""));
        // Two shares: panel 0, then the rest.
        const std::byte* x = rec.data() + static_cast<size_t>(r0) * stride;
        q->packed(packed.data(), pb, cpu::kPanelRows, x, stride, batch, I, y.data(), O);
        q->packed(packed.data() + pb, pb, O - cpu::kPanelRows, x, stride, batch, I, y.data() + cpu::kPanelRows, O);
        for (int64_t r = 0; r < batch; ++r)
          for (int64_t o = 0; o < O; ++o) {
            const float a = y[static_cast<size_t>(r * O + o)], b = ref[static_cast<size_t>((r0 + r) * O + o)];
            ASSERT_TRUE(same_bits(a, b)) << ks->name << ", " << dtype_name(type) << " batch " << batch << " row "
                                         << r0 + r << " col " << o << ": " << a << " != " << b;
          }
      }
  }
  // Against the dequantized weights in double: the activations' 8-bit rounding bounds the error.
  std::vector<float> wrow(static_cast<size_t>(I));
  double worst = 0;
  for (int64_t o = 0; o < O; ++o) {
    dequantize_row(type, p.w.data() + static_cast<size_t>(o) * p.row_bytes, wrow.data(), I);
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0, mag = 0;
      for (int64_t i = 0; i < I; ++i) {
        s += double(wrow[i]) * p.x[r * I + i];
        mag += std::abs(double(wrow[i]) * p.x[r * I + i]);
      }
      worst = std::max(worst, std::abs(ref[static_cast<size_t>(r * O + o)] - s) / mag);
    }
  }
  EXPECT_LT(worst, 1e-2) << dtype_name(type) << ": error relative to sum |w x|";
}

INSTANTIATE_TEST_SUITE_P(Types, PackedKernels, ::testing::Values(DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                                                                  DType::Q5_1, DType::IQ4_NL, DType::IQ4_XS, DType::Q4_K,
                                                                  DType::Q5_K, DType::Q6_K),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

INSTANTIATE_TEST_SUITE_P(Types, KernelSets,
                         ::testing::Values(DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::IQ4_NL,
                                           DType::IQ4_XS, DType::Q4_K,
                                           DType::Q5_K, DType::Q6_K, DType::F32, DType::F16, DType::BF16),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// The K-quants' activation records (Q4_K / Q5_K / Q6_K) hold, per 256 values, d = max |x| / 127, the codes
// x / d rounded to nearest even, the sums of each 16 and each 32 codes: here in scalar code, against every
// set's vector code, byte for byte. The row holds an all-zero super-block and exact ties (x / d = k + 0.5).
TEST(KernelSets, KQuantActivationRecordsAreExact) {
  constexpr int64_t I = 1024;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 3.0f);
  std::vector<float> x(I);
  for (auto& v : x) v = dist(rng);
  for (int64_t i = 256; i < 512; ++i) x[static_cast<size_t>(i)] = 0.0f;
  x[512] = 127.0f;  // d = 1 in the third super-block: its halves are ties
  for (int64_t i = 513; i < 768; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i % 64 - 32) + 0.5f;
  // The scalar definition.
  const size_t bytes = cpu::select_kernels("auto").q4_k.record_bytes(I);
  std::vector<std::byte> want(bytes);
  auto* q = reinterpret_cast<int8_t*>(want.data());
  auto* scale = reinterpret_cast<float*>(want.data() + I);
  auto* bsums = reinterpret_cast<int16_t*>(want.data() + I + I / 64);
  auto* bsums32 = reinterpret_cast<int16_t*>(want.data() + I + I / 64 + I / 8);
  for (int64_t b = 0; b < I / 256; ++b) {
    float amax = 0.0f;
    for (int64_t i = 256 * b; i < 256 * b + 256; ++i) amax = std::fmax(amax, std::fabs(x[static_cast<size_t>(i)]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    scale[b] = d;
    for (int64_t g = 0; g < 16; ++g) {
      int sum = 0;
      for (int64_t i = 256 * b + 16 * g; i < 256 * b + 16 * g + 16; ++i) {
        const int c = static_cast<int>(std::nearbyint(x[static_cast<size_t>(i)] * id));
        q[i] = static_cast<int8_t>(c);
        sum += c;
      }
      bsums[16 * b + g] = static_cast<int16_t>(sum);
    }
    for (int64_t g = 0; g < 8; ++g) bsums32[8 * b + g] = static_cast<int16_t>(bsums[16 * b + 2 * g] + bsums[16 * b + 2 * g + 1]);
  }
  EXPECT_EQ(q[513], static_cast<int8_t>(-30)) << "-30.5 rounds to even";
  EXPECT_EQ(q[514], static_cast<int8_t>(-30)) << "-29.5 rounds to even";
  for (const KernelSet* ks : sets())
    for (const cpu::QuantKernel* k : {&ks->q4_k, &ks->q5_k, &ks->q6_k}) {
      std::vector<std::byte> got(bytes, std::byte{0x5a});
      k->quantize(x.data(), I, got.data());
      for (size_t i = 0; i < I + I / 64 + I / 8 + I / 16; ++i)
        ASSERT_EQ(got[i], want[i]) << ks->name << ": byte " << i << " of the record";
    }
}

TEST(KernelSelection, NamesWhatTheCpuRuns) {
  EXPECT_EQ(std::string(cpu::select_kernels("avx2").name), "avx2");
  EXPECT_EQ(std::string(cpu::select_kernels("auto").name), cpu::isa_name(cpu::supported_isas().back()));
  try {
    cpu::select_kernels("sse2");
    FAIL() << "an unknown kernel set must be refused";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("expected auto, avx2 or avx512"), std::string::npos) << e.what();
  }
}


// MLX affine weights (4 and 8 bits, groups of 32 / 64 / 128, f16 / bf16 / f32 scales) through the
// AffineKernel of every set: the same bits across sets and batch sizes, and float accuracy (MLX keeps its
// activations in float) against "dequantize with the SDK, multiply in double".
struct MlxCase {
  uint32_t bits, group;
  DType scale_type;
};

// A random MLX matrix and activation rows.
struct MlxProduct {
  MlxCase c;
  int64_t O, I, rows;
  size_t code_bytes, scale_bytes;
  std::vector<std::byte> codes, scales, biases;
  std::vector<float> x;  // [rows, I]

  MlxProduct(MlxCase mc, int64_t o, int64_t i, int64_t n) : c(mc), O(o), I(i), rows(n) {
    code_bytes = static_cast<size_t>(I) * c.bits / 8;
    scale_bytes = static_cast<size_t>(I / c.group) * (c.scale_type == DType::F32 ? 4 : 2);
    codes.resize(code_bytes * O), scales.resize(scale_bytes * O), biases.resize(scale_bytes * O);
    std::mt19937 rng(23);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> row(static_cast<size_t>(I));
    for (int64_t r = 0; r < O; ++r) {
      for (auto& v : row) v = dist(rng);
      mlx_quantize_row(params(), row.data(), I, codes.data() + r * code_bytes, scales.data() + r * scale_bytes,
                       biases.data() + r * scale_bytes);
    }
    x.resize(static_cast<size_t>(rows * I));
    for (auto& v : x) v = dist(rng);
  }
  MlxRowParams params() const { return {c.bits, c.group, c.scale_type}; }
  cpu::AffineMatrix matrix() const {
    cpu::AffineMatrix m;
    m.codes = codes.data();
    m.code_bytes = code_bytes;
    m.scales = scales.data();
    m.biases = biases.data();
    m.scale_bytes = scale_bytes;
    m.group_size = static_cast<int>(c.group);
    m.scale_type = c.scale_type == DType::F16    ? cpu::AffineMatrix::Scale::f16
                   : c.scale_type == DType::BF16 ? cpu::AffineMatrix::Scale::bf16
                                                 : cpu::AffineMatrix::Scale::f32;
    return m;
  }
  // Activation rows [r0, r0 + n) as `write` records them, stride apart.
  std::vector<std::byte> records(cpu::QuantizeKernel write, size_t stride, int64_t r0, int64_t n) const {
    std::vector<std::byte> rec(stride * static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) write(x.data() + (r0 + r) * I, I, rec.data() + r * stride);
    return rec;
  }
  // The worst error of y [rows, O] against the dequantized weights in double, relative to sum |w x|.
  double worst_error(const std::vector<float>& y) const {
    double worst = 0;
    std::vector<float> w(static_cast<size_t>(I));
    for (int64_t o = 0; o < O; ++o) {
      mlx_dequantize_row(params(), codes.data() + o * code_bytes, scales.data() + o * scale_bytes,
                         biases.data() + o * scale_bytes, w.data(), I);
      for (int64_t r = 0; r < rows; ++r) {
        double s = 0, mag = 0;
        for (int64_t i = 0; i < I; ++i) {
          s += double(w[i]) * x[r * I + i];
          mag += std::abs(double(w[i]) * x[r * I + i]);
        }
        worst = std::max(worst, std::abs(y[r * O + o] - s) / mag);
      }
    }
    return worst;
  }
};

class MlxKernelSets : public ::testing::TestWithParam<MlxCase> {};

TEST_P(MlxKernelSets, BitIdenticalAcrossSetsAndBatchSizes) {
  const MlxProduct p(GetParam(), 37, 128 * 31, 11);
  auto run = [&](const KernelSet& ks, int64_t r0, int64_t n) {
    const cpu::AffineKernel& k = p.c.bits == 4 ? ks.mlx4 : ks.mlx8;
    const size_t stride = k.record_bytes(p.I);
    const std::vector<std::byte> rec = p.records(k.prepare, stride, r0, n);
    std::vector<float> y(static_cast<size_t>(n * p.O), std::nanf(""));
    k.rows(p.matrix(), p.O, rec.data(), stride, n, p.I, y.data(), p.O);
    return y;
  };
  const auto all = sets();
  ASSERT_FALSE(all.empty());
  const std::vector<float> ref = run(*all[0], 0, p.rows);
  for (const KernelSet* ks : all)
    for (int64_t batch : {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{4}, int64_t{5}, p.rows})
      for (int64_t r0 = 0; r0 + batch <= p.rows; r0 += batch) {
        const std::vector<float> y = run(*ks, r0, batch);
        for (int64_t i = 0; i < batch * p.O; ++i)
          ASSERT_TRUE(same_bits(y[i], ref[r0 * p.O + i]))
              << ks->name << " vs " << all[0]->name << ", batch " << batch << " element " << r0 * p.O + i;
      }
  EXPECT_LT(p.worst_error(ref), 1e-5) << "error relative to sum |w x|";
}

// The packed panels of 4-bit weights with 16-bit scales (AffineKernel::pack): every row count gives the same
// bits on every set, for a matrix whose last panel is partial, split into shares of whole panels as the
// backend splits it; within the 8-bit activation error of the dequantized weights. 8 bits and f32 scales
// have no panels (the backend keeps the float tiles: CpuTensor::packed).
class MlxPackedKernels : public ::testing::TestWithParam<MlxCase> {};

TEST_P(MlxPackedKernels, EveryRowCountGivesTheSameBits) {
  const MlxCase c = GetParam();
  const int64_t O = 3 * cpu::kPanelRows + 5;
  const MlxProduct p(c, O, c.group * 21, 2 * cpu::kPrefillRows + 3);  // 21 groups: a partial last group of 4 blocks
  const cpu::AffineMatrix m = p.matrix();
  std::vector<float> ref;
  for (const KernelSet* ks : sets()) {
    const cpu::AffineKernel& k = ks->mlx4;
    ASSERT_TRUE(k.pack && k.packed && k.quantize) << ks->name;
    const size_t pb = k.panel_bytes(p.I, m.group_size);
    EXPECT_EQ(pb, cpu::kPanelRows * (p.code_bytes + 2 * p.scale_bytes)) << "a panel holds what the file holds";
    std::vector<std::byte> panels(pb * static_cast<size_t>((O + cpu::kPanelRows - 1) / cpu::kPanelRows));
    k.pack(m, O, p.I, panels.data());
    const size_t stride = k.quantized_bytes(p.I);
    cpu::AffineMatrix packed = m;
    packed.codes = panels.data();
    packed.code_bytes = pb;
    const std::vector<std::byte> rec = p.records(k.quantize, stride, 0, p.rows);
    if (ref.empty()) {
      ref.assign(static_cast<size_t>(p.rows * O), std::nanf(""));
      k.packed(packed, O, rec.data(), stride, p.rows, p.I, ref.data(), O);
    }
    for (int64_t batch = 1; batch <= p.rows; ++batch)
      for (int64_t r0 = 0; r0 + batch <= p.rows; r0 += batch) {
        std::vector<float> y(static_cast<size_t>(batch * O), std::nanf(""));
        const std::byte* x = rec.data() + static_cast<size_t>(r0) * stride;
        cpu::AffineMatrix rest = packed;  // two shares: panel 0, then the rest
        rest.codes += pb;
        k.packed(packed, cpu::kPanelRows, x, stride, batch, p.I, y.data(), O);
        k.packed(rest, O - cpu::kPanelRows, x, stride, batch, p.I, y.data() + cpu::kPanelRows, O);
        for (int64_t i = 0; i < batch * O; ++i)
          ASSERT_TRUE(same_bits(y[i], ref[r0 * O + i])) << ks->name << ", batch " << batch << " element " << r0 * O + i;
      }
  }
  const double worst = p.worst_error(ref);
  EXPECT_LT(worst, 1e-2) << "error relative to sum |w x|";
  EXPECT_GT(worst, 0) << "8-bit activations cannot be exact";
}

INSTANTIATE_TEST_SUITE_P(Cases, MlxPackedKernels,
                         ::testing::Values(MlxCase{4, 32, DType::F16}, MlxCase{4, 64, DType::BF16},
                                           MlxCase{4, 64, DType::F16}, MlxCase{4, 128, DType::BF16}),
                         [](const auto& info) {
                           return "mlx4_g" + std::to_string(info.param.group) + "_" +
                                  std::string(dtype_name(info.param.scale_type));
                         });
TEST(MlxKernels, NoPackedPanelsFor8Bits) {
  for (const KernelSet* ks : sets()) EXPECT_EQ(ks->mlx8.pack, nullptr) << ks->name;
}

INSTANTIATE_TEST_SUITE_P(Cases, MlxKernelSets,
                         ::testing::Values(MlxCase{4, 32, DType::F16}, MlxCase{4, 64, DType::BF16},
                                           MlxCase{4, 128, DType::F32}, MlxCase{8, 32, DType::BF16},
                                           MlxCase{8, 64, DType::F16}, MlxCase{8, 128, DType::F32}),
                         [](const auto& info) {
                           return "mlx" + std::to_string(info.param.bits) + "_g" + std::to_string(info.param.group) +
                                  "_" + std::string(dtype_name(info.param.scale_type));
                         });

}  // namespace
}  // namespace specula
