// Scalar conversions, row dispatch and MLX affine codecs. The ggml block codecs live in quant_blocks.cpp.
#include "specula/quant.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#if defined(__F16C__) && defined(__AVX__)
#include <immintrin.h>
#endif

#include "quant_internal.hpp"
#include "specula/error.hpp"

// Separate rounding of multiply and add (w = s*q + b), as MLX's reference does; see quant_blocks.cpp.
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace specula {

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13);  // inf / NaN (payload kept)
  } else if (exp != 0) {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  } else {
    // Zero or subnormal: mant * 2^-24 is exact in f32.
    float v = static_cast<float>(mant) * 0x1p-24f;
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u) return sign | 0x7C00u | (x > 0x7F800000u ? 0x200u : 0u);  // inf / quiet NaN
  if (x >= 0x477FF000u) return sign | 0x7C00u;  // >= 65520 rounds to infinity
  if (x < 0x38800000u) {
    // Below the smallest normal half (2^-14): the subnormal code is |f| * 2^24 rounded to even; a carry
    // to 1024 yields the smallest normal's encoding, which is correct.
    float a;
    std::memcpy(&a, &x, 4);
    return sign | static_cast<uint16_t>(std::nearbyint(a * 0x1p24f));
  }
  uint32_t h = ((((x >> 23) - 112u)) << 10) | ((x & 0x7FFFFFu) >> 13);
  const uint32_t rem = x & 0x1FFFu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry may bump the exponent: still right
  return sign | static_cast<uint16_t>(h);
}

float bf16_to_fp32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t fp32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

namespace {

uint64_t check_row(DType t, int64_t n, const char* what) {
  const DTypeTraits* tr = dtype_traits(t);
  if (!tr) fail("{}: unknown dtype value {}", what, static_cast<uint32_t>(t));
  if (n < 0 || n % tr->block_elems != 0)
    fail("{}: a {} row must hold a multiple of {} values, got {}", what, tr->name, tr->block_elems, n);
  return static_cast<uint64_t>(n) / tr->block_elems;
}

template <typename T>
void ints_to_float(const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const unsigned char*>(src);
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, p + i * sizeof(T), sizeof(T));
    dst[i] = static_cast<float>(v);
  }
}

float load_scale(DType t, const unsigned char* p, int64_t i) {
  switch (t) {
    case DType::F32: { float f; std::memcpy(&f, p + 4 * i, 4); return f; }
    case DType::F16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); return fp16_to_fp32(h); }
    case DType::BF16: { uint16_t h; std::memcpy(&h, p + 2 * i, 2); return bf16_to_fp32(h); }
    default: fail("MLX scales/biases must be F32, F16 or BF16, got {}", dtype_name(t));
  }
}

void store_scale(DType t, unsigned char* p, int64_t i, float v) {
  switch (t) {
    case DType::F32: std::memcpy(p + 4 * i, &v, 4); return;
    case DType::F16: { uint16_t h = fp32_to_fp16(v); std::memcpy(p + 2 * i, &h, 2); return; }
    case DType::BF16: { uint16_t h = fp32_to_bf16(v); std::memcpy(p + 2 * i, &h, 2); return; }
    default: fail("MLX scales/biases must be F32, F16 or BF16, got {}", dtype_name(t));
  }
}

// The stored value of a scale, so the quantizer picks codes for the scale the reader will see.
float round_scale(DType t, float v) {
  unsigned char buf[4];
  store_scale(t, buf, 0, v);
  return load_scale(t, buf, 0);
}

void check_mlx(const MlxRowParams& p, int64_t n) {
  if (!mlx_params_valid(p.bits, p.group_size))
    fail("MLX affine quantization: bits {} / group_size {} unsupported (bits 2,3,4,5,6,8; group 32,64,128)",
         p.bits, p.group_size);
  if (n < 0 || n % p.group_size != 0)
    fail("MLX affine quantization: row length {} is not a multiple of group_size {}", n, p.group_size);
}

}  // namespace

bool can_dequantize(DType t) {
  switch (t) {
    case DType::I8: case DType::I16: case DType::I32: case DType::I64: case DType::U8: case DType::U32:
    case DType::F64:
      return true;
    default:
      return can_quantize(t);
  }
}

bool can_quantize(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::Q8_0: case DType::Q4_0:
    case DType::Q4_1: case DType::Q5_0: case DType::Q5_1: case DType::Q4_K: case DType::Q5_K:
    case DType::Q6_K: case DType::IQ4_NL: case DType::IQ4_XS:
      return true;
    default:
      return false;
  }
}

void dequantize_row(DType t, const void* src, float* dst, int64_t n) {
  const uint64_t blocks = check_row(t, n, "dequantize_row");
  const auto* p = static_cast<const unsigned char*>(src);
  switch (t) {
    case DType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::F16: {
      int64_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
      // The hardware conversion is exact, like fp16_to_fp32 (NaN payloads aside).
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * i))));
#endif
      for (; i < n; ++i) { uint16_t h; std::memcpy(&h, p + 2 * i, 2); dst[i] = fp16_to_fp32(h); }
      return;
    }
    case DType::BF16: {
      // Chunks through an aligned buffer so the shift-by-16 loop vectorises (src may be unaligned).
      int64_t i = 0;
      for (; i + 16 <= n; i += 16) {
        uint16_t h[16];
        uint32_t w[16];
        std::memcpy(h, p + 2 * i, sizeof h);
        for (int j = 0; j < 16; ++j) w[j] = static_cast<uint32_t>(h[j]) << 16;
        std::memcpy(dst + i, w, sizeof w);
      }
      for (; i < n; ++i) { uint16_t h; std::memcpy(&h, p + 2 * i, 2); dst[i] = bf16_to_fp32(h); }
      return;
    }
    case DType::F64: ints_to_float<double>(src, dst, n); return;
    case DType::I8: ints_to_float<int8_t>(src, dst, n); return;
    case DType::I16: ints_to_float<int16_t>(src, dst, n); return;
    case DType::I32: ints_to_float<int32_t>(src, dst, n); return;
    case DType::I64: ints_to_float<int64_t>(src, dst, n); return;
    case DType::U8: ints_to_float<uint8_t>(src, dst, n); return;
    case DType::U32: ints_to_float<uint32_t>(src, dst, n); return;
    default: break;
  }
  const DTypeTraits* tr = dtype_traits(t);
  for (uint64_t b = 0; b < blocks; ++b) {
    const unsigned char* blk = p + b * tr->block_bytes;
    float* y = dst + b * tr->block_elems;
    switch (t) {
      case DType::Q8_0: detail::dequant_q8_0(blk, y); break;
      case DType::Q4_0: detail::dequant_q4_0(blk, y); break;
      case DType::Q4_1: detail::dequant_q4_1(blk, y); break;
      case DType::Q5_0: detail::dequant_q5_0(blk, y); break;
      case DType::Q5_1: detail::dequant_q5_1(blk, y); break;
      case DType::Q4_K: detail::dequant_q4_k(blk, y); break;
      case DType::Q5_K: detail::dequant_q5_k(blk, y); break;
      case DType::Q6_K: detail::dequant_q6_k(blk, y); break;
      case DType::IQ4_NL: detail::dequant_iq4_nl(blk, y); break;
      case DType::IQ4_XS: detail::dequant_iq4_xs(blk, y); break;
      default: fail("dequantize_row: no decoder for dtype {}", dtype_name(t));
    }
  }
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  const uint64_t blocks = check_row(t, n, "quantize_row");
  auto* p = static_cast<unsigned char*>(dst);
  switch (t) {
    case DType::F32: std::memcpy(dst, src, static_cast<size_t>(n) * 4); return;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) { uint16_t h = fp32_to_fp16(src[i]); std::memcpy(p + 2 * i, &h, 2); }
      return;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) { uint16_t h = fp32_to_bf16(src[i]); std::memcpy(p + 2 * i, &h, 2); }
      return;
    default: break;
  }
  const DTypeTraits* tr = dtype_traits(t);
  for (uint64_t b = 0; b < blocks; ++b) {
    const float* x = src + b * tr->block_elems;
    unsigned char* blk = p + b * tr->block_bytes;
    switch (t) {
      case DType::Q8_0: detail::quant_q8_0(x, blk); break;
      case DType::Q4_0: detail::quant_q4_0(x, blk); break;
      case DType::Q4_1: detail::quant_q4_1(x, blk); break;
      case DType::Q5_0: detail::quant_q5_0(x, blk); break;
      case DType::Q5_1: detail::quant_q5_1(x, blk); break;
      case DType::Q4_K: detail::quant_q4_k(x, blk); break;
      case DType::Q5_K: detail::quant_q5_k(x, blk); break;
      case DType::Q6_K: detail::quant_q6_k(x, blk); break;
      case DType::IQ4_NL: detail::quant_iq4_nl(x, blk); break;
      case DType::IQ4_XS: detail::quant_iq4_xs(x, blk); break;
      default: fail("quantize_row: no encoder for dtype {}", dtype_name(t));
    }
  }
}

bool mlx_params_valid(uint32_t bits, uint32_t group_size) {
  const bool bits_ok = bits == 2 || bits == 3 || bits == 4 || bits == 5 || bits == 6 || bits == 8;
  const bool group_ok = group_size == 32 || group_size == 64 || group_size == 128;
  return bits_ok && group_ok;
}

void mlx_dequantize_row(const MlxRowParams& p, const void* packed, const void* scales, const void* biases,
                        float* dst, int64_t n) {
  check_mlx(p, n);
  const auto* bytes = static_cast<const unsigned char*>(packed);
  const auto* sc = static_cast<const unsigned char*>(scales);
  const auto* bi = static_cast<const unsigned char*>(biases);
  const uint32_t mask = (1u << p.bits) - 1u;
  // One group is group_size*bits/8 whole bytes (a multiple of 4), so each group starts byte-aligned.
  const int64_t group_bytes = p.group_size * p.bits / 8;
  for (int64_t g = 0; g < n / p.group_size; ++g) {
    const float s = load_scale(p.scale_type, sc, g);
    const float b = load_scale(p.scale_type, bi, g);
    const unsigned char* q = bytes + g * group_bytes;
    float* y = dst + g * p.group_size;
    if (p.bits == 2 || p.bits == 4 || p.bits == 8) {
      // Codes never straddle a byte: a branch-free loop the compiler can vectorise.
      for (uint32_t c = 0; c < p.group_size; ++c) {
        const uint32_t v = (q[(c * p.bits) >> 3] >> ((c * p.bits) & 7)) & mask;
        y[c] = s * static_cast<float>(v) + b;
      }
      continue;
    }
    uint64_t acc = 0;
    uint32_t have = 0;
    for (uint32_t c = 0; c < p.group_size; ++c) {
      while (have < p.bits) {
        acc |= static_cast<uint64_t>(*q++) << have;
        have += 8;
      }
      const uint32_t v = static_cast<uint32_t>(acc) & mask;
      acc >>= p.bits;
      have -= p.bits;
      y[c] = s * static_cast<float>(v) + b;
    }
  }
}

void mlx_quantize_row(const MlxRowParams& p, const float* src, int64_t n, void* packed, void* scales,
                      void* biases) {
  check_mlx(p, n);
  auto* out = static_cast<unsigned char*>(packed);
  auto* sc = static_cast<unsigned char*>(scales);
  auto* bi = static_cast<unsigned char*>(biases);
  const float qmax = static_cast<float>((1u << p.bits) - 1u);
  const int64_t group_bytes = p.group_size * p.bits / 8;
  std::memset(out, 0, static_cast<size_t>(n / p.group_size * group_bytes));
  for (int64_t g = 0; g < n / p.group_size; ++g) {
    const float* w = src + g * p.group_size;
    float wmin = w[0], wmax = w[0];
    for (uint32_t c = 1; c < p.group_size; ++c) {
      wmin = std::min(wmin, w[c]);
      wmax = std::max(wmax, w[c]);
    }
    float s = std::max((wmax - wmin) / qmax, 1e-7f);
    float edge = wmin;
    if (std::fabs(wmin) <= std::fabs(wmax)) {
      s = -s;
      edge = wmax;
    }
    const float q0 = std::rint(edge / s);
    float bias = 0.0f;
    if (q0 != 0.0f) {
      s = edge / q0;
      bias = edge;
    }
    store_scale(p.scale_type, sc, g, s);
    store_scale(p.scale_type, bi, g, bias);
    s = round_scale(p.scale_type, s);
    bias = round_scale(p.scale_type, bias);
    unsigned char* q = out + g * group_bytes;
    uint64_t acc = 0;
    uint32_t have = 0;
    for (uint32_t c = 0; c < p.group_size; ++c) {
      const float v = std::clamp(std::rint((w[c] - bias) / s), 0.0f, qmax);
      acc |= static_cast<uint64_t>(v) << have;
      have += p.bits;
      while (have >= 8) {
        *q++ = static_cast<unsigned char>(acc & 0xFFu);
        acc >>= 8;
        have -= 8;
      }
    }
  }
}

namespace {

// Rows of `t`, each `row_elems` values along the innermost axis.
int64_t row_length(const TensorInfo& t) { return t.shape.empty() ? 1 : t.shape.back(); }

void dequant_rows_impl(const TensorInfo& t, int64_t r0, int64_t r1, float* dst) {
  const int64_t k = row_length(t);
  const int64_t rows = k == 0 ? 0 : t.elements() / k;
  if (r0 < 0 || r1 < r0 || r1 > rows)
    fail("tensor '{}': rows [{}, {}) outside its {} rows", t.name, r0, r1, rows);
  if (t.type == DType::MLX_AFFINE) {
    const MlxRowParams p{t.quant.bits, t.quant.group_size, t.quant.scale_type};
    check_mlx(p, k);
    const DTypeTraits* st = dtype_traits(p.scale_type);
    const size_t packed_row = static_cast<size_t>(k) * p.bits / 8;
    const size_t scale_row = static_cast<size_t>(k / p.group_size) * st->block_bytes;
    if (t.data.size() < static_cast<size_t>(rows) * packed_row || t.quant.scales.size() < rows * scale_row ||
        t.quant.biases.size() < rows * scale_row)
      fail("tensor '{}': MLX data, scales or biases smaller than its shape needs", t.name);
    for (int64_t r = r0; r < r1; ++r)
      mlx_dequantize_row(p, t.data.data() + r * packed_row, t.quant.scales.data() + r * scale_row,
                         t.quant.biases.data() + r * scale_row, dst + (r - r0) * k, k);
    return;
  }
  if (!can_dequantize(t.type)) fail("tensor '{}': dtype {} cannot be dequantized", t.name, dtype_name(t.type));
  const auto row_bytes = dtype_row_bytes(t.type, static_cast<uint64_t>(k));
  if (!row_bytes) fail("tensor '{}': row of {} values is not whole {} blocks", t.name, k, dtype_name(t.type));
  if (t.data.size() < static_cast<size_t>(rows) * *row_bytes)
    fail("tensor '{}': {} data bytes, shape needs {}", t.name, t.data.size(), rows * *row_bytes);
  for (int64_t r = r0; r < r1; ++r)
    dequantize_row(t.type, t.data.data() + r * *row_bytes, dst + (r - r0) * k, k);
}

}  // namespace

void dequantize_tensor(const TensorInfo& t, float* dst) {
  const int64_t k = row_length(t);
  dequant_rows_impl(t, 0, k == 0 ? 0 : t.elements() / k, dst);
}

void dequantize_rows(const TensorInfo& t, int64_t row_begin, int64_t row_end, float* dst) {
  dequant_rows_impl(t, row_begin, row_end, dst);
}

}  // namespace specula
