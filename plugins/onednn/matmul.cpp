// Matrix products, dispatched by weight storage type:
//  - few activation rows (decode, speculative verify): fused kernels that stream each weight row once
//    and never materialise it in F32. Q8_0 / Q4_0 / Q4_K / Q6_K dot the raw blocks against activations
//    quantized on the fly to 8 bits per 32 values (the llama.cpp scheme); F32 / F16 / BF16 convert in
//    registers and use FMA.
//  - many rows (prefill): weight rows decoded to F32 in tiles, multiplied by oneDNN's GEMM.
//  - other types: matmul_generic (decode a row with the SDK codec, dot in F32).
#include <dnnl.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include <immintrin.h>

#include "convert.hpp"
#include "kernels.hpp"
#include "specula/error.hpp"

namespace specula::cpu {

namespace {

// ---- activations quantized to 8 bits: one block per 32 values ---------------------------------------
struct BlockQ8X {
  float d;         // scale: x ~= d * q
  int16_t sum[2];  // sums of q over values 0..15 and 16..31
  int8_t q[32];
};
static_assert(sizeof(BlockQ8X) == 40);

inline float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

inline int hsum_i32(__m128i v) {
  v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0x4e));
  v = _mm_add_epi32(v, _mm_shuffle_epi32(v, 0xb1));
  return _mm_cvtsi128_si32(v);
}

void quantize_x(const float* x, int64_t n, BlockQ8X* out) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* xb = x + 32 * b;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(xb + 8 * k);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, v[k]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / 127.0f;
    const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    __m256i i[4];
    for (int k = 0; k < 4; ++k) i[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], id));  // round to nearest
    // Pack 32 int32 into 32 int8 in order (packs interleave 128-bit lanes; permute restores order).
    __m256i p01 = _mm256_packs_epi32(i[0], i[1]), p23 = _mm256_packs_epi32(i[2], i[3]);
    __m256i q = _mm256_packs_epi16(p01, p23);
    q = _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out[b].q), q);
    out[b].d = d;
    const __m256i s16 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
    out[b].sum[0] = static_cast<int16_t>(hsum_i32(_mm256_castsi256_si128(s16)));
    out[b].sum[1] = static_cast<int16_t>(hsum_i32(_mm256_extracti128_si256(s16, 1)));
  }
}

// Sum over groups of 4 bytes of u8 * i8 products -> 8 x int32 (u <= 128 keeps maddubs from saturating
// for |s| <= 127).
inline __m256i dot_u8_i8(__m256i u, __m256i s) {
#if defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, s);
#elif defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
}

inline float f16(const std::byte* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// ---- weight-row x activation-row dot products (I values, whole blocks) --------------------------------

float dot_q8_0(const std::byte* w, const BlockQ8X* x, int64_t blocks) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b, w += 34) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2));
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].q));
    const __m256i p = dot_u8_i8(_mm256_sign_epi8(q, q), _mm256_sign_epi8(xq, q));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(f16(w) * x[b].d), acc);
  }
  return hsum(acc);
}

float dot_q4_0(const std::byte* w, const BlockQ8X* x, int64_t blocks) {
  __m256 acc = _mm256_setzero_ps();
  float corr = 0.0f;
  const __m256i low = _mm256_set1_epi8(0x0f);
  for (int64_t b = 0; b < blocks; ++b, w += 18) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2));
    // Values 0..15 are the low nibbles, 16..31 the high nibbles.
    const __m256i nib = _mm256_and_si256(
        _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), low);
    const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].q));
    const float s = f16(w) * x[b].d;
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot_u8_i8(nib, xq)), _mm256_set1_ps(s), acc);
    corr += 8.0f * s * static_cast<float>(x[b].sum[0] + x[b].sum[1]);
  }
  return hsum(acc) - corr;
}

// The 6-bit scale and min of sub-block j of a Q4_K super-block (12 packed bytes).
inline void q4k_scale_min(int j, const uint8_t* s, float* sc, float* mn) {
  if (j < 4) {
    *sc = static_cast<float>(s[j] & 63);
    *mn = static_cast<float>(s[j + 4] & 63);
  } else {
    *sc = static_cast<float>((s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4));
    *mn = static_cast<float>((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

float dot_q4_k(const std::byte* w, const BlockQ8X* x, int64_t superblocks) {
  __m256 acc = _mm256_setzero_ps();
  float corr = 0.0f;
  const __m256i low = _mm256_set1_epi8(0x0f);
  for (int64_t b = 0; b < superblocks; ++b, w += 144, x += 8) {
    const float d = f16(w), dmin = f16(w + 2);
    const auto* scales = reinterpret_cast<const uint8_t*>(w + 4);
    const std::byte* qs = w + 16;
    for (int j = 0; j < 4; ++j) {
      // 32 bytes hold sub-block 2j in the low nibbles and 2j + 1 in the high nibbles.
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * j));
      const __m256i lo = _mm256_and_si256(q, low), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
      const BlockQ8X& x0 = x[2 * j];
      const BlockQ8X& x1 = x[2 * j + 1];
      float sc0, m0, sc1, m1;
      q4k_scale_min(2 * j, scales, &sc0, &m0);
      q4k_scale_min(2 * j + 1, scales, &sc1, &m1);
      const __m256i p0 = dot_u8_i8(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x0.q)));
      const __m256i p1 = dot_u8_i8(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x1.q)));
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p0), _mm256_set1_ps(d * sc0 * x0.d), acc);
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p1), _mm256_set1_ps(d * sc1 * x1.d), acc);
      corr += dmin * (m0 * x0.d * static_cast<float>(x0.sum[0] + x0.sum[1]) +
                      m1 * x1.d * static_cast<float>(x1.sum[0] + x1.sum[1]));
    }
  }
  return hsum(acc) - corr;
}

float dot_q6_k(const std::byte* w, const BlockQ8X* x, int64_t superblocks) {
  __m256 acc = _mm256_setzero_ps();
  float corr = 0.0f;
  const __m256i low = _mm256_set1_epi8(0x0f), two = _mm256_set1_epi8(3);
  for (int64_t b = 0; b < superblocks; ++b, w += 210, x += 8) {
    const std::byte* ql = w;
    const std::byte* qh = w + 128;
    const auto* sc = reinterpret_cast<const int8_t*>(w + 192);
    const float d = f16(w + 208);
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, sc += 8) {
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
      // Four runs of 32 values: low/high nibbles of ql[0..31] / ql[32..63], with 2 bits each from qh.
      const __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(l0, low), _mm256_slli_epi16(_mm256_and_si256(h, two), 4)),
          _mm256_or_si256(_mm256_and_si256(l1, low),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), two), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), two), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), two), 4)),
      };
      for (int r = 0; r < 4; ++r) {
        const BlockQ8X& xb = x[4 * half + r];
        const float s0 = static_cast<float>(sc[2 * r]), s1 = static_cast<float>(sc[2 * r + 1]);
        const __m256i p = dot_u8_i8(q[r], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.q)));
        // Lanes 0..3 cover values 0..15 (scale s0), lanes 4..7 values 16..31 (scale s1).
        const __m256 scale = _mm256_mul_ps(_mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0)),
                                           _mm256_set1_ps(d * xb.d));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc);
        corr += 32.0f * d * xb.d * (s0 * xb.sum[0] + s1 * xb.sum[1]);  // codes are stored + 32
      }
    }
  }
  return hsum(acc) - corr;
}

inline __m256 load_bf16(const uint16_t* p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16));
}
inline __m256 load_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

template <bool kBf16>
float dot_half(const std::byte* w, const float* x, int64_t n) {
  const auto* h = reinterpret_cast<const uint16_t*>(w);
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 w0 = kBf16 ? load_bf16(h + i) : load_f16(h + i);
    const __m256 w1 = kBf16 ? load_bf16(h + i + 8) : load_f16(h + i + 8);
    a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i + 8), a1);
  }
  float s = hsum(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) {
    const float wv = kBf16 ? _mm_cvtss_f32(_mm_castsi128_ps(_mm_cvtsi32_si128(static_cast<int>(h[i]) << 16)))
                           : _cvtsh_ss(h[i]);
    s += wv * x[i];
  }
  return s;
}

using QuantDot = float (*)(const std::byte*, const BlockQ8X*, int64_t);

QuantDot quant_dot(DType t) {
  switch (t) {
    case DType::Q8_0: return &dot_q8_0;
    case DType::Q4_0: return &dot_q4_0;
    case DType::Q4_K: return &dot_q4_k;
    case DType::Q6_K: return &dot_q6_k;
    default: return nullptr;
  }
}

// Fused kernels for n activation rows: each weight row is streamed once and dotted with every row.
void matmul_quant(ThreadPool& pool, const Matrix& w, QuantDot dot, const float* x, int64_t n, float* y) {
  const int64_t O = w.rows, I = w.cols, xb = I / 32;
  const int64_t units = (w.type == DType::Q4_K || w.type == DType::Q6_K) ? I / 256 : xb;
  std::vector<BlockQ8X> qx(static_cast<size_t>(n * xb));
  for (int64_t r = 0; r < n; ++r) quantize_x(x + r * I, I, qx.data() + r * xb);
  pool.parallel_for(O, 32, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t r = 0; r < n; ++r) y[r * O + o] = dot(w.row(o), qx.data() + r * xb, units);
  });
}

void matmul_float(ThreadPool& pool, const Matrix& w, const float* x, int64_t n, float* y) {
  const int64_t O = w.rows, I = w.cols;
  pool.parallel_for(O, 32, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t r = 0; r < n; ++r) {
        const float* xr = x + r * I;
        float v;
        switch (w.type) {
          case DType::F32: v = dot_f32(reinterpret_cast<const float*>(w.row(o)), xr, I); break;
          case DType::BF16: v = dot_half<true>(w.row(o), xr, I); break;
          default: v = dot_half<false>(w.row(o), xr, I); break;
        }
        y[r * O + o] = v;
      }
  });
}

}  // namespace

void matmul(ThreadPool& pool, const Matrix& w, const float* x, int64_t n, float* y) {
  const bool plain = w.type == DType::F32 || w.type == DType::F16 || w.type == DType::BF16;
  if (plain) return matmul_float(pool, w, x, n, y);
  if (QuantDot dot = quant_dot(w.type)) return matmul_quant(pool, w, dot, x, n, y);
  matmul_generic(pool, w, x, n, y);
}

}  // namespace specula::cpu
