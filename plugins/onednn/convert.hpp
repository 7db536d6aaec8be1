// Scalar conversions and row decoding for the CPU backend. Row decoding of quantized block types is
// the SDK's codec (specula/quant.hpp); this file only adds the plain float types and vector helpers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include <immintrin.h>

#include "specula/dtype.hpp"
#include "specula/model_file.hpp"

namespace specula::cpu {

inline float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t f32_to_f16(float f) { return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT); }

inline float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

// Whether decode_row() can decode this type.
bool can_decode(DType type);

// Decodes the first n values of row `row` of a tensor stored as `type` into F32. `row_data` points at
// the row's first byte; `quant` and `row` are only read for MLX_AFFINE (per-row scales and biases).
void decode_row(DType type, const std::byte* row_data, int64_t n, float* dst,
                const QuantParams* quant = nullptr, int64_t row = 0);

// Encodes n F32 values as `type` (F32, F16, BF16).
void encode_row(DType type, const float* src, int64_t n, std::byte* dst);

}  // namespace specula::cpu
