// Shared by the matrix kernel files (qkernels*.cpp), each compiled once per instruction set (isa.hpp):
// SPECULA_ISA_NS names the namespace, the compiler flags decide which branches exist. Everything below is
// in an anonymous namespace, so each file and set keeps its own copy (see qkernels.cpp on why that matters).
#pragma once

#include <immintrin.h>

#include <cstring>

#include "isa.hpp"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define SPECULA_WIDE 1
#else
#define SPECULA_WIDE 0
#endif

namespace specula::cpu::SPECULA_ISA_NS {

// Each file fills in its family's kernels; qkernels.cpp assembles the set.
void add_x32_kernels(KernelSet& set);    // qkernels_x32.cpp: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS,
                                          // MLX affine 4 bits' packed panels
void add_kquant_kernels(KernelSet& set);  // qkernels_kquant.cpp: Q4_K, Q5_K, Q6_K
void add_float_kernels(KernelSet& set);   // qkernels_float.cpp: F32, F16, BF16, MLX affine 4 / 8 bits
void add_map_kernels(KernelSet& set);     // qkernels_map.cpp: GELU, softcap, exp
void add_attention_kernels(KernelSet& set);  // qkernels_attention.cpp

namespace {

constexpr size_t align64(size_t b) { return (b + 63) / 64 * 64; }
// Weight bytes fetched ahead of use: decode streams each row once from memory, and the hardware
// prefetcher stops at every 4 KB page of the mapped file.
constexpr int kPrefetch = 2048;
// The lines of [p, p + bytes) kPrefetch bytes ahead. Always inlined: GCC 12's mod-ref analysis finds that
// a call to it writes no memory and deletes the call wherever the inliner leaves one (the large tiles of
// qkernels_x32.cpp had no prefetch at all until 2026-12-06; -fno-ipa-modref brings them back).
[[gnu::always_inline]] inline void prefetch_ahead(const std::byte* p, size_t bytes, ptrdiff_t ahead = kPrefetch) {
  for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p) + ahead + o, _MM_HINT_T0);
}

inline float hsum8(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

inline float hmax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// exp of 8 floats with std::exp's bits (glibc's expf, from Arm's optimized routines: x / ln 2 = k / 32 + r,
// 2^(k / 32) from a table of 32, a cubic in r, in double, rounded once to float), so a softmax done 8 at a
// time gives what the scalar std::exp gave (CpuKernels.ExpHasStdExpsBits checks it across the float range).
inline constexpr uint64_t kExp2Table[32] = {  // bits of 2^(i / 32), rounded to double, less i << 47
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540};

[[gnu::always_inline]] inline __m256 exp8(__m256 x) {
  constexpr double kInvLn2N = 0x1.71547652b82fep+0 * 32, kShift = 0x1.8p+52;
  constexpr double kC0 = 0x1.c6af84b912394p-5 / 32 / 32 / 32, kC1 = 0x1.ebfce50fac4f3p-3 / 32 / 32,
                   kC2 = 0x1.62e42ff0c52d6p-1 / 32;
  const auto* table = reinterpret_cast<const long long*>(kExp2Table);
#if SPECULA_WIDE
  const __m512d xd = _mm512_cvtps_pd(x), z = _mm512_mul_pd(_mm512_set1_pd(kInvLn2N), xd);
  const __m512d shifted = _mm512_add_pd(z, _mm512_set1_pd(kShift));  // k in the low bits
  const __m512i k = _mm512_castpd_si512(shifted);
  const __m512d r = _mm512_sub_pd(z, _mm512_sub_pd(shifted, _mm512_set1_pd(kShift)));
  const __m512i t = _mm512_add_epi64(_mm512_i64gather_epi64(_mm512_and_si512(k, _mm512_set1_epi64(31)), table, 8),
                                     _mm512_slli_epi64(k, 47));
  const __m512d p = _mm512_fmadd_pd(_mm512_fmadd_pd(_mm512_set1_pd(kC0), r, _mm512_set1_pd(kC1)), _mm512_mul_pd(r, r),
                                    _mm512_fmadd_pd(_mm512_set1_pd(kC2), r, _mm512_set1_pd(1.0)));
  __m256 y = _mm512_cvtpd_ps(_mm512_mul_pd(p, _mm512_castsi512_pd(t)));
#else
  __m128 half[2];
  for (int h = 0; h < 2; ++h) {
    const __m256d xd = _mm256_cvtps_pd(h ? _mm256_extractf128_ps(x, 1) : _mm256_castps256_ps128(x));
    const __m256d z = _mm256_mul_pd(_mm256_set1_pd(kInvLn2N), xd);
    const __m256d shifted = _mm256_add_pd(z, _mm256_set1_pd(kShift));
    const __m256i k = _mm256_castpd_si256(shifted);
    const __m256d r = _mm256_sub_pd(z, _mm256_sub_pd(shifted, _mm256_set1_pd(kShift)));
    const __m256i t = _mm256_add_epi64(
        _mm256_i64gather_epi64(table, _mm256_and_si256(k, _mm256_set1_epi64x(31)), 8), _mm256_slli_epi64(k, 47));
    const __m256d p = _mm256_fmadd_pd(_mm256_fmadd_pd(_mm256_set1_pd(kC0), r, _mm256_set1_pd(kC1)), _mm256_mul_pd(r, r),
                                      _mm256_fmadd_pd(_mm256_set1_pd(kC2), r, _mm256_set1_pd(1.0)));
    half[h] = _mm256_cvtpd_ps(_mm256_mul_pd(p, _mm256_castsi256_pd(t)));
  }
  __m256 y = _mm256_set_m128(half[1], half[0]);
#endif
  // Where the table's k would leave its range: 0 below ln(2^-150), infinity above ln(2^128), NaN stays NaN.
  y = _mm256_blendv_ps(y, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(-0x1.9fe368p6f), _CMP_LT_OQ));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()), _mm256_cmp_ps(x, _mm256_set1_ps(0x1.62e42ep6f), _CMP_GT_OQ));
  return _mm256_blendv_ps(y, _mm256_add_ps(x, x), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

// f over x[0, n) into out (out may be x), 8 floats at a time; a partial last vector goes through a padded
// register, so every value gets the vector path's bits.
template <class F>
[[gnu::always_inline]] inline void map8(const float* x, int64_t n, float* out, F f) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, f(_mm256_loadu_ps(x + i)));
  if (i < n) {
    alignas(32) float buf[8] = {};
    std::memcpy(buf, x + i, static_cast<size_t>(n - i) * 4);
    _mm256_store_ps(buf, f(_mm256_load_ps(buf)));
    std::memcpy(out + i, buf, static_cast<size_t>(n - i) * 4);
  }
}

// 32 int32 (i[0] the first 8) to 32 int8 in the same order, saturating: the packs interleave the 128-bit
// lanes, the permutation restores the order.
inline __m256i pack_i8(const __m256i (&i)[4]) {
  const __m256i q = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
  return _mm256_permutevar8x32_epi32(q, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

inline float f16(const std::byte* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline __m256i loadu256(const void* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }

template <typename T>
inline const T* at(const std::byte* p, size_t offset) {
  return reinterpret_cast<const T*>(p + offset);
}

// F32, F16 or BF16 values (float weights, a KV cache) as F32: one, 8 or 16 from element i on, converted in
// registers.
enum class Float { f32, f16, bf16 };

template <Float T>
inline float scalar_weight(const std::byte* row, int64_t i) {
  if constexpr (T == Float::f32) {
    return at<float>(row, 0)[i];
  } else {
    const uint16_t h = at<uint16_t>(row, 0)[i];
    if constexpr (T == Float::f16) return _cvtsh_ss(h);
    uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
}

template <Float T>
inline __m256 load8(const std::byte* row, int64_t i) {
  if constexpr (T == Float::f32) return _mm256_loadu_ps(at<float>(row, 0) + i);
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(at<uint16_t>(row, 0) + i));
  if constexpr (T == Float::f16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

#if SPECULA_WIDE
template <Float T>
inline __m512 load16(const std::byte* row, int64_t i) {
  if constexpr (T == Float::f32) return _mm512_loadu_ps(at<float>(row, 0) + i);
  const __m256i h = loadu256(at<uint16_t>(row, 0) + i);
  if constexpr (T == Float::f16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif

#if SPECULA_WIDE
inline __m256 fold(__m512 v) { return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)); }
inline __m256i fold(__m512i v) { return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)); }
inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }
inline __m512 join(__m256 lo, __m256 hi) { return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1); }
constexpr bool kWide = true;
#else
constexpr bool kWide = false;
#endif

// Sum over groups of 4 bytes of u8 * i8 products (u <= 128 keeps maddubs from saturating for |s| <= 127).
inline __m256i dot4_avx2(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// The f16 values at p, p + s, p + 2s, p + 3s.
// Assembled in a register: four 2-byte stores read back as one 8-byte load would stall store forwarding
// (a third of a small matrix's time).
inline __m128 f16x4(const std::byte* p, size_t s) {
  auto h = [&](int k) {
    uint16_t v;
    std::memcpy(&v, p + k * s, 2);
    return static_cast<int>(v);
  };
  __m128i v = _mm_cvtsi32_si128(h(0));
  v = _mm_insert_epi16(v, h(1), 1);
  v = _mm_insert_epi16(v, h(2), 2);
  v = _mm_insert_epi16(v, h(3), 3);
  return _mm_cvtph_ps(v);
}

#if SPECULA_WIDE
// The f16 values at p, p + B, p + 2B, p + 3B, each spread over four lanes (lane L: value L / 4): one or
// two loads and one word permute, where f16x4 and a float permute took four loads, three inserts and
// two shuffles on the shuffle port of every few-row tile. Reads p .. p + 3B + 1 only (past the first
// 64 bytes a masked load, which cannot fault on the bytes it leaves out).
template <size_t B>
inline __m512 f16x4_spread(const std::byte* p) {
  static_assert(B % 2 == 0 && 3 * B + 2 <= 128, "the four values are 2-byte aligned within 128 bytes");
  constexpr int w = static_cast<int>(B / 2);  // words between two values
  const __m512i idx = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 3 * w << 16 | 3 * w, 3 * w << 16 | 3 * w,
                                       2 * w << 16 | 2 * w, 2 * w << 16 | 2 * w, w << 16 | w, w << 16 | w, 0, 0);
  const __m512i lo = _mm512_loadu_si512(p);
  __m512i words;
  if constexpr (3 * B + 2 <= 64) {
    words = _mm512_permutexvar_epi16(idx, lo);
  } else {
    constexpr int kHigh = static_cast<int>(3 * B + 2 - 64) / 2;  // words needed past the first 64 bytes
    words = _mm512_permutex2var_epi16(lo, idx, _mm512_maskz_loadu_epi16((__mmask32{1} << kHigh) - 1, p + 64));
  }
  return _mm512_cvtph_ps(_mm512_castsi512_si256(words));
}
#endif

// ---- weight panels: rows transposed into the VNNI layout [4-value group][rows][4 codes] ------------------
#if SPECULA_WIDE
// 16 rows of 8 dwords (`stride` bytes apart) to 8 registers of 16: out[g] = dword g of rows 0..15. An
// 8 x 8 transpose in each 256-bit half, rows 0-7 in the low halves and 8-15 in the high ones.
inline void transpose16x8(const void* rows, size_t stride, __m512i* out) {
  const auto* p = static_cast<const std::byte*>(rows);
  __m512i a[8], t[8], u[8];
  for (int i = 0; i < 8; ++i) a[i] = join(loadu256(p + i * stride), loadu256(p + (i + 8) * stride));
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm512_unpacklo_epi32(a[2 * i], a[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(a[2 * i], a[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 0-3 (h = 0) and 4-7
    const __m512i* th = t + 4 * h;
    u[4 * h + 0] = _mm512_unpacklo_epi64(th[0], th[2]);
    u[4 * h + 1] = _mm512_unpackhi_epi64(th[0], th[2]);
    u[4 * h + 2] = _mm512_unpacklo_epi64(th[1], th[3]);
    u[4 * h + 3] = _mm512_unpackhi_epi64(th[1], th[3]);
  }
  const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
  for (int g = 0; g < 4; ++g) {
    out[g] = _mm512_permutex2var_epi64(u[g], lo, u[4 + g]);
    out[g + 4] = _mm512_permutex2var_epi64(u[g], hi, u[4 + g]);
  }
}
#else
// 8 rows of 8 dwords to out[g] = dword g of rows 0..7.
inline void transpose8x8(const void* rows, size_t stride, __m256i* out) {
  const auto* p = static_cast<const std::byte*>(rows);
  __m256i a[8], t[8], u[8];
  for (int i = 0; i < 8; ++i) a[i] = loadu256(p + i * stride);
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(a[2 * i], a[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(a[2 * i], a[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {
    const __m256i* th = t + 4 * h;
    u[4 * h + 0] = _mm256_unpacklo_epi64(th[0], th[2]);
    u[4 * h + 1] = _mm256_unpackhi_epi64(th[0], th[2]);
    u[4 * h + 2] = _mm256_unpacklo_epi64(th[1], th[3]);
    u[4 * h + 3] = _mm256_unpackhi_epi64(th[1], th[3]);
  }
  for (int g = 0; g < 4; ++g) {
    out[g] = _mm256_permute2x128_si256(u[g], u[4 + g], 0x20);
    out[g + 4] = _mm256_permute2x128_si256(u[g], u[4 + g], 0x31);
  }
}
#endif

// ---- activation-row tiles ---------------------------------------------------------------------------------
// over_x splits nx activation rows into the fewest tiles of at most TX rows, as even as can be, and calls
// tile.template operator()<RX>(first row) for each. Even, not TX rows and a remainder: a tile unpacks its
// weights once for all its rows, so a verification of 8 drafts (9 rows) at TX = 8 ran as 8 + 1 and paid a
// whole unpacking pass for the ninth row (packed Q4_0, one thread, 6144 x 1536: 9 rows 1.8x 8 rows).
template <int N, class F>
void tile_of(int64_t rows, int64_t r, F& tile) {
  if constexpr (N > 0) {
    if (rows == N) return tile.template operator()<N>(r);
    tile_of<N - 1>(rows, r, tile);
  }
}
template <int TX, class F>
void over_x(int64_t nx, F&& tile) {
  const int64_t tiles = (nx + TX - 1) / TX;
  for (int64_t t = 0, r = 0; t < tiles; ++t) {
    const int64_t rows = (nx - r) / (tiles - t);  // the larger tiles last
    tile_of<TX>(rows, r, tile);
    r += rows;
  }
}

// ---- tiles: a few weight rows x a few activation rows over blocks [b0, b1) -----------------------------
// Blocks [b0, b1) of a column pass. The accumulators of each (weight row i, activation row r) pair, 16
// floats, are carried between passes; weight bytes are prefetched `ahead` bytes on (the next row's
// chunk when rows are read in chunks). Passes start at a group (b0 % 4 == 0).
struct Chunk {
  int64_t b0, b1;
  float* carry = nullptr;  // [RW][ldc]
  int64_t ldc = 0;         // floats between weight rows
  ptrdiff_t ahead = kPrefetch;
  float* at(int i, int r) const { return carry + i * ldc + 16 * r; }
};

// ---- tiling over weight rows and activation rows --------------------------------------------------------
// TW x TX is the largest tile: TW weight rows share each activation load, TX activation rows each weight
// unpack; TW * TX accumulators and the unpacked weights must fit in registers.
// Activation records kept in L1 while weight rows stream past them (of its 48 KB), and the weight rows
// whose accumulators one column pass carries.
constexpr size_t kL1Records = 24 << 10;
constexpr int64_t kCarryRows = 32;
// Weight rows up to this size decode TW at a time (see rows()).
constexpr size_t kShortRowBytes = 1024;

template <template <int, int> class Tile, int TW, int TX>
void rows(const std::byte* w, size_t wrb, int64_t nw, const std::byte* x, size_t xs, int64_t nx, int64_t cols, float* y,
          int64_t ldy) {
  // One activation row (decode): one weight row at a time. Four interleaved rows were faster on heap
  // memory but 30 % slower on a mapped model file (four streams of 4 KB pages).
  // Short rows (up to kShortRowBytes: a small model's 128-960 Q8_0 columns) are the exception: TW of
  // them are one contiguous stream within a page or two, and they share the activation loads and the loop.
  if (nx == 1) {
    int64_t o = 0;
    if (wrb <= kShortRowBytes)
      for (; o + TW <= nw; o += TW) Tile<TW, 1>::run(w + o * wrb, wrb, x, xs, cols, y + o, ldy);
    for (; o < nw; ++o) Tile<1, 1>::run(w + o * wrb, wrb, x, xs, cols, y + o, ldy);
    return;
  }
  // The tiles are inlined all the way (GCC otherwise called a lambda per tile of weight rows).
  const auto pass = [&]<int RW>(int64_t o) __attribute__((always_inline)) {
    over_x<TX>(nx, [&]<int RX>(int64_t r) __attribute__((always_inline)) { Tile<RW, RX>::run(w + o * wrb, wrb, x + r * xs, xs, cols, y + r * ldy + o, ldy); });
  };
  // Several activation rows over long weight rows (ffn_down: 6144-12288 columns): their records outgrow
  // L1 and every weight block would fetch them from L2 again, so the columns go in chunks that fit.
  if constexpr (requires { Tile<1, 1>::kBlock; }) {
    constexpr int64_t kBlock = Tile<1, 1>::kBlock;
    const int64_t nb = cols / kBlock, block_bytes = static_cast<int64_t>(xs) / nb;
    constexpr int64_t kGroup = Tile<1, 1>::kGroup;
    const int64_t fit = static_cast<int64_t>(kL1Records) / (nx * block_bytes) / kGroup * kGroup;
    const int64_t chunk = fit > kGroup ? fit : kGroup;
    if (nb > chunk && nx < kPrefillRows) {
      alignas(64) float carry[kCarryRows * (kPrefillRows - 1) * 16];
      for (int64_t g = 0; g < nw; g += kCarryRows) {
        const int64_t ng = nw - g < kCarryRows ? nw - g : kCarryRows;
        for (int64_t b0 = 0; b0 < nb; b0 += chunk) {
          const int64_t b1 = nb - b0 < chunk ? nb : b0 + chunk;
          const auto tile = [&]<int RW>(int64_t o) __attribute__((always_inline)) {
            over_x<TX>(nx, [&]<int RX>(int64_t r) __attribute__((always_inline)) {
              Tile<RW, RX>::run(w + o * wrb, wrb, x + r * xs, xs, cols, y + r * ldy + o, ldy,
                                Chunk{b0, b1, carry + (o - g) * nx * 16 + r * 16, nx * 16,
                                      static_cast<ptrdiff_t>(RW * wrb)});
            });
          };
          int64_t o = g;
          for (; o + TW <= g + ng; o += TW) tile.template operator()<TW>(o);
          for (; o < g + ng; ++o) tile.template operator()<1>(o);
        }
      }
      return;
    }
  }
  int64_t o = 0;
  for (; o + TW <= nw; o += TW) pass.template operator()<TW>(o);
  for (; o < nw; ++o) pass.template operator()<1>(o);
}

}  // namespace
}  // namespace specula::cpu::SPECULA_ISA_NS
