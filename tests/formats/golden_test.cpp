// Bit-exact agreement with llama.cpp: golden blocks made by ggml itself (tools/llama-ref/quant_goldens.py)
// are decoded by dequantize_row and compared bit for bit; the reference quantizers are compared with
// llama.cpp's bytes (exact for the simple types, error-quality for the K and IQ4 types).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "specula/quant.hpp"

using namespace specula;

namespace {

struct Golden {
  uint32_t type = 0, n_quant = 0, n_rand = 0;
  std::vector<float> input, deq, rdeq;
  std::vector<std::byte> q, r;
};

Golden load(const std::string& name, DType t) {
  const auto path = std::filesystem::path(SPECULA_SOURCE_DIR) / "tests/formats/golden" / (name + ".bin");
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in) << path;
  Golden g;
  char magic[4];
  in.read(magic, 4);
  EXPECT_EQ(std::string(magic, 4), "SQG1");
  in.read(reinterpret_cast<char*>(&g.type), 4);
  in.read(reinterpret_cast<char*>(&g.n_quant), 4);
  in.read(reinterpret_cast<char*>(&g.n_rand), 4);
  auto floats = [&](std::vector<float>& v, size_t n) {
    v.resize(n);
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * 4));
  };
  auto bytes = [&](std::vector<std::byte>& v, size_t n) {
    v.resize(n);
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n));
  };
  floats(g.input, g.n_quant);
  bytes(g.q, *dtype_row_bytes(t, g.n_quant));
  floats(g.deq, g.n_quant);
  bytes(g.r, *dtype_row_bytes(t, g.n_rand));
  floats(g.rdeq, g.n_rand);
  EXPECT_TRUE(in) << path << " is truncated";
  return g;
}

size_t bit_mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  size_t bad = 0;
  for (size_t i = 0; i < a.size(); ++i) bad += std::memcmp(&a[i], &b[i], 4) != 0;
  return bad;
}

double rms_err(const std::vector<float>& a, const std::vector<float>& b) {
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) e += (a[i] - b[i]) * double(a[i] - b[i]);
  return std::sqrt(e / a.size());
}

struct Case {
  const char* name;
  DType type;
  bool same_bytes;  // our reference quantizer reproduces llama.cpp's bytes
};

class LlamaGolden : public ::testing::TestWithParam<Case> {};

TEST_P(LlamaGolden, DequantizationIsBitExact) {
  const Case c = GetParam();
  const Golden g = load(c.name, c.type);
  ASSERT_EQ(g.type, static_cast<uint32_t>(c.type));
  std::vector<float> y(g.n_quant), ry(g.n_rand);
  dequantize_row(c.type, g.q.data(), y.data(), g.n_quant);
  EXPECT_EQ(bit_mismatches(y, g.deq), 0u) << c.name << " (llama.cpp-quantized blocks)";
  dequantize_row(c.type, g.r.data(), ry.data(), g.n_rand);
  EXPECT_EQ(bit_mismatches(ry, g.rdeq), 0u) << c.name << " (random blocks)";
}

TEST_P(LlamaGolden, ReferenceQuantizerAgainstLlamaCpp) {
  const Case c = GetParam();
  const Golden g = load(c.name, c.type);
  std::vector<std::byte> mine(g.q.size());
  quantize_row(c.type, g.input.data(), mine.data(), g.n_quant);
  const uint32_t bb = dtype_traits(c.type)->block_bytes;
  size_t same = 0, blocks = mine.size() / bb;
  for (size_t b = 0; b < blocks; ++b) same += std::memcmp(mine.data() + b * bb, g.q.data() + b * bb, bb) == 0;
  std::vector<float> y(g.n_quant);
  dequantize_row(c.type, mine.data(), y.data(), g.n_quant);
  const double ours = rms_err(g.input, y), theirs = rms_err(g.input, g.deq);
  std::printf("  %s: %zu/%zu blocks identical to llama.cpp; RMS error ours %.6f, llama.cpp %.6f\n", c.name, same,
              blocks, ours, theirs);
  if (c.same_bytes) {
    EXPECT_EQ(same, blocks) << c.name;
  } else {
    // Specula's K/IQ4 encoders are simpler searches than llama.cpp's; they must stay close in quality.
    EXPECT_LT(ours, theirs * 1.6 + 1e-9) << c.name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, LlamaGolden,
    ::testing::Values(Case{"F32", DType::F32, true}, Case{"F16", DType::F16, true}, Case{"BF16", DType::BF16, true},
                      Case{"Q4_0", DType::Q4_0, true}, Case{"Q4_1", DType::Q4_1, true}, Case{"Q5_0", DType::Q5_0, true},
                      Case{"Q5_1", DType::Q5_1, true}, Case{"Q8_0", DType::Q8_0, true},
                      Case{"Q4_K", DType::Q4_K, false}, Case{"Q5_K", DType::Q5_K, false},
                      Case{"Q6_K", DType::Q6_K, false}, Case{"IQ4_NL", DType::IQ4_NL, false},
                      Case{"IQ4_XS", DType::IQ4_XS, false}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
