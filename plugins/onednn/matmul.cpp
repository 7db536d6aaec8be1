// Matrix products, dispatched by weight storage type:
//  - few activation rows (decode, speculative verify): fused kernels that stream each weight row once
//    and never materialise it in F32. Q8_0 / Q4_0 / Q4_K / Q6_K dot the raw blocks against activations
//    quantized on the fly to 8 bits per 32 values (the llama.cpp scheme); F32 / F16 / BF16 convert in
//    registers and use FMA.
//  - many rows (prefill): weight rows decoded to F32 in tiles, multiplied by oneDNN's GEMM.
//  - other types: matmul_generic (decode a row with the SDK codec, dot in F32).
#include <dnnl.h>

#include <algorithm>
#include <cmath>
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

// K-quant activations: one scale per 256 values so the super-block's integer products can be summed
// before a single float multiply; bsums (sums of 16 codes) carry the min / offset terms.
struct BlockQ8K {
  float d;
  int16_t bsums[16];
  int8_t q[256];
};

void quantize_x_k(const float* x, int64_t n, BlockQ8K* out) {
  for (int64_t b = 0; b < n / 256; ++b) {
    const float* xb = x + 256 * b;
    float amax = 0.0f;
    for (int i = 0; i < 256; ++i) amax = std::max(amax, std::abs(xb[i]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ8K& o = out[b];
    o.d = d;
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int i = 16 * g; i < 16 * g + 16; ++i) {
        const int q = static_cast<int>(std::nearbyint(xb[i] * id));
        o.q[i] = static_cast<int8_t>(q);
        sum += q;
      }
      o.bsums[g] = static_cast<int16_t>(sum);
    }
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

// sum += madd(a, b) (pairs of i16 products summed into i32).
inline __m256i madd_acc(__m256i sum, __m256i a, __m256i b) {
#if defined(__AVXVNNI__)
  return _mm256_dpwssd_avx_epi32(sum, a, b);
#else
  return _mm256_add_epi32(sum, _mm256_madd_epi16(a, b));
#endif
}

float dot_q4_k(const std::byte* w, const BlockQ8K* x, int64_t superblocks) {
  __m256 acc = _mm256_setzero_ps();
  float corr = 0.0f;
  const __m256i low = _mm256_set1_epi8(0x0f);
  // Shuffle controls broadcasting i16 element k of a 128-bit lane to all eight positions.
  const __m256i pick[8] = {
      _mm256_set1_epi16(0x0100), _mm256_set1_epi16(0x0302), _mm256_set1_epi16(0x0504), _mm256_set1_epi16(0x0706),
      _mm256_set1_epi16(0x0908), _mm256_set1_epi16(0x0b0a), _mm256_set1_epi16(0x0d0c), _mm256_set1_epi16(0x0f0e)};
  for (int64_t b = 0; b < superblocks; ++b, w += 144, ++x) {
    const float d = f16(w) * x->d, dmin = f16(w + 2) * x->d;
    // Eight 6-bit scales and mins packed in 12 bytes: bytes 0-3 / 4-7 hold the low 6 bits of scales /
    // mins 0-3 (their top 2 bits extend scales / mins 4-7), bytes 8-11 the low 4 bits of scales and
    // mins 4-7.
    uint32_t s[3];
    std::memcpy(s, w + 4, 12);
    const uint64_t sc = (s[0] & 0x3f3f3f3fu) |
                        (static_cast<uint64_t>((s[2] & 0x0f0f0f0fu) | ((s[0] >> 2) & 0x30303030u)) << 32);
    const uint64_t mn = (s[1] & 0x3f3f3f3fu) |
                        (static_cast<uint64_t>(((s[2] >> 4) & 0x0f0f0f0fu) | ((s[1] >> 2) & 0x30303030u)) << 32);
    const __m128i mins16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(mn)));
    const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x->bsums));
    const __m128i bsum32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
    const int mins = hsum_i32(_mm_madd_epi16(mins16, bsum32));
    const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(sc))));
    const std::byte* qs = w + 16;
    __m256i sumi = _mm256_setzero_si256();
    for (int j = 0; j < 4; ++j) {
      // 32 bytes hold sub-block 2j in the low nibbles and 2j + 1 in the high nibbles.
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * j));
      const __m256i lo = _mm256_and_si256(q, low), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
      const __m256i p0 = _mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x->q + 64 * j)));
      const __m256i p1 = _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x->q + 64 * j + 32)));
      sumi = madd_acc(sumi, p0, _mm256_shuffle_epi8(scales, pick[2 * j]));
      sumi = madd_acc(sumi, p1, _mm256_shuffle_epi8(scales, pick[2 * j + 1]));
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d), acc);
    corr += dmin * static_cast<float>(mins);
  }
  return hsum(acc) - corr;
}

float dot_q6_k(const std::byte* w, const BlockQ8K* x, int64_t superblocks) {
  __m256 acc = _mm256_setzero_ps();
  float corr = 0.0f;
  const __m256i low = _mm256_set1_epi8(0x0f), two = _mm256_set1_epi8(3);
  const __m256i pick[4] = {
      _mm256_setr_epi64x(0x0100010001000100, 0x0100010001000100, 0x0302030203020302, 0x0302030203020302),
      _mm256_setr_epi64x(0x0504050405040504, 0x0504050405040504, 0x0706070607060706, 0x0706070607060706),
      _mm256_setr_epi64x(0x0908090809080908, 0x0908090809080908, 0x0b0a0b0a0b0a0b0a, 0x0b0a0b0a0b0a0b0a),
      _mm256_setr_epi64x(0x0d0c0d0c0d0c0d0c, 0x0d0c0d0c0d0c0d0c, 0x0f0e0f0e0f0e0f0e, 0x0f0e0f0e0f0e0f0e)};
  for (int64_t b = 0; b < superblocks; ++b, w += 210, ++x) {
    const std::byte* ql = w;
    const std::byte* qh = w + 128;
    const std::byte* sc = w + 192;
    const float d = f16(w + 208) * x->d;
    // Codes are stored + 32: subtract 32 * sum(scale * bsum).
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
    const __m256i off = _mm256_madd_epi16(sc16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x->bsums)));
    const int offset = hsum_i32(_mm_add_epi32(_mm256_castsi256_si128(off), _mm256_extracti128_si256(off, 1)));
    __m256i sumi = _mm256_setzero_si256();
    const int8_t* xq = x->q;
    for (int half = 0; half < 2; ++half, ql += 64, qh += 32, xq += 128) {
      // Both 128-bit lanes hold this half's eight scales as i16.
      const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 8 * half))));
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
      // Run r: the low 128 bits cover values 0..15 (scale 2r), the high 128 bits values 16..31 (2r + 1).
      for (int r = 0; r < 4; ++r) {
        const __m256i p = _mm256_maddubs_epi16(q[r], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32 * r)));
        sumi = madd_acc(sumi, p, _mm256_shuffle_epi8(scales, pick[r]));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d), acc);
    corr += 32.0f * d * static_cast<float>(offset);
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

using DotQ8X = float (*)(const std::byte*, const BlockQ8X*, int64_t);
using DotQ8K = float (*)(const std::byte*, const BlockQ8K*, int64_t);

// Fused kernels for n activation rows: activations quantized once, then each weight row is streamed
// once and dotted with every activation row.
template <typename Block, int kValues>
void matmul_quant(ThreadPool& pool, const Matrix& w, float (*dot)(const std::byte*, const Block*, int64_t),
                  void (*quantize)(const float*, int64_t, Block*), const float* x, int64_t n, float* y) {
  const int64_t O = w.rows, I = w.cols, nb = I / kValues;
  std::vector<Block> qx(static_cast<size_t>(n * nb));
  for (int64_t r = 0; r < n; ++r) quantize(x + r * I, I, qx.data() + r * nb);
  pool.parallel_for(O, 32, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t r = 0; r < n; ++r) y[r * O + o] = dot(w.row(o), qx.data() + r * nb, nb);
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
  switch (w.type) {
    case DType::Q8_0: return matmul_quant<BlockQ8X, 32>(pool, w, &dot_q8_0, &quantize_x, x, n, y);
    case DType::Q4_0: return matmul_quant<BlockQ8X, 32>(pool, w, &dot_q4_0, &quantize_x, x, n, y);
    case DType::Q4_K: return matmul_quant<BlockQ8K, 256>(pool, w, &dot_q4_k, &quantize_x_k, x, n, y);
    case DType::Q6_K: return matmul_quant<BlockQ8K, 256>(pool, w, &dot_q6_k, &quantize_x_k, x, n, y);
    default: break;
  }
  matmul_generic(pool, w, x, n, y);
}

}  // namespace specula::cpu
