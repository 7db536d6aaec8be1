#include "convert.hpp"

#include "specula/error.hpp"

namespace specula::cpu {

bool can_decode(DType type) {
  return type == DType::F32 || type == DType::F16 || type == DType::BF16;
}

void decode_row(DType type, const std::byte* row_data, int64_t n, float* dst,
                const QuantParams* quant, int64_t row) {
  switch (type) {
    case DType::F32:
      std::memcpy(dst, row_data, static_cast<size_t>(n) * 4);
      return;
    case DType::F16: {
      const auto* s = reinterpret_cast<const uint16_t*>(row_data);
      int64_t i = 0;
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
      for (; i < n; ++i) dst[i] = f16_to_f32(s[i]);
      return;
    }
    case DType::BF16: {
      const auto* s = reinterpret_cast<const uint16_t*>(row_data);
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
      }
      for (; i < n; ++i) dst[i] = bf16_to_f32(s[i]);
      return;
    }
    default:
      fail("CPU backend: cannot decode {} values", dtype_name(type));
  }
}

void encode_row(DType type, const float* src, int64_t n, std::byte* dst) {
  switch (type) {
    case DType::F32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case DType::F16: {
      auto* d = reinterpret_cast<uint16_t*>(dst);
      int64_t i = 0;
      for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
      for (; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::BF16: {
      auto* d = reinterpret_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    default:
      fail("CPU backend: cannot encode values as {}", dtype_name(type));
  }
}

}  // namespace specula::cpu
