// Matrix kernels of the CPU backend for few-to-many activation rows, compiled once per instruction set
// (isa.hpp): SPECULA_ISA_NS names the namespace, the compiler flags decide which branches exist.
//
// Quantized weights are read in place. Activations are quantized once per product to 8 bits per 32
// values (Q8_0 / Q4_0 / ...) or per 256 (K-quants), the llama.cpp scheme, and each weight block is
// unpacked once per tile of activation rows (MLX affine keeps float activations, as MLX does). Where
// AVX-512 works on 16 lanes, AVX2 works on two halves of 8 with the same lanes, so the sums, their order
// and the final reduction are the same on both sets, and so are the bits.
//
// Nothing here may instantiate a template that other translation units use too (std containers,
// std::function): the linker would keep one copy, possibly the one with AVX-512 instructions.
#include <immintrin.h>

#include <cstring>

#include "isa.hpp"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
#define SPECULA_WIDE 1
#else
#define SPECULA_WIDE 0
#endif

namespace specula::cpu::SPECULA_ISA_NS {
namespace {

constexpr size_t align64(size_t b) { return (b + 63) / 64 * 64; }
// Weight bytes fetched ahead of use: decode streams each row once from memory, and the hardware
// prefetcher stops at every 4 KB page of the mapped file.
constexpr int kPrefetch = 2048;
// The lines of [p, p + bytes) kPrefetch bytes ahead.
inline void prefetch_ahead(const std::byte* p, size_t bytes, ptrdiff_t ahead = kPrefetch) {
  for (size_t o = 0; o < bytes; o += 64) _mm_prefetch(reinterpret_cast<const char*>(p) + ahead + o, _MM_HINT_T0);
}

inline float hsum8(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
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

#if SPECULA_WIDE
inline __m256 fold(__m512 v) { return _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1)); }
inline __m256i fold(__m512i v) { return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)); }
inline __m512i join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }
inline __m512 join(__m256 lo, __m256 hi) { return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1); }
constexpr bool kWide = true;
#else
constexpr bool kWide = false;
#endif

// ---- 32-value blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, IQ4_XS) ------------------------------------
// Blocks go in groups of four (a partial last group is padded with zeros). Lane L = 4j + k of a group
// (block j, k = 0..3) stands for values 4k..4k+3 and 16+4k..16+4k+3 of block j: one dpbusd over the
// group's first halves and one over its second halves leave 16 integer dots, four per block, so that
// converting, scaling and accumulating them costs one instruction per four blocks (AVX2: two of 8
// lanes, lanes 0-7 and 8-15). The integer dots are exact, the float steps lane for lane the same on both
// sets, and the final reduction too, so both give the same bits.
//
// Activation record (per row):
//   q: int8[ng][128]: values 0-15 of the group's blocks 0..3 (16 bytes each), then their values 16-31
//   init: int32[ng][16]: -kOffset * (the sum of lane L's eight codes): the dot start that removes the
//         weight codes' storage offset (they are kept unsigned)
//   scale: float[ng][16]: the scale of lane L's block
//   sums: float[ng][16], affine types only (Q4_1, Q5_1: w = d q + m): scale * the sum of lane L's eight
//         codes, which the weight's m multiplies
//   block_init: int32[nb]: the sum of block b's four inits (for the prefill panels)
struct X32Layout {
  int64_t nb, ng;
  bool affine;
  X32Layout(int64_t cols, bool affine) : nb(cols / 32), ng((cols / 32 + 3) / 4), affine(affine) {}
  size_t init() const { return static_cast<size_t>(128 * ng); }
  size_t scale() const { return static_cast<size_t>(192 * ng); }
  size_t sums() const { return static_cast<size_t>(256 * ng); }
  size_t block_init() const { return static_cast<size_t>((affine ? 320 : 256) * ng); }
  size_t bytes() const { return align64(block_init() + static_cast<size_t>(4 * nb)); }
  // Where values 4g..4g+3 of block b start in q, and block b's first scale lane.
  static int64_t q(int64_t b, int g) { return 128 * (b / 4) + 16 * (b % 4) + 4 * (g & 3) + 64 * (g >> 2); }
  static int64_t d(int64_t b) { return 16 * (b / 4) + 4 * (b % 4); }
};
template <bool kAffine>
size_t x32_bytes(int64_t cols) {
  return X32Layout(cols, kAffine).bytes();
}

template <int kOffset, bool kAffine>
void quantize_x32(const float* x, int64_t cols, std::byte* rec) {
  const X32Layout lay(cols, kAffine);
  auto* q = reinterpret_cast<int8_t*>(rec);
  auto* init = reinterpret_cast<int32_t*>(rec + lay.init());
  auto* scale = reinterpret_cast<float*>(rec + lay.scale());
  auto* sums = reinterpret_cast<float*>(rec + lay.sums());
  auto* block_init = reinterpret_cast<int32_t*>(rec + lay.block_init());
  if (lay.nb % 4) {  // the padding of a partial last group contributes nothing
    std::memset(q + 128 * (lay.ng - 1), 0, 128);
    std::memset(init + 16 * (lay.ng - 1), 0, 64);
    std::memset(scale + 16 * (lay.ng - 1), 0, 64);
    if (kAffine) std::memset(sums + 16 * (lay.ng - 1), 0, 64);
  }
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < lay.nb; ++b) {
    const float* xb = x + 32 * b;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
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
    const __m256i p01 = _mm256_packs_epi32(i[0], i[1]), p23 = _mm256_packs_epi32(i[2], i[3]);
    __m256i qv = _mm256_packs_epi16(p01, p23);
    qv = _mm256_permutevar8x32_epi32(qv, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    int8_t* qb = q + X32Layout::q(b, 0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qb), _mm256_castsi256_si128(qv));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qb + 64), _mm256_extracti128_si256(qv, 1));
    // Sums of values 4k..4k+3 (k = 0..7); lane k takes sums k and k + 4.
    const __m256i s8 = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), qv), _mm256_set1_epi16(1));
    const __m128i lane_sum = _mm_add_epi32(_mm256_castsi256_si128(s8), _mm256_extracti128_si256(s8, 1));
    const __m128i lane = _mm_mullo_epi32(lane_sum, _mm_set1_epi32(-kOffset));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(init + X32Layout::d(b)), lane);
    _mm_storeu_ps(scale + X32Layout::d(b), _mm_set1_ps(d));
    if (kAffine) _mm_storeu_ps(sums + X32Layout::d(b), _mm_mul_ps(_mm_cvtepi32_ps(lane_sum), _mm_set1_ps(d)));
    __m128i h = _mm_add_epi32(lane, _mm_shuffle_epi32(lane, 0x4e));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, 0xb1));
    block_init[b] = _mm_cvtsi128_si32(h);
  }
}

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

// Blocks of 32 values, B bytes each, the f16 scale first (Q8_0, Q4_0, Q5_0, IQ4_NL). at(row, b) is what
// codes() reads; scale(row, b) the block's scale, scales4 those of blocks b..b+3 (AVX-512 tiles:
// scales16, already spread over the group's lanes).
template <size_t B>
struct Blocks32 {
  static constexpr size_t kBytes = B;
  static constexpr bool kAffine = false;
  static const std::byte* at(const std::byte* row, int64_t b) { return row + B * b; }
  static float scale(const std::byte* row, int64_t b) { return f16(at(row, b)); }
  static __m128 scales4(const std::byte* row, int64_t b) { return f16x4(at(row, b), B); }
#if SPECULA_WIDE
  static __m512 scales16(const std::byte* row, int64_t b) { return f16x4_spread<B>(at(row, b)); }
#endif
};

// Affine blocks (Q4_1, Q5_1): f16 scale d, f16 m, then the codes; w = d q + m with codes q >= 0, so m
// meets the activation's sums (X32Layout::sums).
template <size_t B>
struct AffineBlocks32 : Blocks32<B> {
  static constexpr bool kAffine = true;
  static float bias(const std::byte* row, int64_t b) { return f16(row + B * b + 2); }
  static __m128 biases4(const std::byte* row, int64_t b) { return f16x4(row + B * b + 2, B); }
#if SPECULA_WIDE
  static __m512 biases16(const std::byte* row, int64_t b) { return f16x4_spread<B>(row + B * b + 2); }
#endif
};

// Each weight type says how its blocks unpack: codes(wb) gives a block's 32 codes in value order, kept
// kOffset above their value (unsigned: what AVX-512's dpbusd takes); panel_codes(wb) what the AVX2
// kernels take: the signed values for kSigned types (dotted as |w| against sign(x, w)), else the codes.

// Q8_0: f16 scale, 32 int8 codes. AVX-512 stores them + 128 (unsigned); AVX2 dots |w| with sign(x, w).
struct Q8_0Unpack : Blocks32<34> {
  static constexpr int kOffset = SPECULA_WIDE ? 128 : 0;
  static constexpr bool kSigned = !SPECULA_WIDE;
  static __m256i codes(const std::byte* wb) { return _mm256_xor_si256(loadu256(wb + 2), _mm256_set1_epi8(-128)); }
  static __m256i panel_codes(const std::byte* wb) { return kSigned ? loadu256(wb + 2) : codes(wb); }
};

// 16 bytes of nibbles at p, p + s, p + 2s, p + 3s in one register.
#if SPECULA_WIDE
inline __m512i load4x16(const std::byte* p, size_t s) {
  __m512i z = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + s)), 1);
  z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * s)), 2);
  return _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 3 * s)), 3);
}
#endif

// 16 bytes of nibbles kSkip bytes into each block: values 0..15 in the low nibbles, 16..31 in the high ones.
template <class Base, int kSkip>
struct Nibbles : Base {
  static constexpr bool kSigned = false;
  static __m256i codes(const std::byte* wb) {
    const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + kSkip));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(p, 4), p), _mm256_set1_epi8(0x0f));
  }
  static __m256i panel_codes(const std::byte* wb) { return codes(wb); }
#if SPECULA_WIDE
  // A group's first halves are the low nibbles, its second halves the high ones.
  static void codes4(const std::byte* row, int64_t b, __m512i& lo, __m512i& hi) {
    const __m512i z = load4x16(Base::at(row, b) + kSkip, Base::kBytes);
    lo = _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
    hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), _mm512_set1_epi8(0x0f));
  }
#endif
};

// Q4_0: f16 scale, 16 bytes of nibbles, stored + 8.
struct Q4_0Unpack : Nibbles<Blocks32<18>, 2> {
  static constexpr int kOffset = 8;
};

// Q4_1: f16 d, f16 m, 16 bytes of nibbles (0..15).
struct Q4_1Unpack : Nibbles<AffineBlocks32<20>, 4> {
  static constexpr int kOffset = 0;
};

// Five-bit codes kSkip bytes into each block: 32 bits of fifth bits, then 16 bytes of nibbles as Q4_0.
template <class Base, int kSkip>
struct FiveBits : Base {
  static constexpr bool kSigned = false;
  static __m256i codes(const std::byte* block) {
    const std::byte* wb = block + kSkip;
    const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + 4));
    const __m256i low = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(p, 4), p), _mm256_set1_epi8(0x0f));
    // Byte k takes bit k of qh: spread qh's byte k / 8 over bytes k, test bit k % 8.
    uint32_t qh;
    std::memcpy(&qh, wb, 4);
    const __m256i spread =
        _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)),
                            _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
    const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
    const __m256i high =
        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(low, high);
  }
  static __m256i panel_codes(const std::byte* wb) { return codes(wb); }
};

// Q5_0: f16 scale, then the five-bit codes, stored + 16.
struct Q5_0Unpack : FiveBits<Blocks32<22>, 2> {
  static constexpr int kOffset = 16;
};

// Q5_1: f16 d, f16 m, then the five-bit codes (0..31).
struct Q5_1Unpack : FiveBits<AffineBlocks32<24>, 4> {
  static constexpr int kOffset = 0;
};

// IQ4 codes: 16 bytes of nibbles (values 0..15 low, 16..31 high) at kSkip bytes past what codes() is
// given, indexing a fixed table of 16 int8 values (llama.cpp's kvalues_iq4nl). AVX-512 uses the values
// + 128 (unsigned); AVX2 dots |w| with sign(x, w).
template <int kSkip>
struct IQ4Codes {
  static constexpr int kOffset = SPECULA_WIDE ? 128 : 0;
  static constexpr bool kSigned = !SPECULA_WIDE;
  static __m128i table() { return _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113); }
  static __m256i values(const std::byte* wb) {
    const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wb + kSkip));
    const __m256i nib = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(p, 4), p), _mm256_set1_epi8(0x0f));
    return _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(table()), nib);
  }
  static __m256i codes(const std::byte* wb) { return _mm256_xor_si256(values(wb), _mm256_set1_epi8(-128)); }
  static __m256i panel_codes(const std::byte* wb) { return kSigned ? values(wb) : codes(wb); }
};

// IQ4_NL: f16 scale, then the nibbles.
struct IQ4_NLUnpack : Blocks32<18>, IQ4Codes<2> {};


// IQ4_XS: 256-value super-blocks of 136 bytes: f16 d, 16 bits of scale high parts, 4 bytes of scale low
// nibbles, then 8 x 16 bytes of IQ4_NL nibbles; block ib of 32 has scale d * (ls - 32) with ls = low
// nibble ib | high bits ib << 4 (6 bits). Handled as 32-value blocks with computed scales.
struct IQ4_XSUnpack : IQ4Codes<0> {
  static constexpr size_t kBytes = 17;  // 136 / 8, for the prefetch distance
  static constexpr bool kAffine = false;
  static const std::byte* at(const std::byte* row, int64_t b) { return row + 136 * (b / 8) + 8 + 16 * (b % 8); }
  static float scale(const std::byte* row, int64_t b) {
    const std::byte* sb = row + 136 * (b / 8);
    const int ib = static_cast<int>(b % 8);
    uint16_t high;
    std::memcpy(&high, sb + 2, 2);
    const int ls = ((static_cast<int>(sb[4 + ib / 2]) >> (4 * (ib % 2))) & 0xf) | (((high >> (2 * ib)) & 3) << 4);
    return f16(sb) * static_cast<float>(ls - 32);
  }
  static __m128 scales4(const std::byte* row, int64_t b) {
    return _mm_setr_ps(scale(row, b), scale(row, b + 1), scale(row, b + 2), scale(row, b + 3));
  }
};

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

// The weight codes of blocks b..b+n-1 (n < 4 only for a row's last group) as the group layout wants them
// (lo: first halves, hi: second halves; AVX2: pair h = blocks 2h, 2h+1), their scales (dw) and, for affine
// types, their m (bw) per lane, zero for absent blocks. Absent blocks meet zero activations, so they add
// exact zeros.
#if SPECULA_WIDE
inline __m512 spread4(__m128 s) {
  return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3), _mm512_castps128_ps512(s));
}

// A row's last group when it is partial (n < 4): out of line, so that the inlined full-group path stays
// small. GCC left the whole of group_codes out of line in the one-row decode loop otherwise: a call, a
// vzeroupper and the accumulator spilled on every group of every weight row.
template <class Unpack>
[[gnu::noinline]] void partial_group_codes(const std::byte* row, int64_t b, int n, __m512i& lo, __m512i& hi, __m512& dw,
                                           __m512& bw) {
  alignas(64) uint8_t c[2][64] = {};
  alignas(16) float s[4] = {}, m[4] = {};
  for (int j = 0; j < n; ++j) {
    const __m256i v = Unpack::codes(Unpack::at(row, b + j));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(c[0] + 16 * j), _mm256_castsi256_si128(v));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(c[1] + 16 * j), _mm256_extracti128_si256(v, 1));
    s[j] = Unpack::scale(row, b + j);
    if constexpr (Unpack::kAffine) m[j] = Unpack::bias(row, b + j);
  }
  lo = _mm512_load_si512(c[0]);
  hi = _mm512_load_si512(c[1]);
  dw = spread4(_mm_load_ps(s));
  bw = spread4(_mm_load_ps(m));
}

template <class Unpack>
[[gnu::always_inline]] inline void group_codes(const std::byte* row, int64_t b, int n, __m512i& lo, __m512i& hi,
                                               __m512& dw, __m512& bw) {
  if (n == 4) [[likely]] {
    if constexpr (requires { Unpack::scales16(row, b); }) {
      dw = Unpack::scales16(row, b);
      if constexpr (Unpack::kAffine) bw = Unpack::biases16(row, b);
    } else {
      dw = spread4(Unpack::scales4(row, b));
      if constexpr (Unpack::kAffine) bw = spread4(Unpack::biases4(row, b));
    }
    if constexpr (requires { Unpack::codes4(row, b, lo, hi); }) {
      Unpack::codes4(row, b, lo, hi);
    } else {
      const __m512i a = join(Unpack::codes(Unpack::at(row, b)), Unpack::codes(Unpack::at(row, b + 1)));
      const __m512i c = join(Unpack::codes(Unpack::at(row, b + 2)), Unpack::codes(Unpack::at(row, b + 3)));
      lo = _mm512_shuffle_i64x2(a, c, _MM_SHUFFLE(2, 0, 2, 0));
      hi = _mm512_shuffle_i64x2(a, c, _MM_SHUFFLE(3, 1, 3, 1));
    }
    return;
  }
  partial_group_codes<Unpack>(row, b, n, lo, hi, dw, bw);
}
#else
template <class Unpack>
inline void group_codes(const std::byte* row, int64_t b, int n, __m256i (&lo)[2], __m256i (&hi)[2], __m256 (&dw)[2],
                        __m256 (&bw)[2]) {
  __m256i v[4];
  for (int j = 0; j < 4; ++j) v[j] = j < n ? Unpack::panel_codes(Unpack::at(row, b + j)) : _mm256_setzero_si256();
  alignas(16) float s[4] = {}, m[4] = {};
  if (n == 4) {
    _mm_store_ps(s, Unpack::scales4(row, b));
    if constexpr (Unpack::kAffine) _mm_store_ps(m, Unpack::biases4(row, b));
  } else {
    for (int j = 0; j < n; ++j) {
      s[j] = Unpack::scale(row, b + j);
      if constexpr (Unpack::kAffine) m[j] = Unpack::bias(row, b + j);
    }
  }
  const __m256 s4 = _mm256_castps128_ps256(_mm_load_ps(s)), m4 = _mm256_castps128_ps256(_mm_load_ps(m));
  for (int h = 0; h < 2; ++h) {
    lo[h] = _mm256_permute2x128_si256(v[2 * h], v[2 * h + 1], 0x20);
    hi[h] = _mm256_permute2x128_si256(v[2 * h], v[2 * h + 1], 0x31);
    const __m256i pick = _mm256_setr_epi32(2 * h, 2 * h, 2 * h, 2 * h, 2 * h + 1, 2 * h + 1, 2 * h + 1, 2 * h + 1);
    dw[h] = _mm256_permutevar8x32_ps(s4, pick);
    bw[h] = _mm256_permutevar8x32_ps(m4, pick);
  }
}

// The 8 lanes' dots of weight codes w (values or codes, see panel_codes) with activation bytes x.
template <class Unpack>
inline __m256i dot_avx2(__m256i w, __m256i x) {
  if constexpr (Unpack::kSigned) return dot4_avx2(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
  return dot4_avx2(w, x);
}
#endif

// A tile of RW weight rows x RX activation rows. Chunks (b1 < nb) leave their accumulators in the
// carry, the next chunk starts from them: the same operations in the same order as one pass.
// Inlined into rows(): a short row (a small model's 256 columns) would otherwise pay the call and the
// pointer setup per weight row.
template <class Unpack, int RW, int RX>
[[gnu::always_inline]] inline void tile_x32(const std::byte* w, size_t wrb, const std::byte* x, size_t xs, int64_t cols, float* y, int64_t ldy,
              const Chunk& chunk) {
  constexpr bool kAffine = Unpack::kAffine;
  const X32Layout lay(cols, kAffine);
  const bool resume = chunk.b0 > 0, suspend = chunk.b1 < lay.nb;
  const int8_t* xq[RX];
  const int32_t* xi[RX];
  const float *xd[RX], *xm[RX];
  for (int r = 0; r < RX; ++r) {
    xq[r] = at<int8_t>(x, r * xs);
    xi[r] = at<int32_t>(x, r * xs + lay.init());
    xd[r] = at<float>(x, r * xs + lay.scale());
    xm[r] = at<float>(x, r * xs + lay.sums());
  }
#if SPECULA_WIDE
  __m512 acc[RW][RX];
  for (int i = 0; i < RW; ++i)
    for (int r = 0; r < RX; ++r) acc[i][r] = resume ? _mm512_loadu_ps(chunk.at(i, r)) : _mm512_setzero_ps();
  for (int64_t b = chunk.b0; b < chunk.b1; b += 4) {
    const int n = chunk.b1 - b < 4 ? static_cast<int>(chunk.b1 - b) : 4;
    const int64_t g = b / 4;
    __m512i lo[RW], hi[RW];
    __m512 dw[RW], bw[RW];
    for (int i = 0; i < RW; ++i) {
      const std::byte* row = w + i * wrb;
      prefetch_ahead(Unpack::at(row, b), 4 * Unpack::kBytes, chunk.ahead);
      group_codes<Unpack>(row, b, n, lo[i], hi[i], dw[i], bw[i]);
    }
    for (int r = 0; r < RX; ++r) {
      const __m512i xlo = _mm512_loadu_si512(xq[r] + 128 * g), xhi = _mm512_loadu_si512(xq[r] + 128 * g + 64);
      const __m512i in = _mm512_loadu_si512(xi[r] + 16 * g);
      const __m512 dx = _mm512_loadu_ps(xd[r] + 16 * g);
      for (int i = 0; i < RW; ++i) {
        const __m512i p = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(in, lo[i], xlo), hi[i], xhi);
        acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(dw[i], dx), acc[i][r]);
        if constexpr (kAffine) acc[i][r] = _mm512_fmadd_ps(bw[i], _mm512_loadu_ps(xm[r] + 16 * g), acc[i][r]);
      }
    }
  }
  for (int i = 0; i < RW; ++i)
    for (int r = 0; r < RX; ++r) {
      if (suspend)
        _mm512_storeu_ps(chunk.at(i, r), acc[i][r]);
      else
        y[r * ldy + i] = hsum8(fold(acc[i][r]));
    }
#else
  __m256 acc[2][RW][RX];
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < RW; ++i)
      for (int r = 0; r < RX; ++r)
        acc[h][i][r] = resume ? _mm256_loadu_ps(chunk.at(i, r) + 8 * h) : _mm256_setzero_ps();
  for (int64_t b = chunk.b0; b < chunk.b1; b += 4) {
    const int n = chunk.b1 - b < 4 ? static_cast<int>(chunk.b1 - b) : 4;
    const int64_t g = b / 4;
    __m256i lo[RW][2], hi[RW][2];
    __m256 dw[RW][2], bw[RW][2];
    for (int i = 0; i < RW; ++i) {
      const std::byte* row = w + i * wrb;
      prefetch_ahead(Unpack::at(row, b), 4 * Unpack::kBytes, chunk.ahead);
      group_codes<Unpack>(row, b, n, lo[i], hi[i], dw[i], bw[i]);
    }
    for (int r = 0; r < RX; ++r)
      for (int h = 0; h < 2; ++h) {
        const __m256i xlo = loadu256(xq[r] + 128 * g + 32 * h), xhi = loadu256(xq[r] + 128 * g + 64 + 32 * h);
        // The storage offset's correction (Q8_0 has none here: AVX2 dots its signed values).
        const __m256i in = Unpack::kOffset ? loadu256(xi[r] + 16 * g + 8 * h) : _mm256_setzero_si256();
        const __m256 dx = _mm256_loadu_ps(xd[r] + 16 * g + 8 * h);
        for (int i = 0; i < RW; ++i) {
          __m256i p = _mm256_add_epi32(dot_avx2<Unpack>(lo[i][h], xlo), dot_avx2<Unpack>(hi[i][h], xhi));
          if constexpr (Unpack::kOffset != 0) p = _mm256_add_epi32(in, p);
          acc[h][i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(dw[i][h], dx), acc[h][i][r]);
          if constexpr (kAffine)
            acc[h][i][r] = _mm256_fmadd_ps(bw[i][h], _mm256_loadu_ps(xm[r] + 16 * g + 8 * h), acc[h][i][r]);
        }
      }
  }
  for (int i = 0; i < RW; ++i)
    for (int r = 0; r < RX; ++r) {
      if (suspend) {
        _mm256_storeu_ps(chunk.at(i, r), acc[0][i][r]);
        _mm256_storeu_ps(chunk.at(i, r) + 8, acc[1][i][r]);
      } else {
        y[r * ldy + i] = hsum8(_mm256_add_ps(acc[0][i][r], acc[1][i][r]));
      }
    }
#endif
}

// The x32 tiles as rows() takes them: all blocks, or (chunked) blocks [b0, b1) with a carry. Inlined
// too: GCC kept run() out of line, so decode paid a call and the record's pointer setup per weight row.
template <class Unpack>
struct X32Tiles {
  template <int RW, int RX>
  struct Tile {
    static constexpr int64_t kBlock = 32, kGroup = 4;
    [[gnu::always_inline]] static void run(const std::byte* w, size_t wrb, const std::byte* x, size_t xs, int64_t c,
                                           float* y, int64_t ldy) {
      tile_x32<Unpack, RW, RX>(w, wrb, x, xs, c, y, ldy, Chunk{0, c / 32});
    }
    [[gnu::always_inline]] static void run(const std::byte* w, size_t wrb, const std::byte* x, size_t xs, int64_t c,
                                           float* y, int64_t ldy, const Chunk& chunk) {
      tile_x32<Unpack, RW, RX>(w, wrb, x, xs, c, y, ldy, chunk);
    }
  };
};

// What the panel kernels read of RX activation records: codes, block scales and block start values.
template <int RX>
struct PanelRecords {
  const int8_t* xq[RX];
  const float* xd[RX];
  const int32_t* xi[RX];
  PanelRecords(const std::byte* x, size_t xs, int64_t cols) {
    for (int r = 0; r < RX; ++r) {
      xq[r] = at<int8_t>(x, r * xs);
      xd[r] = at<float>(x, r * xs + X32Layout(cols, false).scale());
      xi[r] = at<int32_t>(x, r * xs + X32Layout(cols, false).block_init());
    }
  }
};

#if SPECULA_WIDE
// ---- prefill: 16-row weight panels in the VNNI layout ---------------------------------------------------
// With many activation rows, 16 weight rows are first rearranged, block by block, into 8 groups of
// [16 rows][4 codes] with their 16 scales as floats: one dpbusd then advances 16 dot products by 4 values
// (the activation's 4 bytes broadcast), and the block's scales cost 3 instructions per 16 rows, not 3
// per row. The integer sums are exact, so rows differ from the few-row tiles only in float rounding.
struct PanelBlock {
  uint8_t codes[8][16][4];
  float scale[16];
};

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
constexpr int64_t kPanelBlocks = 64;  // blocks per pass: two panels of 36 KB stay in L1/L2

template <class Unpack>
void pack_panel(const std::byte* w, size_t wrb, int rows, int64_t b0, int64_t nb, PanelBlock* out) {
  alignas(64) uint8_t codes[16][32];
  alignas(64) float scales[16];
  std::memset(codes, 0, sizeof codes);
  std::memset(scales, 0, sizeof scales);
  for (int64_t b = 0; b < nb; ++b) {
    for (int i = 0; i < rows; ++i) {
      const std::byte* row = w + i * wrb;
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes[i]), Unpack::panel_codes(Unpack::at(row, b0 + b)));
      scales[i] = Unpack::scale(row, b0 + b);
    }
    __m512i g8[8];
    transpose16x8(codes, 32, g8);
    for (int g = 0; g < 8; ++g) _mm512_store_si512(out[b].codes[g], g8[g]);
    _mm512_store_ps(out[b].scale, _mm512_load_ps(scales));
  }
}

// RX activation rows x NP panels over blocks [b0, b0 + nb); y holds the sums so far unless `first`.
template <int RX, int NP>
void panel_tile(const PanelBlock* const* panel, const __mmask16* valid, int64_t b0, int64_t nb, bool first,
                const std::byte* x, size_t xs, int64_t cols, float* y, int64_t ldy) {
  const auto& [xq, xd, xi] = PanelRecords<RX>(x, xs, cols);
  __m512 acc[NP][RX];
  for (int p = 0; p < NP; ++p)
    for (int r = 0; r < RX; ++r)
      acc[p][r] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(valid[p], y + r * ldy + 16 * p);
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t xb = b0 + b;
    __m512i sum[NP][RX];
    for (int r = 0; r < RX; ++r) {
      const __m512i init = _mm512_set1_epi32(xi[r][xb]);
      for (int p = 0; p < NP; ++p) sum[p][r] = init;
    }
    for (int g = 0; g < 8; ++g) {
      __m512i wv[NP];
      for (int p = 0; p < NP; ++p) wv[p] = _mm512_load_si512(panel[p][b].codes[g]);
      for (int r = 0; r < RX; ++r) {
        int32_t x4;
        std::memcpy(&x4, xq[r] + X32Layout::q(xb, g), 4);
        const __m512i xv = _mm512_set1_epi32(x4);
        for (int p = 0; p < NP; ++p) sum[p][r] = _mm512_dpbusd_epi32(sum[p][r], wv[p], xv);
      }
    }
    for (int p = 0; p < NP; ++p) {
      const __m512 dw = _mm512_load_ps(panel[p][b].scale);
      for (int r = 0; r < RX; ++r)
        acc[p][r] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[p][r]), _mm512_mul_ps(dw, _mm512_set1_ps(xd[r][X32Layout::d(xb)])), acc[p][r]);
    }
  }
  for (int p = 0; p < NP; ++p)
    for (int r = 0; r < RX; ++r) _mm512_mask_storeu_ps(y + r * ldy + 16 * p, valid[p], acc[p][r]);
}

template <int NP>
void panel_rows(const PanelBlock* const* panel, const __mmask16* valid, int64_t b0, int64_t nb, bool first,
                const std::byte* x, size_t xs, int64_t nx, int64_t cols, float* y, int64_t ldy) {
  constexpr int RX = 4;
  int64_t r = 0;
  for (; r + RX <= nx; r += RX) panel_tile<RX, NP>(panel, valid, b0, nb, first, x + r * xs, xs, cols, y + r * ldy, ldy);
  for (; r < nx; ++r) panel_tile<1, NP>(panel, valid, b0, nb, first, x + r * xs, xs, cols, y + r * ldy, ldy);
}

template <class Unpack>
void rows_panel(const std::byte* w, size_t wrb, int64_t nw, const std::byte* x, size_t xs, int64_t nx, int64_t cols,
                float* y, int64_t ldy) {
  alignas(64) PanelBlock buf[2][kPanelBlocks];
  const int64_t nb = cols / 32;
  for (int64_t o = 0; o < nw; o += 32) {
    const int rows0 = static_cast<int>(nw - o < 16 ? nw - o : 16);
    const int rows1 = static_cast<int>(nw - o - 16 <= 0 ? 0 : nw - o - 16 < 16 ? nw - o - 16 : 16);
    const PanelBlock* panel[2] = {buf[0], buf[1]};
    const __mmask16 valid[2] = {static_cast<__mmask16>((1u << rows0) - 1), static_cast<__mmask16>((1u << rows1) - 1)};
    for (int64_t b0 = 0; b0 < nb; b0 += kPanelBlocks) {
      const int64_t n = nb - b0 < kPanelBlocks ? nb - b0 : kPanelBlocks;
      pack_panel<Unpack>(w + o * wrb, wrb, rows0, b0, n, buf[0]);
      if (rows1) {
        pack_panel<Unpack>(w + (o + 16) * wrb, wrb, rows1, b0, n, buf[1]);
        panel_rows<2>(panel, valid, b0, n, b0 == 0, x, xs, nx, cols, y + o, ldy);
      } else {
        panel_rows<1>(panel, valid, b0, n, b0 == 0, x, xs, nx, cols, y + o, ldy);
      }
    }
  }
}
#else
// ---- prefill: 8-row weight panels for AVX2 -----------------------------------------------------------------
// The AVX-512 panels' layout and arithmetic with 8 rows per register and maddubs + madd for the dots
// (Q8_0: |w| against sign(x, w)); the integer sums are the same, so are the float steps, so prefill gives
// the same bits on both sets.
struct PanelBlock {
  uint8_t codes[8][8][4];
  float scale[8];
};
constexpr int64_t kPanelBlocks = 64;

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

template <class Unpack>
void pack_panel(const std::byte* w, size_t wrb, int rows, int64_t b0, int64_t nb, PanelBlock* out) {
  alignas(64) uint8_t codes[8][32];
  alignas(64) float scales[8];
  std::memset(codes, 0, sizeof codes);
  std::memset(scales, 0, sizeof scales);
  for (int64_t b = 0; b < nb; ++b) {
    for (int i = 0; i < rows; ++i) {
      const std::byte* row = w + i * wrb;
      _mm256_store_si256(reinterpret_cast<__m256i*>(codes[i]), Unpack::panel_codes(Unpack::at(row, b0 + b)));
      scales[i] = Unpack::scale(row, b0 + b);
    }
    __m256i g8[8];
    transpose8x8(codes, 32, g8);
    for (int g = 0; g < 8; ++g) _mm256_store_si256(reinterpret_cast<__m256i*>(out[b].codes[g]), g8[g]);
    _mm256_store_ps(out[b].scale, _mm256_load_ps(scales));
  }
}

template <class Unpack, int RX>
void panel_tile(const PanelBlock* panel, int valid, int64_t b0, int64_t nb, bool first, const std::byte* x, size_t xs,
                int64_t cols, float* y, int64_t ldy) {
  const auto& [xq, xd, xi] = PanelRecords<RX>(x, xs, cols);
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256 acc[RX];
  for (int r = 0; r < RX; ++r) acc[r] = first ? _mm256_setzero_ps() : _mm256_maskload_ps(y + r * ldy, mask);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t xb = b0 + b;
    __m256i sum[RX];
    for (int r = 0; r < RX; ++r) sum[r] = _mm256_set1_epi32(xi[r][xb]);
    for (int g = 0; g < 8; ++g) {
      const __m256i wv = _mm256_load_si256(reinterpret_cast<const __m256i*>(panel[b].codes[g]));
      const __m256i aw = Unpack::kSigned ? _mm256_sign_epi8(wv, wv) : wv;
      for (int r = 0; r < RX; ++r) {
        int32_t x4;
        std::memcpy(&x4, xq[r] + X32Layout::q(xb, g), 4);
        __m256i xv = _mm256_set1_epi32(x4);
        if constexpr (Unpack::kSigned) xv = _mm256_sign_epi8(xv, wv);
        sum[r] = _mm256_add_epi32(sum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xv), ones));
      }
    }
    const __m256 dw = _mm256_load_ps(panel[b].scale);
    for (int r = 0; r < RX; ++r)
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r]), _mm256_mul_ps(dw, _mm256_set1_ps(xd[r][X32Layout::d(xb)])), acc[r]);
  }
  for (int r = 0; r < RX; ++r) _mm256_maskstore_ps(y + r * ldy, mask, acc[r]);
}

template <class Unpack>
void rows_panel(const std::byte* w, size_t wrb, int64_t nw, const std::byte* x, size_t xs, int64_t nx, int64_t cols,
                float* y, int64_t ldy) {
  alignas(64) PanelBlock buf[kPanelBlocks];
  const int64_t nb = cols / 32;
  constexpr int RX = 4;
  for (int64_t o = 0; o < nw; o += 8) {
    const int rows = static_cast<int>(nw - o < 8 ? nw - o : 8);
    for (int64_t b0 = 0; b0 < nb; b0 += kPanelBlocks) {
      const int64_t n = nb - b0 < kPanelBlocks ? nb - b0 : kPanelBlocks;
      pack_panel<Unpack>(w + o * wrb, wrb, rows, b0, n, buf);
      int64_t r = 0;
      for (; r + RX <= nx; r += RX)
        panel_tile<Unpack, RX>(buf, rows, b0, n, b0 == 0, x + r * xs, xs, cols, y + r * ldy + o, ldy);
      for (; r < nx; ++r) panel_tile<Unpack, 1>(buf, rows, b0, n, b0 == 0, x + r * xs, xs, cols, y + r * ldy + o, ldy);
    }
  }
}
#endif

// ---- activation-row tiles ---------------------------------------------------------------------------------
// over_x splits nx activation rows into tiles of TX rows and calls tile.template operator()<RX>(first row)
// for each.
template <int N, class F>
void tail_x(int64_t left, int64_t r, F& tile) {
  if constexpr (N > 0) {
    if (left == N) return tile.template operator()<N>(r);
    tail_x<N - 1>(left, r, tile);
  }
}
template <int TX, class F>
void over_x(int64_t nx, F&& tile) {
  int64_t r = 0;
  for (; r + TX <= nx; r += TX) tile.template operator()<TX>(r);
  tail_x<TX - 1>(nx - r, r, tile);
}

// ---- packed weights: 16-row panels built once, read by every product ------------------------------------
// The prefill panels' arithmetic (exact integer dot per 32-value block, then one scale and one add per
// block and row, in block order) on a layout built when the weight is first multiplied, so decode pays
// no repacking and reads as many bytes as the file holds. Every row count runs the same operations, so a
// row's result depends on nothing else in the batch, and equals what the prefill panels give.
// Panel block (16 weight rows x 32 values), 32-byte aligned:
//   Q8_0: codes[8][16][4] (dword g of row i: values 4g..4g+3, as panel_codes gives them), f16 scale[16]
//   Q4_0: nibbles[4][16][4] (byte j of dword g: value 4g+j low, 16+4g+j high: the file's own bytes),
//         f16 scale[16]
// Panels follow each other, blocks in order inside a panel; rows past the matrix's end are zeros.

struct PackedQ8_0 {
  using Unpack = Q8_0Unpack;
  static constexpr size_t kCodes = 512;
  static void pack(const std::byte* wb, std::byte* out, int i) {
    alignas(32) uint8_t c[32];
    _mm256_store_si256(reinterpret_cast<__m256i*>(c), Unpack::panel_codes(wb));
    for (int g = 0; g < 8; ++g) std::memcpy(out + 64 * g + 4 * i, c + 4 * g, 4);
  }
#if SPECULA_WIDE
  static void unpack(const std::byte* blk, __m512i* wv) {
    for (int g = 0; g < 8; ++g) wv[g] = _mm512_loadu_si512(blk + 64 * g);
  }
#else
  static void unpack(const std::byte* blk, int h, __m256i* wv) {
    for (int g = 0; g < 8; ++g) wv[g] = loadu256(blk + 64 * g + 32 * h);
  }
#endif
};

struct PackedQ4_0 {
  using Unpack = Q4_0Unpack;
  static constexpr size_t kCodes = 256;
  static void pack(const std::byte* wb, std::byte* out, int i) {
    for (int g = 0; g < 4; ++g) std::memcpy(out + 64 * g + 4 * i, wb + 2 + 4 * g, 4);
  }
#if SPECULA_WIDE
  static void unpack(const std::byte* blk, __m512i* wv) {
    const __m512i m = _mm512_set1_epi8(0x0f);
    for (int g = 0; g < 4; ++g) {
      const __m512i z = _mm512_loadu_si512(blk + 64 * g);
      wv[g] = _mm512_and_si512(z, m);
      wv[g + 4] = _mm512_and_si512(_mm512_srli_epi16(z, 4), m);
    }
  }
#else
  static void unpack(const std::byte* blk, int h, __m256i* wv) {
    const __m256i m = _mm256_set1_epi8(0x0f);
    for (int g = 0; g < 4; ++g) {
      const __m256i z = loadu256(blk + 64 * g + 32 * h);
      wv[g] = _mm256_and_si256(z, m);
      wv[g + 4] = _mm256_and_si256(_mm256_srli_epi16(z, 4), m);
    }
  }
#endif
};

template <class P>
constexpr size_t packed_block_bytes() {
  return P::kCodes + 2 * kPanelRows;
}
template <class P>
size_t packed_panel_bytes(int64_t cols) {
  return packed_block_bytes<P>() * static_cast<size_t>(cols / 32);
}

// Weight rows [0, nw) (row_bytes apart) into ceil(nw / 16) panels at out (zeroed by the caller).
template <class P>
void pack_weights(const std::byte* w, size_t wrb, int64_t nw, int64_t cols, std::byte* out) {
  const int64_t nb = cols / 32;
  for (int64_t o = 0; o < nw; o += kPanelRows) {
    const int rows = static_cast<int>(nw - o < kPanelRows ? nw - o : kPanelRows);
    std::byte* panel = out + static_cast<size_t>(o / kPanelRows) * packed_panel_bytes<P>(cols);
    for (int64_t b = 0; b < nb; ++b) {
      std::byte* blk = panel + static_cast<size_t>(b) * packed_block_bytes<P>();
      for (int i = 0; i < rows; ++i) {
        const std::byte* wb = P::Unpack::at(w + (o + i) * wrb, b);
        P::pack(wb, blk, i);
        std::memcpy(blk + P::kCodes + 2 * i, wb, 2);  // the f16 scale
      }
    }
  }
}

// RX activation rows x one panel (`valid` of its rows are real) over all blocks.
template <class P, int RX>
[[gnu::always_inline]] inline void packed_tile(const std::byte* panel, int valid, const std::byte* x, size_t xs,
                                               int64_t cols, float* y, int64_t ldy) {
  const int64_t nb = cols / 32;
  constexpr size_t kBlock = packed_block_bytes<P>();
  const auto& [xq, xd, xi] = PanelRecords<RX>(x, xs, cols);
#if SPECULA_WIDE
  __m512 acc[RX];
  for (int r = 0; r < RX; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const std::byte* blk = panel + static_cast<size_t>(b) * kBlock;
    prefetch_ahead(blk, kBlock);
    __m512i wv[8];
    P::unpack(blk, wv);
    // Two partial sums per row when there are few rows: the integer sum is the same, the chain half as long.
    constexpr int kChains = RX < 4 ? 2 : 1;
    __m512i sum[kChains][RX];
    for (int r = 0; r < RX; ++r) {
      sum[0][r] = _mm512_set1_epi32(xi[r][b]);
      if constexpr (kChains == 2) sum[1][r] = _mm512_setzero_si512();
    }
    for (int g = 0; g < 8; ++g)
      for (int r = 0; r < RX; ++r) {
        int32_t x4;
        std::memcpy(&x4, xq[r] + X32Layout::q(b, g), 4);
        __m512i& s = sum[g % kChains][r];
        s = _mm512_dpbusd_epi32(s, wv[g], _mm512_set1_epi32(x4));
      }
    const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(blk + P::kCodes)));
    for (int r = 0; r < RX; ++r) {
      const __m512i s = kChains == 2 ? _mm512_add_epi32(sum[0][r], sum[kChains - 1][r]) : sum[0][r];
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(xd[r][X32Layout::d(b)])), acc[r]);
    }
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
  for (int r = 0; r < RX; ++r) _mm512_mask_storeu_ps(y + r * ldy, mask, acc[r]);
#else
  const __m256i ones = _mm256_set1_epi16(1);
  for (int h = 0; h < 2 && valid > 8 * h; ++h) {
    __m256 acc[RX];
    for (int r = 0; r < RX; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
      const std::byte* blk = panel + static_cast<size_t>(b) * kBlock;
      prefetch_ahead(blk, kBlock);
      __m256i wv[8];
      P::unpack(blk, h, wv);
      __m256i sum[RX];
      for (int r = 0; r < RX; ++r) sum[r] = _mm256_set1_epi32(xi[r][b]);
      for (int g = 0; g < 8; ++g) {
        const __m256i aw = P::Unpack::kSigned ? _mm256_sign_epi8(wv[g], wv[g]) : wv[g];
        for (int r = 0; r < RX; ++r) {
          int32_t x4;
          std::memcpy(&x4, xq[r] + X32Layout::q(b, g), 4);
          __m256i xv = _mm256_set1_epi32(x4);
          if constexpr (P::Unpack::kSigned) xv = _mm256_sign_epi8(xv, wv[g]);
          sum[r] = _mm256_add_epi32(sum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, xv), ones));
        }
      }
      const __m256 dw =
          _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(blk + P::kCodes + 16 * h)));
      for (int r = 0; r < RX; ++r)
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r]), _mm256_mul_ps(dw, _mm256_set1_ps(xd[r][X32Layout::d(b)])), acc[r]);
    }
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(valid - 8 * h), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    for (int r = 0; r < RX; ++r) _mm256_maskstore_ps(y + r * ldy + 8 * h, mask, acc[r]);
  }
#endif
}

// Weight rows [0, nw) packed at w (panels `panel_bytes` apart) times nx activation rows. A RowsKernel with
// the packed panels in place of the rows.
template <class P>
void packed_rows(const std::byte* w, size_t panel_bytes, int64_t nw, const std::byte* x, size_t xs, int64_t nx,
                 int64_t cols, float* y, int64_t ldy) {
  constexpr int TX = kWide ? 8 : 2;  // AVX-512: 8 unpacked codes, 8 sums, 8 accumulators in 32 registers
  for (int64_t o = 0; o < nw; o += kPanelRows) {
    const std::byte* panel = w + static_cast<size_t>(o / kPanelRows) * panel_bytes;
    const int valid = static_cast<int>(nw - o < kPanelRows ? nw - o : kPanelRows);
    over_x<TX>(nx, [&]<int RX>(int64_t r) __attribute__((always_inline)) {
      packed_tile<P, RX>(panel, valid, x + r * xs, xs, cols, y + r * ldy + o, ldy);
    });
  }
}

// ---- K-quants (Q4_K, Q6_K): 256-value super-blocks -----------------------------------------------------
// q: int8[cols] | scale: float[cols / 256] | bsums: int16[cols / 16] (sums of 16 codes, for the offsets)
size_t xk_bytes(int64_t cols) {
  return align64(static_cast<size_t>(cols) + static_cast<size_t>(cols) / 64 + static_cast<size_t>(cols) / 8);
}

void quantize_xk(const float* x, int64_t cols, std::byte* rec) {
  auto* q = reinterpret_cast<int8_t*>(rec);
  auto* scale = reinterpret_cast<float*>(rec + cols);
  auto* bsums = reinterpret_cast<int16_t*>(rec + cols + cols / 64);
  for (int64_t b = 0; b < cols / 256; ++b) {
    const float* xb = x + 256 * b;
    float amax = 0.0f;
    for (int i = 0; i < 256; ++i) amax = __builtin_fmaxf(amax, __builtin_fabsf(xb[i]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    scale[b] = d;
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int i = 16 * g; i < 16 * g + 16; ++i) {
        const int v = static_cast<int>(__builtin_nearbyintf(xb[i] * id));
        q[256 * b + i] = static_cast<int8_t>(v);
        sum += v;
      }
      bsums[16 * b + g] = static_cast<int16_t>(sum);
    }
  }
}

struct XK {
  const int8_t* q;
  const float* d;
  const int16_t* bsums;
};
inline XK xk(const std::byte* x, size_t xs, int r, int64_t cols) {
  const std::byte* p = x + r * xs;
  return {at<int8_t>(p, 0), at<float>(p, cols), at<int16_t>(p, cols + cols / 64)};
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

#if SPECULA_WIDE
// ---- prefill panels for K-quants ------------------------------------------------------------------------
// As for 32-value blocks: per super-block, 16 weight rows' codes (unsigned) in 64 groups of [16 rows][4],
// and per sub-block the products d * scale (and dmin * min) as floats for the 16 rows.
struct KPanelBlock {
  uint8_t codes[64][16][4];
  float scale[16][16];  // Q4_K: 8 sub-blocks of 32 values, Q6_K: 16 of 16
  float mins[8][16];    // Q4_K only
};
constexpr int64_t kKPanelBlocks = 8;  // super-blocks per pass: two panels of 44 KB

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
// ---- prefill panels for K-quants, AVX2: 8 rows per register, maddubs + madd for the dots -----------------
struct KPanelBlock {
  uint8_t codes[64][8][4];
  float scale[16][8];
  float mins[8][8];
};
constexpr int64_t kKPanelBlocks = 8;

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

// ---- F32 / F16 / BF16 weights against F32 activations ---------------------------------------------------
// Two 8-lane accumulators take alternate groups of 8 values (AVX-512: one register's halves); the last
// cols % 16 values are added one by one after the reduction.
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

template <Float T>
struct FloatTiles {
  template <int RW, int RX>
  struct Tile {
    static void run(const std::byte* w, size_t wrb, const std::byte* x, size_t xs, int64_t cols, float* y,
                    int64_t ldy) {
      const float* xr[RX];
      for (int r = 0; r < RX; ++r) xr[r] = at<float>(x, r * xs);
      int64_t i = 0;
#if SPECULA_WIDE
      __m512 acc[RW][RX];
      for (int o = 0; o < RW; ++o)
        for (int r = 0; r < RX; ++r) acc[o][r] = _mm512_setzero_ps();
      for (; i + 16 <= cols; i += 16) {
        __m512 wv[RW];
        for (int o = 0; o < RW; ++o) {
          prefetch_ahead(w + o * wrb + i * (T == Float::f32 ? 4 : 2), 64);
          wv[o] = load16<T>(w + o * wrb, i);
        }
        for (int r = 0; r < RX; ++r) {
          const __m512 xv = _mm512_loadu_ps(xr[r] + i);
          for (int o = 0; o < RW; ++o) acc[o][r] = _mm512_fmadd_ps(wv[o], xv, acc[o][r]);
        }
      }
      for (int o = 0; o < RW; ++o)
        for (int r = 0; r < RX; ++r) y[r * ldy + o] = hsum8(fold(acc[o][r]));
#else
      __m256 acc[2][RW][RX];
      for (int h = 0; h < 2; ++h)
        for (int o = 0; o < RW; ++o)
          for (int r = 0; r < RX; ++r) acc[h][o][r] = _mm256_setzero_ps();
      for (; i + 16 <= cols; i += 16)
        for (int h = 0; h < 2; ++h) {
          __m256 wv[RW];
          for (int o = 0; o < RW; ++o) wv[o] = load8<T>(w + o * wrb, i + 8 * h);
          for (int r = 0; r < RX; ++r) {
            const __m256 xv = _mm256_loadu_ps(xr[r] + i + 8 * h);
            for (int o = 0; o < RW; ++o) acc[h][o][r] = _mm256_fmadd_ps(wv[o], xv, acc[h][o][r]);
          }
        }
      for (int o = 0; o < RW; ++o)
        for (int r = 0; r < RX; ++r) y[r * ldy + o] = hsum8(_mm256_add_ps(acc[0][o][r], acc[1][o][r]));
#endif
      for (; i < cols; ++i)
        for (int o = 0; o < RW; ++o)
          for (int r = 0; r < RX; ++r) y[r * ldy + o] += scalar_weight<T>(w + o * wrb, i) * xr[r][i];
    }
  };
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

// ---- MLX affine, 4 or 8 bits, float activations -----------------------------------------------------------
// w = scale q + bias per group of 32 / 64 / 128 values, so a block of 32 contributes
// scale * sum(q x) + bias * sum(x). The codes convert to floats in registers: 4 bits hold value 2m in the
// low nibble of byte m and 2m + 1 in the high one, so the activation record keeps each block's even
// values first, then its odd ones. Lane j of a block's 16-lane product is q[a_j] x[a_j] + q[b_j] x[b_j]
// (AVX2: lanes 0-7 and 8-15 in two halves), scaled and accumulated per lane; the bias terms are summed
// in order on the side. The same operations on both sets: the same bits.
// Record: x: float[cols] (reordered) | sums: float[cols / 32] (each block's sum, in value order)
size_t xmlx_bytes(int64_t cols) { return align64(4 * static_cast<size_t>(cols) + static_cast<size_t>(cols) / 8); }

template <int kBits>
void prepare_xmlx(const float* x, int64_t cols, std::byte* rec) {
  auto* xr = reinterpret_cast<float*>(rec);
  auto* sums = reinterpret_cast<float*>(rec + 4 * cols);
  for (int64_t b = 0; b < cols / 32; ++b) {
    const float* xb = x + 32 * b;
    float* out = xr + 32 * b;
    float s = 0;
    for (int i = 0; i < 32; ++i) s += xb[i];
    sums[b] = s;
    for (int m = 0; m < 16; ++m) {
      out[m] = kBits == 4 ? xb[2 * m] : xb[m];
      out[16 + m] = kBits == 4 ? xb[2 * m + 1] : xb[16 + m];
    }
  }
}

inline float mlx_scale(const AffineMatrix& m, const std::byte* p, int64_t g) {
  switch (m.scale_type) {
    case AffineMatrix::Scale::f16: return f16(p + 2 * g);
    case AffineMatrix::Scale::bf16: {
      uint16_t h;
      std::memcpy(&h, p + 2 * g, 2);
      const uint32_t bits = static_cast<uint32_t>(h) << 16;
      float f;
      std::memcpy(&f, &bits, 4);
      return f;
    }
    default: {
      float f;
      std::memcpy(&f, p + 4 * g, 4);
      return f;
    }
  }
}

// The 32 codes of a block as the first and second 16 bytes the record's order pairs with.
template <int kBits>
inline void mlx_codes(const std::byte* block, __m128i& a, __m128i& b) {
  const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block));
  if constexpr (kBits == 4) {
    a = _mm_and_si128(p, _mm_set1_epi8(0x0f));
    b = _mm_and_si128(_mm_srli_epi16(p, 4), _mm_set1_epi8(0x0f));
  } else {
    a = p;
    b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16));
  }
}

template <int kBits, int RX>
void tile_mlx(const AffineMatrix& m, int64_t o, const std::byte* x, size_t xs, int64_t cols, float* y, int64_t ldy) {
  constexpr int64_t kBytes = 4 * kBits;
  const std::byte* row = m.codes + static_cast<size_t>(o) * m.code_bytes;
  const std::byte* sc = m.scales + static_cast<size_t>(o) * m.scale_bytes;
  const std::byte* bi = m.biases + static_cast<size_t>(o) * m.scale_bytes;
  const int64_t nb = cols / 32, per_group = m.group_size / 32;
  const float *xr[RX], *xsum[RX];
  float side[RX];
  for (int r = 0; r < RX; ++r) {
    xr[r] = at<float>(x, r * xs);
    xsum[r] = at<float>(x, r * xs + 4 * cols);
    side[r] = 0;
  }
  float s = 0, bias = 0;
#if SPECULA_WIDE
  __m512 acc[RX];
  for (int r = 0; r < RX; ++r) acc[r] = _mm512_setzero_ps();
#else
  __m256 acc[2][RX];
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < RX; ++r) acc[h][r] = _mm256_setzero_ps();
#endif
  for (int64_t b = 0; b < nb; ++b) {
    if (b % per_group == 0) {
      s = mlx_scale(m, sc, b / per_group);
      bias = mlx_scale(m, bi, b / per_group);
    }
    prefetch_ahead(row + kBytes * b, kBytes);
    __m128i ca, cb;
    mlx_codes<kBits>(row + kBytes * b, ca, cb);
#if SPECULA_WIDE
    const __m512 qa = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(ca)), qb = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(cb));
    const __m512 sv = _mm512_set1_ps(s);
    for (int r = 0; r < RX; ++r) {
      const float* xb = xr[r] + 32 * b;
      const __m512 t = _mm512_fmadd_ps(qa, _mm512_loadu_ps(xb), _mm512_mul_ps(qb, _mm512_loadu_ps(xb + 16)));
      acc[r] = _mm512_fmadd_ps(t, sv, acc[r]);
      side[r] = __builtin_fmaf(bias, xsum[r][b], side[r]);
    }
#else
    __m256 qa[2], qb[2];
    for (int h = 0; h < 2; ++h) {
      qa[h] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h ? _mm_srli_si128(ca, 8) : ca));
      qb[h] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h ? _mm_srli_si128(cb, 8) : cb));
    }
    const __m256 sv = _mm256_set1_ps(s);
    for (int r = 0; r < RX; ++r) {
      const float* xb = xr[r] + 32 * b;
      for (int h = 0; h < 2; ++h) {
        const __m256 t = _mm256_fmadd_ps(qa[h], _mm256_loadu_ps(xb + 8 * h), _mm256_mul_ps(qb[h], _mm256_loadu_ps(xb + 16 + 8 * h)));
        acc[h][r] = _mm256_fmadd_ps(t, sv, acc[h][r]);
      }
      side[r] = __builtin_fmaf(bias, xsum[r][b], side[r]);
    }
#endif
  }
  for (int r = 0; r < RX; ++r) {
#if SPECULA_WIDE
    y[r * ldy] = hsum8(fold(acc[r])) + side[r];
#else
    y[r * ldy] = hsum8(_mm256_add_ps(acc[0][r], acc[1][r])) + side[r];
#endif
  }
}

template <int kBits>
void rows_mlx(const AffineMatrix& m, int64_t nw, const std::byte* x, size_t xs, int64_t nx, int64_t cols, float* y,
              int64_t ldy) {
  constexpr int TX = kWide ? 4 : 2;
  for (int64_t o = 0; o < nw; ++o)
    over_x<TX>(nx, [&]<int RX>(int64_t r) { tile_mlx<kBits, RX>(m, o, x + r * xs, xs, cols, y + r * ldy + o, ldy); });
}

constexpr int QX = 4;  // 32-value blocks: activation rows per tile (K + 1 = 2..9 verified rows, batches)
// Weight rows per tile: each activation load serves QW rows. With 32 registers, 4 x 4 accumulators and 4
// unpacked rows fit (an 8-row batch step: 151 ms vs 220 ms at 1 x 8 on Zen 4); AVX2 has room for 1 x 4.
constexpr int QW = kWide ? 4 : 1;

template <class Unpack>
constexpr QuantKernel x32(RowsKernel prefill) {
  return {&quantize_x32<Unpack::kOffset, Unpack::kAffine>, &x32_bytes<Unpack::kAffine>,
          &rows<X32Tiles<Unpack>::template Tile, QW, QX>, prefill};
}
template <class Packed>
constexpr QuantKernel x32_packed() {
  QuantKernel k = x32<typename Packed::Unpack>(&rows_panel<typename Packed::Unpack>);
  k.panel_bytes = &packed_panel_bytes<Packed>;
  k.pack = &pack_weights<Packed>;
  k.packed = &packed_rows<Packed>;
  return k;
}

}  // namespace

const KernelSet& kernel_set() {
  // Tiles: 32 (AVX-512) or 16 (AVX2) registers hold the accumulators and the unpacked weight rows.
  // One weight row per tile for the quantized types: a few interleaved rows of a mapped file stream
  // slower than one, and the work per (weight, activation) pair is the same either way.
  constexpr int W = kWide ? 4 : 2, X = kWide ? 4 : 2;  // floats
  constexpr int KX = kWide ? 4 : 2;                    // K-quants: one weight row unpacks to 8-16 registers
  static const KernelSet set{
      .name = kWide ? "avx512" : "avx2",
      .q8_0 = x32_packed<PackedQ8_0>(),
      .q4_0 = x32_packed<PackedQ4_0>(),
      .q4_1 = x32<Q4_1Unpack>(nullptr),  // prompt chunks: matmul_gemm
      .q5_0 = x32<Q5_0Unpack>(&rows_panel<Q5_0Unpack>),
      .q5_1 = x32<Q5_1Unpack>(nullptr),
      .iq4_nl = x32<IQ4_NLUnpack>(&rows_panel<IQ4_NLUnpack>),
      .iq4_xs = x32<IQ4_XSUnpack>(&rows_panel<IQ4_XSUnpack>),
      .q4_k = {&quantize_xk, &xk_bytes, &rows<K4Tiles<false>::Tile, 1, KX>, &rows_kpanel<K4Pack<false>, false, 144>},
      .q5_k = {&quantize_xk, &xk_bytes, &rows<K4Tiles<true>::Tile, 1, KX>, &rows_kpanel<K4Pack<true>, false, 176>},
      .q6_k = {&quantize_xk, &xk_bytes, &rows<Q6_KTile, 1, KX>, &rows_kpanel<Q6_KPack, true, 210>},
      .f32 = &rows<FloatTiles<Float::f32>::Tile, W, X>,
      .f16 = &rows<FloatTiles<Float::f16>::Tile, W, X>,
      .bf16 = &rows<FloatTiles<Float::bf16>::Tile, W, X>,
      .mlx4 = {&prepare_xmlx<4>, &xmlx_bytes, &rows_mlx<4>},
      .mlx8 = {&prepare_xmlx<8>, &xmlx_bytes, &rows_mlx<8>},
  };
  return set;
}

}  // namespace specula::cpu::SPECULA_ISA_NS
