#include "convert.hpp"

#include <cstring>

#include <immintrin.h>

#include "specula/error.hpp"

namespace specula::cpu {
namespace {

// Q8_0 rows in registers (the drafter's centroid head gathers 512 of them a step): each value is its
// code times the block's scale, one float product as in the SDK codec, so the same bits.
void decode_q8_0(const std::byte* row, int64_t n, float* dst) {
  for (int64_t b = 0; b < n / 32; ++b, row += 34, dst += 32) {
    uint16_t h;
    std::memcpy(&h, row, 2);
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(h));
    for (int j = 0; j < 4; ++j) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + 2 + 8 * j));
      _mm256_storeu_ps(dst + 8 * j, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d));
    }
  }
}

}  // namespace

bool can_decode(DType type) {
  // Floating-point storage only: integer tensors are ids and positions, never weights.
  const DTypeTraits* tr = dtype_traits(type);
  if (!tr || !(tr->quantized || type == DType::F32 || type == DType::F16 || type == DType::BF16)) return false;
  return type == DType::MLX_AFFINE || can_dequantize(type);
}

std::optional<size_t> row_bytes(DType type, int64_t cols, const QuantParams* quant) {
  if (type == DType::MLX_AFFINE) {
    if (!quant || !mlx_params_valid(quant->bits, quant->group_size) || cols % quant->group_size != 0)
      return std::nullopt;
    return static_cast<size_t>(cols) * quant->bits / 8;
  }
  auto b = dtype_row_bytes(type, static_cast<uint64_t>(cols));
  if (!b) return std::nullopt;
  return static_cast<size_t>(*b);
}

void decode_row(DType type, const std::byte* row_data, int64_t n, float* dst, const QuantParams* quant,
                int64_t row) {
  if (type == DType::MLX_AFFINE) {
    const MlxRowParams p{quant->bits, quant->group_size, quant->scale_type};
    const size_t scale_row = static_cast<size_t>(n / p.group_size) * dtype_traits(p.scale_type)->block_bytes;
    mlx_dequantize_row(p, row_data, quant->scales.data() + static_cast<size_t>(row) * scale_row,
                       quant->biases.data() + static_cast<size_t>(row) * scale_row, dst, n);
    return;
  }
  if (type == DType::Q8_0 && n % 32 == 0) return decode_q8_0(row_data, n, dst);
  dequantize_row(type, row_data, dst, n);
}

void encode_row(DType type, const float* src, int64_t n, std::byte* dst) {
  if (type != DType::F32 && type != DType::F16 && type != DType::BF16)
    fail("CPU backend: cannot encode values as {}", dtype_name(type));
  quantize_row(type, src, dst, n);
}

}  // namespace specula::cpu
