// Matrix kernels for K-quant weights (Q4_K, Q5_K, Q6_K): 256-value super-blocks.
// Compiled once per instruction set (qkernels.hpp, isa.hpp).
#include "qkernels.hpp"

namespace specula::cpu::SPECULA_ISA_NS {
namespace {

// q: int8[cols] | scale: float[cols / 256] | bsums: int16[cols / 16] (sums of 16 codes, for the offsets)
// | bsums32: int16[cols / 32] (sums of 32 codes: the packed Q4_K panels' mins meet them in pairs)
size_t xk_bytes(int64_t cols) {
  const size_t c = static_cast<size_t>(cols);
  return align64(c + c / 64 + c / 8 + c / 16);
}

// d = max |x| / 127 per super-block, q = x / d rounded to nearest even (as nearbyintf in the default
// mode), with the sums of each 16 and each 32 codes. In vectors: a call per value to libm's fmaxf cost E2B
// Q4_K_M ~5 % of a verification (256 x 1536 products at 9 rows took 6x their time at one).
void quantize_xk(const float* x, int64_t cols, std::byte* rec) {
  auto* q = reinterpret_cast<int8_t*>(rec);
  auto* scale = reinterpret_cast<float*>(rec + cols);
  auto* bsums = reinterpret_cast<int16_t*>(rec + cols + cols / 64);
  auto* bsums32 = reinterpret_cast<int16_t*>(rec + cols + cols / 64 + cols / 8);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < cols / 256; ++b) {
    const float* xb = x + 256 * b;
    __m256 amax = _mm256_setzero_ps();
    for (int k = 0; k < 32; ++k) amax = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(xb + 8 * k)), amax);
    const float d = hmax8(amax) / 127.0f;
    const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    scale[b] = d;
    for (int c = 0; c < 8; ++c) {  // 32 values: codes in order, then the sums of their two halves
      __m256i i[4];
      for (int k = 0; k < 4; ++k) i[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xb + 32 * c + 8 * k), id));
      const __m256i qv = pack_i8(i);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 256 * b + 32 * c), qv);
      // Lane k: the sum of codes 4k..4k+3; two horizontal adds leave each 128-bit half's total in its first lane.
      __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), qv), _mm256_set1_epi16(1));
      s = _mm256_hadd_epi32(s, s);
      s = _mm256_hadd_epi32(s, s);
      const int lo = _mm256_cvtsi256_si32(s), hi = _mm_cvtsi128_si32(_mm256_extracti128_si256(s, 1));
      bsums[16 * b + 2 * c] = static_cast<int16_t>(lo);
      bsums[16 * b + 2 * c + 1] = static_cast<int16_t>(hi);
      bsums32[8 * b + c] = static_cast<int16_t>(lo + hi);
    }
  }
}

struct XK {
  const int8_t* q;
  const float* d;
  const int16_t* bsums;
  const int16_t* bsums32;
};
inline XK xk(const std::byte* x, size_t xs, int r, int64_t cols) {
  const std::byte* p = x + r * xs;
  return {at<int8_t>(p, 0), at<float>(p, cols), at<int16_t>(p, cols + cols / 64), at<int16_t>(p, cols + cols / 64 + cols / 8)};
}

// Q4_K and Q5_K: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins for 8 sub-blocks of 32 values
// (bytes 0-3 / 4-7 hold the low 6 bits of scales / mins 0-3, their top 2 bits extend scales / mins 4-7,
// bytes 8-11 the low 4 bits of scales and mins 4-7); Q5_K then 32 bytes of fifth bits (bit 2j of byte l
// for value l of sub-block 2j, bit 2j + 1 for value l of sub-block 2j + 1); then 128 bytes of nibbles,
// 32 per 64 values, sub-block 2j in the low nibbles, 2j + 1 in the high ones.
// value = d * scale * code - dmin * min.
template <bool kQ5>
struct K4 {
  static constexpr size_t kBytes = kQ5 ? 176 : 144;
  static void scales(const std::byte* wb, uint64_t& sc, uint64_t& mn) {
    uint32_t s[3];
    std::memcpy(s, wb + 4, 12);
    sc = (s[0] & 0x3f3f3f3fu) | (static_cast<uint64_t>((s[2] & 0x0f0f0f0fu) | ((s[0] >> 2) & 0x30303030u)) << 32);
    mn =
        (s[1] & 0x3f3f3f3fu) | (static_cast<uint64_t>(((s[2] >> 4) & 0x0f0f0f0fu) | ((s[1] >> 2) & 0x30303030u)) << 32);
  }
  // The codes of values 64j .. 64j + 63: sub-block 2j in lo, 2j + 1 in hi.
  static void codes(const std::byte* wb, int j, __m256i& lo, __m256i& hi) {
    const __m256i low = _mm256_set1_epi8(0x0f);
    const __m256i qv = loadu256(wb + (kQ5 ? 48 : 16) + 32 * j);
    lo = _mm256_and_si256(qv, low);
    hi = _mm256_and_si256(_mm256_srli_epi16(qv, 4), low);
    if constexpr (kQ5) {
      const __m256i h = loadu256(wb + 16), one = _mm256_set1_epi8(1);
      lo = _mm256_or_si256(lo,
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * j)), one), 4));
      hi = _mm256_or_si256(
          hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(h, _mm_cvtsi32_si128(2 * j + 1)), one), 4));
    }
  }
};

// Q4_K / Q5_K tiles.
template <bool kQ5>
struct K4Tiles {
  template <int RW, int RX>
  struct Tile {
    static void run(const std::byte* w, size_t wrb, const std::byte* x, size_t xs, int64_t cols, float* y,
                    int64_t ldy) {
      const int64_t nsb = cols / 256;
      XK xr[RX];
      for (int r = 0; r < RX; ++r) xr[r] = xk(x, xs, r, cols);
      __m256 acc[RW][RX];
      for (int i = 0; i < RW; ++i)
        for (int r = 0; r < RX; ++r) acc[i][r] = _mm256_setzero_ps();
      for (int64_t b = 0; b < nsb; ++b) {
        __m256 dw[RW], dminw[RW];
        __m128i mins16[RW];
#if SPECULA_WIDE
        __m512i nib[RW][4], scl[RW][4];
#else
        __m256i nib[RW][8], scl[RW][8];
#endif
        for (int i = 0; i < RW; ++i) {
          const std::byte* wb = w + i * wrb + K4<kQ5>::kBytes * b;
          prefetch_ahead(wb, K4<kQ5>::kBytes);
          dw[i] = _mm256_set1_ps(f16(wb));
          dminw[i] = _mm256_set1_ps(f16(wb + 2));
          uint64_t sc, mn;
          K4<kQ5>::scales(wb, sc, mn);
          mins16[i] = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(mn)));
          for (int j = 0; j < 4; ++j) {
            __m256i lo, hi;
            K4<kQ5>::codes(wb, j, lo, hi);
            const __m256i s0 = _mm256_set1_epi16(static_cast<int16_t>((sc >> (16 * j)) & 0xff));
            const __m256i s1 = _mm256_set1_epi16(static_cast<int16_t>((sc >> (16 * j + 8)) & 0xff));
#if SPECULA_WIDE
            nib[i][j] = join(lo, hi);
            scl[i][j] = join(s0, s1);
#else
            nib[i][2 * j] = lo, nib[i][2 * j + 1] = hi;
            scl[i][2 * j] = s0, scl[i][2 * j + 1] = s1;
#endif
          }
        }
        for (int r = 0; r < RX; ++r) {
          const int8_t* xq = xr[r].q + 256 * b;
          const __m256 xd = _mm256_set1_ps(xr[r].d[b]);
          const __m256i bs = loadu256(xr[r].bsums + 16 * b);
          const __m128i bsum32 = _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
          for (int i = 0; i < RW; ++i) {
#if SPECULA_WIDE
            __m512i sumi = _mm512_setzero_si512();
            for (int j = 0; j < 4; ++j)
              sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(nib[i][j], _mm512_loadu_si512(xq + 64 * j)),
                                         scl[i][j]);
            const __m256i s8 = fold(sumi);
#else
            __m256i s8 = _mm256_setzero_si256();
            for (int j = 0; j < 8; ++j)
              s8 = _mm256_add_epi32(
                  s8, _mm256_madd_epi16(_mm256_maddubs_epi16(nib[i][j], loadu256(xq + 32 * j)), scl[i][j]));
#endif
            acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s8), _mm256_mul_ps(dw[i], xd), acc[i][r]);
            // The mins: four lanes of sum(min * bsum) in the same accumulator, with dmin instead of d.
            const __m256i m = _mm256_zextsi128_si256(_mm_madd_epi16(mins16[i], bsum32));
            acc[i][r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(dminw[i], xd), acc[i][r]);
          }
        }
      }
      for (int i = 0; i < RW; ++i)
        for (int r = 0; r < RX; ++r) y[r * ldy + i] = hsum8(acc[i][r]);
    }
  };
};

// Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit high parts, 16 int8 scales (one per 16 values),
// f16 d. Codes are stored + 32. Per half of 128 values: ql[0..63], qh[0..31];
//   v[l] = ql[l] & 15 | (qh[l] & 3) << 4,            v[l + 32] = ql[l + 32] & 15 | (qh[l] >> 2 & 3) << 4,
//   v[l + 64] = ql[l] >> 4 | (qh[l] >> 4 & 3) << 4,  v[l + 96] = ql[l + 32] >> 4 | (qh[l] >> 6 & 3) << 4.
template <int RW, int RX>
struct Q6_KTile {
  static void run(const std::byte* w, size_t wrb, const std::byte* x, size_t xs, int64_t cols, float* y, int64_t ldy) {
    const int64_t nsb = cols / 256;
    XK xr[RX];
    for (int r = 0; r < RX; ++r) xr[r] = xk(x, xs, r, cols);
    __m256 acc[RW][RX];
    for (int i = 0; i < RW; ++i)
      for (int r = 0; r < RX; ++r) acc[i][r] = _mm256_setzero_ps();
    const __m256i low = _mm256_set1_epi8(0x0f), two = _mm256_set1_epi8(3);
    for (int64_t b = 0; b < nsb; ++b) {
      __m256 dw[RW];
      __m256i sc16[RW];
#if SPECULA_WIDE
      __m512i q[RW][4], scl[RW][4];
#else
      __m256i q[RW][8], scl[RW][8];
#endif
      for (int i = 0; i < RW; ++i) {
        const std::byte* wb = w + i * wrb + 210 * b;
        prefetch_ahead(wb, 210);
        const std::byte* sc = wb + 192;
        dw[i] = _mm256_set1_ps(f16(wb + 208));
        const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(sc));
        sc16[i] = _mm256_cvtepi8_epi16(sc8);
        for (int half = 0; half < 2; ++half) {
          const std::byte* ql = wb + 64 * half;
          const __m256i l0 = loadu256(ql), l1 = loadu256(ql + 32), h = loadu256(wb + 128 + 32 * half);
          const __m256i v0 = _mm256_or_si256(_mm256_and_si256(l0, low), _mm256_slli_epi16(_mm256_and_si256(h, two), 4));
          const __m256i v1 = _mm256_or_si256(_mm256_and_si256(l1, low),
                                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), two), 4));
          const __m256i v2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low),
                                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), two), 4));
          const __m256i v3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low),
                                             _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), two), 4));
          // Run k (32 values): i16 lanes 0-7 take scale 8 half + 2k, lanes 8-15 scale 8 half + 2k + 1.
          __m256i s[4];
          for (int k = 0; k < 4; ++k) {
            const int16_t a = static_cast<int16_t>(static_cast<int8_t>(sc[8 * half + 2 * k]));
            const int16_t c = static_cast<int16_t>(static_cast<int8_t>(sc[8 * half + 2 * k + 1]));
            s[k] = _mm256_set_m128i(_mm_set1_epi16(c), _mm_set1_epi16(a));
          }
#if SPECULA_WIDE
          q[i][2 * half] = join(v0, v1), q[i][2 * half + 1] = join(v2, v3);
          scl[i][2 * half] = join(s[0], s[1]), scl[i][2 * half + 1] = join(s[2], s[3]);
#else
          __m256i* qq = q[i] + 4 * half;
          qq[0] = v0, qq[1] = v1, qq[2] = v2, qq[3] = v3;
          for (int k = 0; k < 4; ++k) scl[i][4 * half + k] = s[k];
#endif
        }
      }
      for (int r = 0; r < RX; ++r) {
        const int8_t* xq = xr[r].q + 256 * b;
        const __m256 xd = _mm256_set1_ps(xr[r].d[b]);
        const __m256i bs = loadu256(xr[r].bsums + 16 * b);
        for (int i = 0; i < RW; ++i) {
          // The codes' offset: 32 * sum(scale * bsum), eight lanes, subtracted in the same accumulator.
          const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(sc16[i], bs), 5);
#if SPECULA_WIDE
          __m512i sumi = _mm512_setzero_si512();
          for (int k = 0; k < 4; ++k)
            sumi = _mm512_dpwssd_epi32(sumi, _mm512_maddubs_epi16(q[i][k], _mm512_loadu_si512(xq + 64 * k)), scl[i][k]);
          const __m256i s8 = fold(sumi);
#else
          __m256i s8 = _mm256_setzero_si256();
          for (int k = 0; k < 8; ++k)
            s8 = _mm256_add_epi32(s8,
                                  _mm256_madd_epi16(_mm256_maddubs_epi16(q[i][k], loadu256(xq + 32 * k)), scl[i][k]));
#endif
          const __m256 d = _mm256_mul_ps(dw[i], xd);
          acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s8), d, acc[i][r]);
          acc[i][r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(off), d, acc[i][r]);
        }
      }
    }
    for (int i = 0; i < RW; ++i)
      for (int r = 0; r < RX; ++r) y[r * ldy + i] = hsum8(acc[i][r]);
  }
};

// Unsigned codes of one Q4_K / Q5_K super-block in value order, d * scale and dmin * min per sub-block.
template <bool kQ5>
struct K4Pack {
  static void unpack(const std::byte* wb, uint8_t* codes, float* scale, float* mins) {
    const float d = f16(wb), dmin = f16(wb + 2);
    uint64_t sc, mn;
    K4<kQ5>::scales(wb, sc, mn);
    for (int j = 0; j < 8; ++j) {
      scale[j] = d * static_cast<float>((sc >> (8 * j)) & 0xff);
      mins[j] = dmin * static_cast<float>((mn >> (8 * j)) & 0xff);
    }
    for (int j = 0; j < 4; ++j) {
      __m256i lo, hi;
      K4<kQ5>::codes(wb, j, lo, hi);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + 64 * j), lo);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + 64 * j + 32), hi);
    }
  }
};

// Q6_K: codes 0..63 (stored + 32) in value order, d * scale per 16 values.
struct Q6_KPack {
  static void unpack(const std::byte* wb, uint8_t* codes, float* scale, float*) {
    const float d = f16(wb + 208);
    for (int g = 0; g < 16; ++g) scale[g] = d * static_cast<float>(static_cast<int8_t>(wb[192 + g]));
    const __m256i low = _mm256_set1_epi8(0x0f), two = _mm256_set1_epi8(3);
    for (int half = 0; half < 2; ++half) {
      const std::byte* ql = wb + 64 * half;
      const __m256i l0 = loadu256(ql), l1 = loadu256(ql + 32), h = loadu256(wb + 128 + 32 * half);
      uint8_t* c = codes + 128 * half;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(c),
                          _mm256_or_si256(_mm256_and_si256(l0, low), _mm256_slli_epi16(_mm256_and_si256(h, two), 4)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + 32),
                          _mm256_or_si256(_mm256_and_si256(l1, low),
                                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), two), 4)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + 64),
                          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low),
                                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), two), 4)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(c + 96),
                          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low),
                                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), two), 4)));
    }
  }
};

// ---- prefill panels for K-quants (AVX-512: 16 rows; AVX2: 8 rows per register, maddubs + madd) -------
// As for 32-value blocks: per super-block, 16 weight rows' codes (unsigned) in 64 groups of [16 rows][4],
// and per sub-block the products d * scale (and dmin * min) as floats for the 16 rows.
#if SPECULA_WIDE
struct KPanelBlock {
  uint8_t codes[64][16][4];
  float scale[16][16];  // Q4_K: 8 sub-blocks of 32 values, Q6_K: 16 of 16
  float mins[8][16];    // Q4_K only
};
#else
struct KPanelBlock {
  uint8_t codes[64][8][4];
  float scale[16][8];
  float mins[8][8];
};
#endif
constexpr int64_t kKPanelBlocks = 8;  // super-blocks per pass: two panels of 44 KB

#if SPECULA_WIDE
template <class Pack>
void pack_kpanel(const std::byte* w, size_t wrb, size_t sb_bytes, int rows, int64_t b0, int64_t nb, KPanelBlock* out) {
  alignas(64) uint8_t codes[16][256];
  alignas(64) float scale[16][16], mins[16][8];
  std::memset(codes, 0, sizeof codes);
  std::memset(scale, 0, sizeof scale);
  std::memset(mins, 0, sizeof mins);
  __m512i g8[8];
  for (int64_t b = 0; b < nb; ++b) {
    for (int i = 0; i < rows; ++i) Pack::unpack(w + i * wrb + sb_bytes * (b0 + b), codes[i], scale[i], mins[i]);
    for (int c = 0; c < 8; ++c) {
      transpose16x8(&codes[0][32 * c], 256, g8);
      for (int g = 0; g < 8; ++g) _mm512_store_si512(out[b].codes[8 * c + g], g8[g]);
    }
    for (int c = 0; c < 2; ++c) {
      transpose16x8(&scale[0][8 * c], 64, g8);
      for (int j = 0; j < 8; ++j) _mm512_store_si512(out[b].scale[8 * c + j], g8[j]);
    }
    transpose16x8(&mins[0][0], 32, g8);
    for (int j = 0; j < 8; ++j) _mm512_store_si512(out[b].mins[j], g8[j]);
  }
}
#else
template <class Pack>
void pack_kpanel(const std::byte* w, size_t wrb, size_t sb_bytes, int rows, int64_t b0, int64_t nb, KPanelBlock* out) {
  alignas(64) uint8_t codes[8][256];
  alignas(64) float scale[8][16], mins[8][8];
  std::memset(codes, 0, sizeof codes);
  std::memset(scale, 0, sizeof scale);
  std::memset(mins, 0, sizeof mins);
  __m256i g8[8];
  for (int64_t b = 0; b < nb; ++b) {
    for (int i = 0; i < rows; ++i) Pack::unpack(w + i * wrb + sb_bytes * (b0 + b), codes[i], scale[i], mins[i]);
    for (int c = 0; c < 8; ++c) {
      transpose8x8(&codes[0][32 * c], 256, g8);
      for (int g = 0; g < 8; ++g) _mm256_store_si256(reinterpret_cast<__m256i*>(out[b].codes[8 * c + g]), g8[g]);
    }
    for (int c = 0; c < 2; ++c) {
      transpose8x8(&scale[0][8 * c], 64, g8);
      for (int j = 0; j < 8; ++j) _mm256_store_si256(reinterpret_cast<__m256i*>(out[b].scale[8 * c + j]), g8[j]);
    }
    transpose8x8(&mins[0][0], 32, g8);
    for (int j = 0; j < 8; ++j) _mm256_store_si256(reinterpret_cast<__m256i*>(out[b].mins[j]), g8[j]);
  }
}
#endif

#if SPECULA_WIDE
inline __m512i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// One super-block of RX activation rows x NP panels into t (before the activation scale).
template <int RX, int NP>
inline void q4_k_panel_block(const KPanelBlock* const* panel, int64_t b, const int8_t* const* xq,
                             const int16_t* const* bs, __m512 (&t)[NP][RX]) {
  for (int j = 0; j < 8; ++j) {
    __m512i s[NP][RX];
    for (int p = 0; p < NP; ++p)
      for (int r = 0; r < RX; ++r) s[p][r] = _mm512_setzero_si512();
    for (int g = 0; g < 8; ++g) {
      __m512i wv[NP];
      for (int p = 0; p < NP; ++p) wv[p] = _mm512_load_si512(panel[p][b].codes[8 * j + g]);
      for (int r = 0; r < RX; ++r) {
        const __m512i xv = bcast4(xq[r] + 32 * j + 4 * g);
        for (int p = 0; p < NP; ++p) s[p][r] = _mm512_dpbusd_epi32(s[p][r], wv[p], xv);
      }
    }
    for (int r = 0; r < RX; ++r) {
      const __m512 bsum = _mm512_set1_ps(static_cast<float>(bs[r][2 * j] + bs[r][2 * j + 1]));
      for (int p = 0; p < NP; ++p) {
        t[p][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[p][r]), _mm512_load_ps(panel[p][b].scale[j]), t[p][r]);
        t[p][r] = _mm512_fnmadd_ps(_mm512_load_ps(panel[p][b].mins[j]), bsum, t[p][r]);
      }
    }
  }
}

template <int RX, int NP>
inline void q6_k_panel_block(const KPanelBlock* const* panel, int64_t b, const int8_t* const* xq,
                             const int16_t* const* bs, __m512 (&t)[NP][RX]) {
  for (int j = 0; j < 16; ++j) {
    __m512i s[NP][RX];
    for (int r = 0; r < RX; ++r) {
      const __m512i init = _mm512_set1_epi32(-32 * bs[r][j]);
      for (int p = 0; p < NP; ++p) s[p][r] = init;
    }
    for (int g = 0; g < 4; ++g) {
      __m512i wv[NP];
      for (int p = 0; p < NP; ++p) wv[p] = _mm512_load_si512(panel[p][b].codes[4 * j + g]);
      for (int r = 0; r < RX; ++r) {
        const __m512i xv = bcast4(xq[r] + 16 * j + 4 * g);
        for (int p = 0; p < NP; ++p) s[p][r] = _mm512_dpbusd_epi32(s[p][r], wv[p], xv);
      }
    }
    for (int p = 0; p < NP; ++p) {
      const __m512 sc = _mm512_load_ps(panel[p][b].scale[j]);
      for (int r = 0; r < RX; ++r) t[p][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[p][r]), sc, t[p][r]);
    }
  }
}

template <bool kQ6, int RX, int NP>
void kpanel_tile(const KPanelBlock* const* panel, const __mmask16* valid, int64_t b0, int64_t nb, bool first,
                 const std::byte* x, size_t xs, int64_t cols, float* y, int64_t ldy) {
  XK xr[RX];
  for (int r = 0; r < RX; ++r) xr[r] = xk(x, xs, r, cols);
  __m512 acc[NP][RX];
  for (int p = 0; p < NP; ++p)
    for (int r = 0; r < RX; ++r)
      acc[p][r] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(valid[p], y + r * ldy + 16 * p);
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t sb = b0 + b;
    const int8_t* xq[RX];
    const int16_t* bs[RX];
    for (int r = 0; r < RX; ++r) xq[r] = xr[r].q + 256 * sb, bs[r] = xr[r].bsums + 16 * sb;
    __m512 t[NP][RX];
    for (int p = 0; p < NP; ++p)
      for (int r = 0; r < RX; ++r) t[p][r] = _mm512_setzero_ps();
    if constexpr (kQ6)
      q6_k_panel_block<RX, NP>(panel, b, xq, bs, t);
    else
      q4_k_panel_block<RX, NP>(panel, b, xq, bs, t);
    for (int r = 0; r < RX; ++r) {
      const __m512 dx = _mm512_set1_ps(xr[r].d[sb]);
      for (int p = 0; p < NP; ++p) acc[p][r] = _mm512_fmadd_ps(t[p][r], dx, acc[p][r]);
    }
  }
  for (int p = 0; p < NP; ++p)
    for (int r = 0; r < RX; ++r) _mm512_mask_storeu_ps(y + r * ldy + 16 * p, valid[p], acc[p][r]);
}

template <bool kQ6, int NP>
void kpanel_rows(const KPanelBlock* const* panel, const __mmask16* valid, int64_t b0, int64_t nb, bool first,
                 const std::byte* x, size_t xs, int64_t nx, int64_t cols, float* y, int64_t ldy) {
  constexpr int RX = 3;
  int64_t r = 0;
  for (; r + RX <= nx; r += RX)
    kpanel_tile<kQ6, RX, NP>(panel, valid, b0, nb, first, x + r * xs, xs, cols, y + r * ldy, ldy);
  for (; r < nx; ++r) kpanel_tile<kQ6, 1, NP>(panel, valid, b0, nb, first, x + r * xs, xs, cols, y + r * ldy, ldy);
}
#else
inline __m256i dot_group(__m256i w, const int8_t* x) {
  int32_t v;
  std::memcpy(&v, x, 4);
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, _mm256_set1_epi32(v)), _mm256_set1_epi16(1));
}

template <bool kQ6, int RX>
void kpanel_tile(const KPanelBlock* panel, int valid, int64_t b0, int64_t nb, bool first, const std::byte* x, size_t xs,
                 int64_t cols, float* y, int64_t ldy) {
  XK xr[RX];
  for (int r = 0; r < RX; ++r) xr[r] = xk(x, xs, r, cols);
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256 acc[RX];
  for (int r = 0; r < RX; ++r) acc[r] = first ? _mm256_setzero_ps() : _mm256_maskload_ps(y + r * ldy, mask);
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t sb = b0 + b;
    const KPanelBlock& pb = panel[b];
    __m256 t[RX];
    for (int r = 0; r < RX; ++r) t[r] = _mm256_setzero_ps();
    constexpr int kGroups = kQ6 ? 16 : 8, kPer = kQ6 ? 4 : 8;  // sub-blocks, 4-value groups per sub-block
    for (int j = 0; j < kGroups; ++j) {
      __m256i sum[RX];
      for (int r = 0; r < RX; ++r)
        sum[r] = kQ6 ? _mm256_set1_epi32(-32 * xr[r].bsums[16 * sb + j]) : _mm256_setzero_si256();
      for (int g = 0; g < kPer; ++g) {
        const __m256i wv = _mm256_load_si256(reinterpret_cast<const __m256i*>(pb.codes[kPer * j + g]));
        for (int r = 0; r < RX; ++r)
          sum[r] = _mm256_add_epi32(sum[r], dot_group(wv, xr[r].q + 256 * sb + 4 * (kPer * j + g)));
      }
      const __m256 sc = _mm256_load_ps(pb.scale[j]);
      for (int r = 0; r < RX; ++r) {
        t[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r]), sc, t[r]);
        if constexpr (!kQ6) {
          const int16_t* bs = xr[r].bsums + 16 * sb;
          t[r] = _mm256_fnmadd_ps(_mm256_load_ps(pb.mins[j]),
                                  _mm256_set1_ps(static_cast<float>(bs[2 * j] + bs[2 * j + 1])), t[r]);
        }
      }
    }
    for (int r = 0; r < RX; ++r) acc[r] = _mm256_fmadd_ps(t[r], _mm256_set1_ps(xr[r].d[sb]), acc[r]);
  }
  for (int r = 0; r < RX; ++r) _mm256_maskstore_ps(y + r * ldy, mask, acc[r]);
}
#endif

#if SPECULA_WIDE
template <class Pack, bool kQ6, size_t kSuperBlockBytes>
void rows_kpanel(const std::byte* w, size_t wrb, int64_t nw, const std::byte* x, size_t xs, int64_t nx, int64_t cols,
                 float* y, int64_t ldy) {
  alignas(64) KPanelBlock buf[2][kKPanelBlocks];
  const int64_t nb = cols / 256;
  for (int64_t o = 0; o < nw; o += 32) {
    const int rows0 = static_cast<int>(nw - o < 16 ? nw - o : 16);
    const int rows1 = static_cast<int>(nw - o - 16 <= 0 ? 0 : nw - o - 16 < 16 ? nw - o - 16 : 16);
    const KPanelBlock* panel[2] = {buf[0], buf[1]};
    const __mmask16 valid[2] = {static_cast<__mmask16>((1u << rows0) - 1), static_cast<__mmask16>((1u << rows1) - 1)};
    for (int64_t b0 = 0; b0 < nb; b0 += kKPanelBlocks) {
      const int64_t n = nb - b0 < kKPanelBlocks ? nb - b0 : kKPanelBlocks;
      pack_kpanel<Pack>(w + o * wrb, wrb, kSuperBlockBytes, rows0, b0, n, buf[0]);
      if (rows1) {
        pack_kpanel<Pack>(w + (o + 16) * wrb, wrb, kSuperBlockBytes, rows1, b0, n, buf[1]);
        kpanel_rows<kQ6, 2>(panel, valid, b0, n, b0 == 0, x, xs, nx, cols, y + o, ldy);
      } else {
        kpanel_rows<kQ6, 1>(panel, valid, b0, n, b0 == 0, x, xs, nx, cols, y + o, ldy);
      }
    }
  }
}
#else
template <class Pack, bool kQ6, size_t kSuperBlockBytes>
void rows_kpanel(const std::byte* w, size_t wrb, int64_t nw, const std::byte* x, size_t xs, int64_t nx, int64_t cols,
                 float* y, int64_t ldy) {
  alignas(64) KPanelBlock buf[kKPanelBlocks];
  const int64_t nb = cols / 256;
  constexpr int RX = 3;
  for (int64_t o = 0; o < nw; o += 8) {
    const int rows = static_cast<int>(nw - o < 8 ? nw - o : 8);
    for (int64_t b0 = 0; b0 < nb; b0 += kKPanelBlocks) {
      const int64_t n = nb - b0 < kKPanelBlocks ? nb - b0 : kKPanelBlocks;
      pack_kpanel<Pack>(w + o * wrb, wrb, kSuperBlockBytes, rows, b0, n, buf);
      int64_t r = 0;
      for (; r + RX <= nx; r += RX)
        kpanel_tile<kQ6, RX>(buf, rows, b0, n, b0 == 0, x + r * xs, xs, cols, y + r * ldy + o, ldy);
      for (; r < nx; ++r) kpanel_tile<kQ6, 1>(buf, rows, b0, n, b0 == 0, x + r * xs, xs, cols, y + r * ldy + o, ldy);
    }
  }
}
#endif

// ---- packed K-quants: 16-row panels built once, read by every product -----------------------------------
// As the packed Q8_0 / Q4_0 panels (qkernels_x32.cpp): each super-block of 16 weight rows is laid out once
// so that one dpbusd with the activation's 4 bytes broadcast advances 16 dot products (AVX2: maddubs on
// 8), with the scales beside the codes as bytes, so the panel is about the file's size. Per super-block
// and row the sum is an exact integer, sum_j scale_j * dot_j (and sum_j min_j * bsum_j, or the Q6_K
// offset): AVX-512 multiplies each sub-block's dpbusd sum by its scale (vpmulld), AVX2 adds its maddubs
// pairs as 16-bit integers and multiplies them by the scale with madd; both exact, so both give the same
// integers. Then two float steps per super-block and row, the same on both sets and for every row count:
// a row's bits depend on nothing else in the batch, and not on the set.
//
// Q4_K block (2368 bytes): nibbles [32 n][16 rows][4]: dword n of a row is the file's code bytes
//   4n..4n+3 (n = 8c + k: low nibbles values 64c + 4k.., sub-block 2c; high nibbles 64c + 32 + 4k..,
//   sub-block 2c + 1) | scale u8[8 sub-blocks][16 rows] | min u8[4 pairs][16 rows][2] | d f16[16] |
//   dmin f16[16]
// Q5_K block (2880 bytes): Q4_K's nibbles | fifth bits [8 k][16 rows][4]: dword k of a row is the file's
//   qh bytes 4k..4k+3 (byte b, bit 2c: value 64c + 4k + b, low nibble of dword 8c + k; bit 2c + 1: value
//   64c + 32 + 4k + b, its high nibble) | then Q4_K's scale, min, d, dmin.
// Q6_K block (3392 bytes): low nibbles [32 n][16 rows][4] (low: value 4n + b, high: 128 + 4n + b) |
//   high parts [16 m][16 rows][4] (byte b, bits 2t..2t+1: value 4(m + 16t) + b) | scale i8[8 pairs]
//   [16 rows][2] | d f16[16] | 32 bytes of padding (64-byte blocks)
template <bool kQ5>
struct PackedK4 {
  static constexpr size_t kSuperBlockBytes = kQ5 ? 176 : 144;
  static constexpr size_t kHigh = 2048, kScale = kQ5 ? 2560 : 2048;
  static constexpr size_t kMin = kScale + 128, kD = kMin + 128, kDmin = kD + 32, kBlock = kDmin + 32;
  static void pack(const std::byte* wb, std::byte* blk, int i) {
    for (int n = 0; n < 32; ++n) std::memcpy(blk + 64 * n + 4 * i, wb + (kQ5 ? 48 : 16) + 4 * n, 4);
    if constexpr (kQ5)
      for (int k = 0; k < 8; ++k) std::memcpy(blk + kHigh + 64 * k + 4 * i, wb + 16 + 4 * k, 4);
    uint64_t sc, mn;
    K4<kQ5>::scales(wb, sc, mn);
    for (int j = 0; j < 8; ++j) {
      blk[kScale + 16 * j + i] = static_cast<std::byte>(sc >> (8 * j));
      blk[kMin + 32 * (j / 2) + 2 * i + j % 2] = static_cast<std::byte>(mn >> (8 * j));
    }
    std::memcpy(blk + kD + 2 * i, wb, 2);
    std::memcpy(blk + kDmin + 2 * i, wb + 2, 2);
  }
};
using PackedQ4_K = PackedK4<false>;
using PackedQ5_K = PackedK4<true>;
static_assert(PackedQ4_K::kBlock == 2368 && PackedQ5_K::kBlock == 2880);

struct PackedQ6_K {
  static constexpr size_t kSuperBlockBytes = 210;
  static constexpr size_t kBlock = 3392, kHigh = 2048, kScale = 3072, kD = 3328;
  static void pack(const std::byte* wb, std::byte* blk, int i) {
    alignas(32) uint8_t c[256];
    float unused[16];
    Q6_KPack::unpack(wb, c, unused, nullptr);
    for (int n = 0; n < 32; ++n)
      for (int b = 0; b < 4; ++b)
        blk[64 * n + 4 * i + b] = static_cast<std::byte>((c[4 * n + b] & 15) | (c[128 + 4 * n + b] & 15) << 4);
    for (int m = 0; m < 16; ++m)
      for (int b = 0; b < 4; ++b) {
        int v = 0;
        for (int t = 0; t < 4; ++t) v |= (c[4 * (m + 16 * t) + b] >> 4) << (2 * t);
        blk[kHigh + 64 * m + 4 * i + b] = static_cast<std::byte>(v);
      }
    for (int j = 0; j < 16; ++j) blk[kScale + 32 * (j / 2) + 2 * i + j % 2] = wb[192 + j];
    std::memcpy(blk + kD + 2 * i, wb + 208, 2);
  }
};

// Super-blocks prefetched ahead (a panel's super-block is 2-3 KB).
constexpr ptrdiff_t kKPrefetch = 2;
// Line `line` of the super-block kKPrefetch blocks ahead, issued as the same line of this one is read: with
// one burst of 37-53 prefetches per block the packed stream was no faster than the old tiles.
template <class P>
[[gnu::always_inline]] inline void prefetch_line(const std::byte* blk, int line) {
  if (64 * static_cast<size_t>(line) < P::kBlock)
    _mm_prefetch(reinterpret_cast<const char*>(blk) + kKPrefetch * P::kBlock + 64 * line, _MM_HINT_T0);
}

template <class P>
size_t packed_k_panel_bytes(int64_t cols) {
  return P::kBlock * static_cast<size_t>(cols / 256);
}

// Weight rows [0, nw) into ceil(nw / 16) panels at out (zeroed by the caller).
template <class P>
void pack_k_weights(const std::byte* w, size_t wrb, int64_t nw, int64_t cols, std::byte* out) {
  const int64_t nsb = cols / 256;
  for (int64_t o = 0; o < nw; o += kPanelRows) {
    const int rows = static_cast<int>(nw - o < kPanelRows ? nw - o : kPanelRows);
    std::byte* panel = out + static_cast<size_t>(o / kPanelRows) * packed_k_panel_bytes<P>(cols);
    for (int64_t b = 0; b < nsb; ++b)
      for (int i = 0; i < rows; ++i)
        P::pack(w + (o + i) * wrb + P::kSuperBlockBytes * b, panel + static_cast<size_t>(b) * P::kBlock, i);
  }
}

inline int32_t load4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

#if SPECULA_WIDE
// acc + dpbusd(w, the 4 activation bytes at x broadcast), with the broadcast folded into the instruction
// ({1to16}): GCC loads and broadcasts them in an instruction of its own, one per dpbusd of a tile.
[[gnu::always_inline]] inline __m512i dpbusd_bcast(__m512i acc, __m512i w, const int8_t* x) {
  asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const int32_t*>(x)));
  return acc;
}

// Sub-block 2c + H of a packed Q4_K / Q5_K super-block for RX rows into s: its exact dot times its scale.
template <bool kQ5, int RX, int H>
[[gnu::always_inline]] inline void q4_k_sub_block(const std::byte* blk, int c, const int8_t* const* xq, __m512i (&s)[RX]) {
  using P = PackedK4<kQ5>;
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  // Q5_K: bit 2c + H of each fifth-bit byte rotated to bit 4 (within its byte for every c and H).
  const __m512i rot = _mm512_set1_epi32((4 - 2 * c - H) & 31);
  __m512i t[RX];
  for (int r = 0; r < RX; ++r) t[r] = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    if (H == 0) {
      prefetch_line<P>(blk, 8 * c + k);
      if (c == 3) prefetch_line<P>(blk, 32 + k);              // Q4_K: the scales; Q5_K: the fifth bits
      if (kQ5 && c == 2) prefetch_line<P>(blk, 40 + k);  // Q5_K: the scales
    }
    const __m512i z = _mm512_loadu_si512(blk + 64 * (8 * c + k));
    __m512i w;
    if constexpr (kQ5) {
      const __m512i fifth = _mm512_and_si512(_mm512_rolv_epi32(_mm512_loadu_si512(blk + P::kHigh + 64 * k), rot), _mm512_set1_epi8(0x10));
      w = _mm512_ternarylogic_epi32(H ? _mm512_srli_epi16(z, 4) : z, fifth, m4, 0xEC);  // (nib & 15) | fifth
    } else {
      w = H ? _mm512_and_si512(_mm512_srli_epi16(z, 4), m4) : _mm512_and_si512(z, m4);
    }
    for (int r = 0; r < RX; ++r) t[r] = dpbusd_bcast(t[r], w, xq[r] + 64 * c + 32 * H + 4 * k);
  }
  const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + P::kScale + 32 * c + 16 * H)));
  for (int r = 0; r < RX; ++r) s[r] = _mm512_add_epi32(s[r], _mm512_mullo_epi32(t[r], sc));
}

// Q4_K / Q5_K: RX activation rows x one panel (`valid` of its rows are real).
template <bool kQ5, int RX>
[[gnu::always_inline]] inline void packed_q4_k_tile(const std::byte* panel, int valid, const std::byte* x, size_t xs,
                                                    int64_t cols, float* y, int64_t ldy) {
  using P = PackedK4<kQ5>;
  XK xr[RX];
  for (int r = 0; r < RX; ++r) xr[r] = xk(x, xs, r, cols);
  __m512 acc[RX];
  for (int r = 0; r < RX; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < cols / 256; ++sb) {
    const std::byte* blk = panel + static_cast<size_t>(sb) * P::kBlock;
    __m512i s[RX];
    for (int r = 0; r < RX; ++r) s[r] = _mm512_setzero_si512();
    // One sub-block at a time (RX sums live, not 2 RX), each line read for its low nibbles and again,
    // from L1, for its high ones.
    const int8_t* xq[RX];
    for (int r = 0; r < RX; ++r) xq[r] = xr[r].q + 256 * sb;
#pragma GCC unroll 1
    for (int c = 0; c < 4; ++c) {
      q4_k_sub_block<kQ5, RX, 0>(blk, c, xq, s);
      q4_k_sub_block<kQ5, RX, 1>(blk, c, xq, s);
    }
    __m512i mins[4];
    for (int k = 0; k < 4; ++k) mins[k] = _mm512_cvtepu8_epi16(loadu256(blk + P::kMin + 32 * k));
    const __m512 d = _mm512_cvtph_ps(loadu256(blk + P::kD)), dmin = _mm512_cvtph_ps(loadu256(blk + P::kDmin));
    for (int r = 0; r < RX; ++r) {
      __m512i m = _mm512_setzero_si512();
      for (int k = 0; k < 4; ++k) m = _mm512_dpwssd_epi32(m, mins[k], _mm512_set1_epi32(load4(xr[r].bsums32 + 8 * sb + 2 * k)));
      const __m512 dx = _mm512_set1_ps(xr[r].d[sb]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[r]), _mm512_mul_ps(d, dx), acc[r]);
      acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(m), _mm512_mul_ps(dmin, dx), acc[r]);
    }
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
  for (int r = 0; r < RX; ++r) _mm512_mask_storeu_ps(y + r * ldy, mask, acc[r]);
}

// Q6_K: sub-blocks J = q + 4t (t = 0..3) of a super-block share their high parts' dwords m = 4q + u (field
// t); their codes come from the low (t < 2) or high nibbles of dwords n = 4q + 16 (t % 2) + u. The loop over
// q stays a loop: unrolled over all 16 sub-blocks, GCC computed every code first and spilled them.
template <int T>
[[gnu::always_inline]] inline __m512i q6_k_codes(const std::byte* blk, int q, int u) {
  const __m512i z = _mm512_loadu_si512(blk + 64 * (4 * q + 16 * (T % 2) + u));
  const __m512i h = _mm512_loadu_si512(blk + PackedQ6_K::kHigh + 64 * (4 * q + u));
  const __m512i nib = T < 2 ? z : _mm512_srli_epi16(z, 4);
  const __m512i hs = T == 0 ? _mm512_slli_epi16(h, 4) : T == 1 ? _mm512_slli_epi16(h, 2) : T == 2 ? h : _mm512_srli_epi16(h, 2);
  // (nib & 0x0f) | (hs & 0x30): one ternary logic op once the high parts are masked.
  return _mm512_ternarylogic_epi32(nib, _mm512_and_si512(hs, _mm512_set1_epi8(0x30)), _mm512_set1_epi8(0x0f), 0xEC);
}

// Sub-block q + 4T of RX rows into s: its exact dot times its scale.
template <int RX, int T>
[[gnu::always_inline]] inline void q6_k_sub_block(const std::byte* blk, int q, const int8_t* const* xq, __m512i (&s)[RX]) {
  const int j = q + 4 * T;
  __m512i t[RX];
  for (int r = 0; r < RX; ++r) t[r] = _mm512_setzero_si512();
  for (int u = 0; u < 4; ++u) {
    prefetch_line<PackedQ6_K>(blk, 16 * T + 4 * q + u);
    const __m512i w = q6_k_codes<T>(blk, q, u);
    for (int r = 0; r < RX; ++r) t[r] = dpbusd_bcast(t[r], w, xq[r] + 16 * j + 4 * u);
  }
  // Scale j % 2 of pair j / 2, sign-extended from its 16 bits.
  const __m512i pair = _mm512_cvtepi8_epi16(loadu256(blk + PackedQ6_K::kScale + 32 * (j / 2)));
  const __m512i sc = _mm512_srai_epi32(_mm512_sll_epi32(pair, _mm_cvtsi32_si128(j % 2 ? 0 : 16)), 16);
  for (int r = 0; r < RX; ++r) s[r] = _mm512_add_epi32(s[r], _mm512_mullo_epi32(t[r], sc));
}

template <int RX>
[[gnu::always_inline]] inline void packed_q6_k_tile(const std::byte* panel, int valid, const std::byte* x, size_t xs,
                                                    int64_t cols, float* y, int64_t ldy) {
  using P = PackedQ6_K;
  XK xr[RX];
  for (int r = 0; r < RX; ++r) xr[r] = xk(x, xs, r, cols);
  __m512 acc[RX];
  for (int r = 0; r < RX; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t sb = 0; sb < cols / 256; ++sb) {
    const std::byte* blk = panel + static_cast<size_t>(sb) * P::kBlock;
    const int8_t* xq[RX];
    __m512i s[RX], off[RX];
    for (int r = 0; r < RX; ++r) {
      xq[r] = xr[r].q + 256 * sb;
      s[r] = off[r] = _mm512_setzero_si512();
    }
#pragma GCC unroll 1
    for (int q = 0; q < 4; ++q) {
      q6_k_sub_block<RX, 0>(blk, q, xq, s);
      q6_k_sub_block<RX, 1>(blk, q, xq, s);
      q6_k_sub_block<RX, 2>(blk, q, xq, s);
      q6_k_sub_block<RX, 3>(blk, q, xq, s);
    }
    // The codes' offset of 32: 32 * sum_j scale_j * bsum_j, scale pairs against bsum pairs.
    for (int k = 0; k < 8; ++k) {
      const __m512i pair = _mm512_cvtepi8_epi16(loadu256(blk + P::kScale + 32 * k));
      for (int r = 0; r < RX; ++r)
        off[r] = _mm512_dpwssd_epi32(off[r], pair, _mm512_set1_epi32(load4(xr[r].bsums + 16 * sb + 2 * k)));
    }
    const __m512 d = _mm512_cvtph_ps(loadu256(blk + P::kD));
    for (int r = 0; r < RX; ++r) {
      const __m512i t = _mm512_sub_epi32(s[r], _mm512_slli_epi32(off[r], 5));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(t), _mm512_mul_ps(d, _mm512_set1_ps(xr[r].d[sb])), acc[r]);
    }
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
  for (int r = 0; r < RX; ++r) _mm512_mask_storeu_ps(y + r * ldy, mask, acc[r]);
}
#else
// AVX2: rows 8h..8h+7 of the panel per pass (the halves of each 64-byte line).
inline __m256i dup16(__m256i v) { return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(v, 16)); }
inline __m256i load8_u8_epi32(const std::byte* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

template <bool kQ5, int RX>
[[gnu::always_inline]] inline void packed_q4_k_tile(const std::byte* panel, int valid, const std::byte* x, size_t xs,
                                                    int64_t cols, float* y, int64_t ldy) {
  using P = PackedK4<kQ5>;
  XK xr[RX];
  for (int r = 0; r < RX; ++r) xr[r] = xk(x, xs, r, cols);
  const __m256i m4 = _mm256_set1_epi8(0x0f), m5 = _mm256_set1_epi8(0x10);
  for (int h = 0; h < 2 && valid > 8 * h; ++h) {
    __m256 acc[RX];
    for (int r = 0; r < RX; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < cols / 256; ++sb) {
      const std::byte* blk = panel + static_cast<size_t>(sb) * P::kBlock;
      __m256i s[RX];
      for (int r = 0; r < RX; ++r) s[r] = _mm256_setzero_si256();
      for (int c = 0; c < 4; ++c) {
        const __m256i sl = dup16(load8_u8_epi32(blk + P::kScale + 32 * c + 8 * h));
        const __m256i sh = dup16(load8_u8_epi32(blk + P::kScale + 32 * c + 16 + 8 * h));
        // 16-bit sums of maddubs pairs, added to s by madd with the scale every kFlush groups: Q4_K's 8
        // groups of at most 2 * 15 * 127 and Q5_K's 4 of at most 2 * 31 * 127 stay below 32767.
        constexpr int kFlush = kQ5 ? 4 : 8;
        for (int k0 = 0; k0 < 8; k0 += kFlush) {
          __m256i lo[RX], hi[RX];
          for (int r = 0; r < RX; ++r) lo[r] = hi[r] = _mm256_setzero_si256();
          for (int k = k0; k < k0 + kFlush; ++k) {
            prefetch_line<P>(blk, 8 * c + k);
            if (c == 3) prefetch_line<P>(blk, 32 + k);              // Q4_K: the scales; Q5_K: the fifth bits
            if (kQ5 && c == 2) prefetch_line<P>(blk, 40 + k);  // Q5_K: the scales
            const __m256i z = loadu256(blk + 64 * (8 * c + k) + 32 * h);
            __m256i wl = _mm256_and_si256(z, m4), wh = _mm256_and_si256(_mm256_srli_epi16(z, 4), m4);
            if constexpr (kQ5) {
              // Bit 2c (2c + 1) of each fifth-bit byte to bit 4: per byte, as 16-bit shifts keep it.
              const __m256i f = loadu256(blk + P::kHigh + 64 * k + 32 * h);
              wl = _mm256_or_si256(wl, _mm256_and_si256(_mm256_slli_epi16(_mm256_srl_epi16(f, _mm_cvtsi32_si128(2 * c)), 4), m5));
              wh = _mm256_or_si256(wh, _mm256_and_si256(_mm256_slli_epi16(_mm256_srl_epi16(f, _mm_cvtsi32_si128(2 * c + 1)), 4), m5));
            }
            for (int r = 0; r < RX; ++r) {
              const int8_t* xq = xr[r].q + 256 * sb + 64 * c + 4 * k;
              lo[r] = _mm256_add_epi16(lo[r], _mm256_maddubs_epi16(wl, _mm256_set1_epi32(load4(xq))));
              hi[r] = _mm256_add_epi16(hi[r], _mm256_maddubs_epi16(wh, _mm256_set1_epi32(load4(xq + 32))));
            }
          }
          for (int r = 0; r < RX; ++r)
            s[r] = _mm256_add_epi32(s[r], _mm256_add_epi32(_mm256_madd_epi16(lo[r], sl), _mm256_madd_epi16(hi[r], sh)));
        }
      }
      __m256i mins[4];
      for (int k = 0; k < 4; ++k)
        mins[k] = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + P::kMin + 32 * k + 16 * h)));
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + P::kD + 16 * h)));
      const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + P::kDmin + 16 * h)));
      for (int r = 0; r < RX; ++r) {
        __m256i m = _mm256_setzero_si256();
        for (int k = 0; k < 4; ++k)
          m = _mm256_add_epi32(m, _mm256_madd_epi16(mins[k], _mm256_set1_epi32(load4(xr[r].bsums32 + 8 * sb + 2 * k))));
        const __m256 dx = _mm256_set1_ps(xr[r].d[sb]);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[r]), _mm256_mul_ps(d, dx), acc[r]);
        acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(m), _mm256_mul_ps(dmin, dx), acc[r]);
      }
    }
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(valid - 8 * h), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int r = 0; r < RX; ++r) _mm256_maskstore_ps(y + r * ldy + 8 * h, mask, acc[r]);
  }
}

template <int T>
[[gnu::always_inline]] inline __m256i q6_k_codes(const std::byte* blk, int h, int q, int u) {
  const __m256i z = loadu256(blk + 64 * (4 * q + 16 * (T % 2) + u) + 32 * h);
  const __m256i hb = loadu256(blk + PackedQ6_K::kHigh + 64 * (4 * q + u) + 32 * h);
  const __m256i nib = T < 2 ? z : _mm256_srli_epi16(z, 4);
  const __m256i hs = T == 0 ? _mm256_slli_epi16(hb, 4) : T == 1 ? _mm256_slli_epi16(hb, 2) : T == 2 ? hb : _mm256_srli_epi16(hb, 2);
  return _mm256_or_si256(_mm256_and_si256(nib, _mm256_set1_epi8(0x0f)), _mm256_and_si256(hs, _mm256_set1_epi8(0x30)));
}

template <int RX, int T>
[[gnu::always_inline]] inline void q6_k_sub_block(const std::byte* blk, int h, int q, const int8_t* const* xq, __m256i (&s)[RX]) {
  const int j = q + 4 * T;
  // maddubs pairs are at most 2 * 63 * 127: two of them add exactly in 16 bits, then madd by the scale.
  __m256i t[2][RX];
  for (int u = 0; u < 4; ++u) {
    prefetch_line<PackedQ6_K>(blk, 16 * T + 4 * q + u);
    const __m256i w = q6_k_codes<T>(blk, h, q, u);
    for (int r = 0; r < RX; ++r) {
      const __m256i p = _mm256_maddubs_epi16(w, _mm256_set1_epi32(load4(xq[r] + 16 * j + 4 * u)));
      t[u / 2][r] = u % 2 ? _mm256_add_epi16(t[u / 2][r], p) : p;
    }
  }
  // Rows 8h..8h+7's scale pairs as 16-bit lanes, then scale j % 2 of each pair in both halves of its dword.
  const __m256i pair = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + PackedQ6_K::kScale + 32 * (j / 2) + 16 * h)));
  const __m256i pick = _mm256_add_epi8(_mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13),
                                       _mm256_set1_epi8(static_cast<char>(2 * (j % 2))));
  const __m256i sc = _mm256_shuffle_epi8(pair, pick);
  for (int r = 0; r < RX; ++r)
    s[r] = _mm256_add_epi32(s[r], _mm256_add_epi32(_mm256_madd_epi16(t[0][r], sc), _mm256_madd_epi16(t[1][r], sc)));
}

template <int RX>
[[gnu::always_inline]] inline void packed_q6_k_tile(const std::byte* panel, int valid, const std::byte* x, size_t xs,
                                                    int64_t cols, float* y, int64_t ldy) {
  using P = PackedQ6_K;
  XK xr[RX];
  for (int r = 0; r < RX; ++r) xr[r] = xk(x, xs, r, cols);
  for (int h = 0; h < 2 && valid > 8 * h; ++h) {
    __m256 acc[RX];
    for (int r = 0; r < RX; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t sb = 0; sb < cols / 256; ++sb) {
      const std::byte* blk = panel + static_cast<size_t>(sb) * P::kBlock;
        const int8_t* xq[RX];
      __m256i s[RX], off[RX];
      for (int r = 0; r < RX; ++r) {
        xq[r] = xr[r].q + 256 * sb;
        s[r] = off[r] = _mm256_setzero_si256();
      }
#pragma GCC unroll 1
      for (int q = 0; q < 4; ++q) {
        q6_k_sub_block<RX, 0>(blk, h, q, xq, s);
        q6_k_sub_block<RX, 1>(blk, h, q, xq, s);
        q6_k_sub_block<RX, 2>(blk, h, q, xq, s);
        q6_k_sub_block<RX, 3>(blk, h, q, xq, s);
      }
      for (int k = 0; k < 8; ++k) {
        const __m256i pair = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + P::kScale + 32 * k + 16 * h)));
        for (int r = 0; r < RX; ++r)
          off[r] = _mm256_add_epi32(off[r], _mm256_madd_epi16(pair, _mm256_set1_epi32(load4(xr[r].bsums + 16 * sb + 2 * k))));
      }
      const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + P::kD + 16 * h)));
      for (int r = 0; r < RX; ++r) {
        const __m256i t = _mm256_sub_epi32(s[r], _mm256_slli_epi32(off[r], 5));
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(t), _mm256_mul_ps(d, _mm256_set1_ps(xr[r].d[sb])), acc[r]);
      }
    }
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(valid - 8 * h), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int r = 0; r < RX; ++r) _mm256_maskstore_ps(y + r * ldy + 8 * h, mask, acc[r]);
  }
}
#endif

// Weight rows [0, nw) packed at w (panels `panel_bytes` apart) times nx activation rows: a RowsKernel with
// the panels in place of the rows.
template <bool kQ6, bool kQ5 = false>
void packed_k_rows(const std::byte* w, size_t panel_bytes, int64_t nw, const std::byte* x, size_t xs, int64_t nx,
                   int64_t cols, float* y, int64_t ldy) {
  // Activation rows per pass over a panel. At 4 rows and more the tiles are bound by the dpbusd (AVX2:
  // maddubs) rate, so 8 rows per pass gained AVX-512 3-8 %; AVX2's 16 registers hold 4 (20 % over 2).
  // AVX-512 takes 12: a verification of 8 drafts (9 rows) is then one pass, not 8 + a second pass for 1
  // (one thread, 6144 x 1536: Q4_K N = 9 0.574 -> 0.538 ms, Q6_K 0.909 -> 0.780; N = 12 -7 / -16 %; the
  // float sums, touched once per super-block, spill); 16 was slower again from 12 rows on.
  constexpr int TX = kWide ? 12 : 4;
  for (int64_t o = 0; o < nw; o += kPanelRows) {
    const std::byte* panel = w + static_cast<size_t>(o / kPanelRows) * panel_bytes;
    const int valid = static_cast<int>(nw - o < kPanelRows ? nw - o : kPanelRows);
    over_x<TX>(nx, [&]<int RX>(int64_t r) __attribute__((always_inline)) {
      if constexpr (kQ6)
        packed_q6_k_tile<RX>(panel, valid, x + r * xs, xs, cols, y + r * ldy + o, ldy);
      else
        packed_q4_k_tile<kQ5, RX>(panel, valid, x + r * xs, xs, cols, y + r * ldy + o, ldy);
    });
  }
}

template <class P, bool kQ6, bool kQ5 = false>
void add_packed(QuantKernel& k) {
  k.panel_bytes = &packed_k_panel_bytes<P>;
  k.pack = &pack_k_weights<P>;
  k.packed = &packed_k_rows<kQ6, kQ5>;
}

}  // namespace

void add_kquant_kernels(KernelSet& set) {
  // One weight row unpacks to 8-16 registers: 1 x 4 (AVX2: 1 x 2) tiles.
  constexpr int KX = kWide ? 4 : 2;
  set.q4_k = {&quantize_xk, &xk_bytes, &rows<K4Tiles<false>::Tile, 1, KX>, &rows_kpanel<K4Pack<false>, false, 144>};
  set.q5_k = {&quantize_xk, &xk_bytes, &rows<K4Tiles<true>::Tile, 1, KX>, &rows_kpanel<K4Pack<true>, false, 176>};
  set.q6_k = {&quantize_xk, &xk_bytes, &rows<Q6_KTile, 1, KX>, &rows_kpanel<Q6_KPack, true, 210>};
  add_packed<PackedQ4_K, false>(set.q4_k);
  add_packed<PackedQ5_K, false, true>(set.q5_k);
  add_packed<PackedQ6_K, true>(set.q6_k);
}

}  // namespace specula::cpu::SPECULA_ISA_NS
