// Matrix products, dispatched by weight storage type:
//  - few activation rows (decode, speculative verify): fused kernels that stream each weight row once
//    and never materialise it in F32. Q8_0 / Q4_0 / Q4_K / Q6_K dot the raw blocks against activations
//    quantized on the fly to 8 bits per 32 values (the llama.cpp scheme); F32 / F16 / BF16 convert in
//    registers and use FMA.
//  - many rows (prefill): weight rows decoded to F32 in tiles, multiplied by oneDNN's GEMM.
//  - other types: matmul_generic (decode a row with the SDK codec, dot in F32).
#include <dnnl.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
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

// ---- weight row x R activation rows -------------------------------------------------------------------
// Each kernel unpacks a weight block once and dots it with R activation rows (x[r] points at row r's
// blocks), so prefill and speculative verification reuse the unpacking; out[r] receives the dots.

template <int R>
void dot_q8_0(const std::byte* w, const BlockQ8X* const* x, int64_t blocks, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t b = 0; b < blocks; ++b, w += 34) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2));
    const __m256i aq = _mm256_sign_epi8(q, q);
    const float dw = f16(w);
    for (int r = 0; r < R; ++r) {
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r][b].q));
      const __m256i p = dot_u8_i8(aq, _mm256_sign_epi8(xq, q));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * x[r][b].d), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]);
}

template <int R>
void dot_q4_0(const std::byte* w, const BlockQ8X* const* x, int64_t blocks, float* out) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0f), eight = _mm256_set1_epi8(8);
  for (int64_t b = 0; b < blocks; ++b, w += 18) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2));
    // Values 0..15 are the low nibbles, 16..31 the high nibbles; codes are stored + 8.
    const __m256i q = _mm256_sub_epi8(_mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), low), eight);
    const __m256i aq = _mm256_sign_epi8(q, q);
    const float dw = f16(w);
    for (int r = 0; r < R; ++r) {
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[r][b].q));
      const __m256i p = dot_u8_i8(aq, _mm256_sign_epi8(xq, q));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * x[r][b].d), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]);
}

// sum += madd(a, b) (pairs of i16 products summed into i32).
inline __m256i madd_acc(__m256i sum, __m256i a, __m256i b) {
#if defined(__AVXVNNI__)
  return _mm256_dpwssd_avx_epi32(sum, a, b);
#else
  return _mm256_add_epi32(sum, _mm256_madd_epi16(a, b));
#endif
}

template <int R>
void dot_q4_k(const std::byte* w, const BlockQ8K* const* x, int64_t superblocks, float* out) {
  __m256 acc[R];
  float corr[R] = {};
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0f);
  // Shuffle controls broadcasting i16 element k of a 128-bit lane to all eight positions.
  const __m256i pick[8] = {
      _mm256_set1_epi16(0x0100), _mm256_set1_epi16(0x0302), _mm256_set1_epi16(0x0504), _mm256_set1_epi16(0x0706),
      _mm256_set1_epi16(0x0908), _mm256_set1_epi16(0x0b0a), _mm256_set1_epi16(0x0d0c), _mm256_set1_epi16(0x0f0e)};
  for (int64_t b = 0; b < superblocks; ++b, w += 144) {
    const float dw = f16(w), dminw = f16(w + 2);
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
    const __m256i scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(sc))));
    // 32 bytes per 64 values: sub-block 2j in the low nibbles, 2j + 1 in the high nibbles.
    __m256i nib[8], scl[8];
    for (int j = 0; j < 4; ++j) {
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 + 32 * j));
      nib[2 * j] = _mm256_and_si256(q, low);
      nib[2 * j + 1] = _mm256_and_si256(_mm256_srli_epi16(q, 4), low);
    }
    for (int j = 0; j < 8; ++j) scl[j] = _mm256_shuffle_epi8(scales, pick[j]);
    for (int r = 0; r < R; ++r) {
      const BlockQ8K& xb = x[r][b];
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.bsums));
      const __m128i bsum32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
      const int mins = hsum_i32(_mm_madd_epi16(mins16, bsum32));
      __m256i sumi = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) {
        const __m256i p = _mm256_maddubs_epi16(nib[j], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.q + 32 * j)));
        sumi = madd_acc(sumi, p, scl[j]);
      }
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(dw * xb.d), acc[r]);
      corr[r] += dminw * xb.d * static_cast<float>(mins);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]) - corr[r];
}

template <int R>
void dot_q6_k(const std::byte* w, const BlockQ8K* const* x, int64_t superblocks, float* out) {
  __m256 acc[R];
  float corr[R] = {};
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i low = _mm256_set1_epi8(0x0f), two = _mm256_set1_epi8(3);
  // Run k of a half: the low 128 bits cover values 0..15 (scale 2k), the high 128 bits 16..31 (2k + 1).
  const __m256i pick[4] = {
      _mm256_setr_epi64x(0x0100010001000100, 0x0100010001000100, 0x0302030203020302, 0x0302030203020302),
      _mm256_setr_epi64x(0x0504050405040504, 0x0504050405040504, 0x0706070607060706, 0x0706070607060706),
      _mm256_setr_epi64x(0x0908090809080908, 0x0908090809080908, 0x0b0a0b0a0b0a0b0a, 0x0b0a0b0a0b0a0b0a),
      _mm256_setr_epi64x(0x0d0c0d0c0d0c0d0c, 0x0d0c0d0c0d0c0d0c, 0x0f0e0f0e0f0e0f0e, 0x0f0e0f0e0f0e0f0e)};
  for (int64_t b = 0; b < superblocks; ++b, w += 210) {
    const std::byte* sc = w + 192;
    const float dw = f16(w + 208);
    const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
    // Eight runs of 32 values (two halves of four): low/high nibbles of ql[0..31] / ql[32..63] with
    // 2 bits each from qh; codes are stored + 32.
    __m256i q[8], scl[8];
    for (int half = 0; half < 2; ++half) {
      const std::byte* ql = w + 64 * half;
      const std::byte* qh = w + 128 + 32 * half;
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
      __m256i* qq = q + 4 * half;
      qq[0] = _mm256_or_si256(_mm256_and_si256(l0, low), _mm256_slli_epi16(_mm256_and_si256(h, two), 4));
      qq[1] = _mm256_or_si256(_mm256_and_si256(l1, low),
                              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), two), 4));
      qq[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low),
                              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), two), 4));
      qq[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low),
                              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), two), 4));
      const __m256i scales = _mm256_broadcastsi128_si256(
          _mm_cvtepi8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc + 8 * half))));
      for (int k = 0; k < 4; ++k) scl[4 * half + k] = _mm256_shuffle_epi8(scales, pick[k]);
    }
    for (int r = 0; r < R; ++r) {
      const BlockQ8K& xb = x[r][b];
      const __m256i off = _mm256_madd_epi16(sc16, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.bsums)));
      const int offset = hsum_i32(_mm_add_epi32(_mm256_castsi256_si128(off), _mm256_extracti128_si256(off, 1)));
      __m256i sumi = _mm256_setzero_si256();
      for (int k = 0; k < 8; ++k) {
        const __m256i p = _mm256_maddubs_epi16(q[k], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.q + 32 * k)));
        sumi = madd_acc(sumi, p, scl[k]);
      }
      const float d = dw * xb.d;
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d), acc[r]);
      corr[r] += 32.0f * d * static_cast<float>(offset);
    }
  }
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]) - corr[r];
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

// Fused kernels for n activation rows: activations quantized once, then each weight row is streamed
// once and dotted with every activation row, four at a time.
template <typename Block, int kValues, template <int> class Kernel>
void matmul_quant(ThreadPool& pool, const Matrix& w, void (*quantize)(const float*, int64_t, Block*),
                  const float* x, int64_t n, float* y) {
  const int64_t O = w.rows, I = w.cols, nb = I / kValues;
  std::vector<Block> qx(static_cast<size_t>(n * nb));
  pool.parallel_for(n, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) quantize(x + r * I, I, qx.data() + r * nb);
  });
  pool.parallel_for(O, 16, [&](int64_t o0, int64_t o1) {
    const Block* rows[4];
    float out[4];
    for (int64_t o = o0; o < o1; ++o) {
      const std::byte* wr = w.row(o);
      for (int64_t r = 0; r < n; r += 4) {
        const int m = static_cast<int>(std::min<int64_t>(4, n - r));
        for (int k = 0; k < m; ++k) rows[k] = qx.data() + (r + k) * nb;
        switch (m) {
          case 4: Kernel<4>::run(wr, rows, nb, out); break;
          case 3: Kernel<3>::run(wr, rows, nb, out); break;
          case 2: Kernel<2>::run(wr, rows, nb, out); break;
          default: Kernel<1>::run(wr, rows, nb, out); break;
        }
        for (int k = 0; k < m; ++k) y[(r + k) * O + o] = out[k];
      }
    }
  });
}

template <int R> struct Q8_0Kernel { static void run(const std::byte* w, const BlockQ8X* const* x, int64_t nb, float* o) { dot_q8_0<R>(w, x, nb, o); } };
template <int R> struct Q4_0Kernel { static void run(const std::byte* w, const BlockQ8X* const* x, int64_t nb, float* o) { dot_q4_0<R>(w, x, nb, o); } };
template <int R> struct Q4_KKernel { static void run(const std::byte* w, const BlockQ8K* const* x, int64_t nb, float* o) { dot_q4_k<R>(w, x, nb, o); } };
template <int R> struct Q6_KKernel { static void run(const std::byte* w, const BlockQ8K* const* x, int64_t nb, float* o) { dot_q6_k<R>(w, x, nb, o); } };

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

// One weight row to F32: F16 / BF16 convert in registers, other types through the SDK codec.
void decode_tile_row(const Matrix& w, int64_t row, float* dst) {
  const int64_t I = w.cols;
  const auto* h = reinterpret_cast<const uint16_t*>(w.row(row));
  if (w.type == DType::BF16 || w.type == DType::F16) {
    int64_t i = 0;
    for (; i + 8 <= I; i += 8) _mm256_storeu_ps(dst + i, w.type == DType::BF16 ? load_bf16(h + i) : load_f16(h + i));
    for (; i < I; ++i) dst[i] = w.type == DType::BF16 ? bf16_to_fp32(h[i]) : fp16_to_fp32(h[i]);
    return;
  }
  decode_row(w.type, w.row(row), I, dst, w.quant, w.row_offset + row);
}

// Many activation rows: each thread takes a share of the weight rows, decodes them tile by tile to
// F32 (F32 weights are used in place) and runs a single-threaded oneDNN GEMM on the tile. Our pool
// does the threading so oneDNN's OpenMP team never competes with it for the cores.
void matmul_gemm(ThreadPool& pool, const Matrix& w, const float* x, int64_t n, float* y) {
  const int64_t O = w.rows, I = w.cols;
  constexpr int64_t kTile = 64;  // weight rows per tile: 64 x I floats stay in L2
  pool.parallel_for(O, kTile, [&](int64_t o0, int64_t o1) {
    omp_set_num_threads(1);
    std::vector<float> tile;
    for (int64_t t0 = o0; t0 < o1; t0 += kTile) {
      const int64_t rows = std::min(kTile, o1 - t0);
      const float* b;
      if (w.type == DType::F32) {
        b = reinterpret_cast<const float*>(w.row(t0));
      } else {
        tile.resize(static_cast<size_t>(rows * I));
        for (int64_t r = 0; r < rows; ++r) decode_tile_row(w, t0 + r, tile.data() + r * I);
        b = tile.data();
      }
      // Row-major: y[:, t0:t0+rows] = x[n, I] @ b[rows, I]^T.
      const dnnl_status_t st = dnnl_sgemm('N', 'T', n, rows, I, 1.0f, x, I, b, I, 0.0f, y + t0, O);
      if (st != dnnl_success) fail("CPU backend: oneDNN sgemm failed with status {}", static_cast<int>(st));
    }
  });
}

}  // namespace

// Activation rows from which the tiled oneDNN GEMM is used. Below 16 rows (decode, speculative
// verification) the fused kernels are as fast and keep the summation order of the one-row case.
int64_t gemm_min_rows(DType type) {
  switch (type) {
    case DType::Q8_0:
    case DType::Q4_0:
    case DType::Q4_K:
    case DType::Q6_K:
      return std::numeric_limits<int64_t>::max();  // the fused int8 kernels win at any row count
    default: return 16;
  }
}

void matmul(ThreadPool& pool, const Matrix& w, const float* x, int64_t n, float* y) {
  if (n >= gemm_min_rows(w.type)) return matmul_gemm(pool, w, x, n, y);
  const bool plain = w.type == DType::F32 || w.type == DType::F16 || w.type == DType::BF16;
  if (plain) return matmul_float(pool, w, x, n, y);
  switch (w.type) {
    case DType::Q8_0: return matmul_quant<BlockQ8X, 32, Q8_0Kernel>(pool, w, &quantize_x, x, n, y);
    case DType::Q4_0: return matmul_quant<BlockQ8X, 32, Q4_0Kernel>(pool, w, &quantize_x, x, n, y);
    case DType::Q4_K: return matmul_quant<BlockQ8K, 256, Q4_KKernel>(pool, w, &quantize_x_k, x, n, y);
    case DType::Q6_K: return matmul_quant<BlockQ8K, 256, Q6_KKernel>(pool, w, &quantize_x_k, x, n, y);
    default: break;
  }
  matmul_generic(pool, w, x, n, y);
}

}  // namespace specula::cpu
