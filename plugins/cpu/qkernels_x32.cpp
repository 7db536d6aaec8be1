// Matrix kernels for weights in 32-value blocks (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL) and IQ4_XS,
// whose 256-value super-blocks run as eight 32-value blocks with computed scales.
// Compiled once per instruction set (qkernels.hpp, isa.hpp).
#include "qkernels.hpp"

#include <type_traits>

namespace specula::cpu::SPECULA_ISA_NS {
namespace {

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
    const float d = hmax8(amax) / 127.0f;
    const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    __m256i i[4];
    for (int k = 0; k < 4; ++k) i[k] = _mm256_cvtps_epi32(_mm256_mul_ps(v[k], id));  // round to nearest
    const __m256i qv = pack_i8(i);
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
  static constexpr size_t kCodesAt = kSkip;  // where in a block the codes start (the packed panels copy them)
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
  static constexpr size_t kCodesAt = kSkip;  // where in a block qh starts, the nibbles 4 bytes on
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
  static constexpr size_t kCodesAt = kSkip;
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
  // Block ib's signed 6-bit scale ls - 32 in super-block sb (the scale is d times it).
  static int scale_code(const std::byte* sb, int ib) {
    uint16_t high;
    std::memcpy(&high, sb + 2, 2);
    const int ls = ((static_cast<int>(sb[4 + ib / 2]) >> (4 * (ib % 2))) & 0xf) | (((high >> (2 * ib)) & 3) << 4);
    return ls - 32;
  }
  static float scale(const std::byte* row, int64_t b) {
    const std::byte* sb = row + 136 * (b / 8);
    return f16(sb) * static_cast<float>(scale_code(sb, static_cast<int>(b % 8)));
  }
  static __m128 scales4(const std::byte* row, int64_t b) {
    return _mm_setr_ps(scale(row, b), scale(row, b + 1), scale(row, b + 2), scale(row, b + 3));
  }
};

// ---- tiles: a few weight rows x a few activation rows over blocks [b0, b1) (Chunk: qkernels.hpp) ------
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
  PanelRecords(const std::byte* x, size_t xs, int64_t cols, bool affine = false) {
    const X32Layout lay(cols, affine);
    for (int r = 0; r < RX; ++r) {
      xq[r] = at<int8_t>(x, r * xs);
      xd[r] = at<float>(x, r * xs + lay.scale());
      xi[r] = at<int32_t>(x, r * xs + lay.block_init());
    }
  }
};

// ---- prefill: weight panels in the VNNI layout (AVX-512: 16 rows, AVX2: 8) ----------------------------
// With many activation rows, 16 weight rows are first rearranged, block by block, into 8 groups of
// [16 rows][4 codes] with their 16 scales as floats: one dpbusd then advances 16 dot products by 4 values
// (the activation's 4 bytes broadcast), and the block's scales cost 3 instructions per 16 rows, not 3
// per row. The integer sums are exact, so rows differ from the few-row tiles only in float rounding.
// AVX2: the same layout and arithmetic with 8 rows per register and maddubs + madd for the dots
// The AVX-512 panels' layout and arithmetic with 8 rows per register and maddubs + madd for the dots
// (Q8_0: |w| against sign(x, w)); the integer sums are the same, so are the float steps, so prefill gives
// the same bits on both sets.
#if SPECULA_WIDE
struct PanelBlock {
  uint8_t codes[8][16][4];
  float scale[16];
};
#else
struct PanelBlock {
  uint8_t codes[8][8][4];
  float scale[8];
};
#endif
constexpr int64_t kPanelBlocks = 64;  // blocks per pass: two panels of 36 KB stay in L1/L2

#if SPECULA_WIDE
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
#else
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
#endif

#if SPECULA_WIDE
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
#else
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
#endif

#if SPECULA_WIDE
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

// ---- packed weights: 16-row panels built once, read by every product ------------------------------------
// The prefill panels' arithmetic (exact integer dot per 32-value block, then one scale and one add per
// block and row, in block order) on a layout built when the weight is first multiplied, so decode pays
// no repacking and reads about as many bytes as the file holds. Every row count runs the same operations,
// so a row's result depends on nothing else in the batch, and equals what the prefill panels give.
// A panel is a run of units of kBlocks 32-value blocks (16 weight rows each), 32-byte aligned:
//   Q8_0 (1 block): codes[8][16][4] (dword g of row i: values 4g..4g+3, as panel_codes gives them), f16
//         scale[16]
//   Q4_0 (1 block): nibbles[4][16][4] (byte j of dword g: value 4g+j low, 16+4g+j high: the file's own
//         bytes), f16 scale[16]
//   IQ4_NL (1 block): as Q4_0 (its codes index IQ4's table as they are unpacked)
//   Q5_0 (1 block): Q4_0's nibbles | fifth bits [16][4] (PackedFiveBits) | f16 scale[16]: the file's size
//   Q4_1, Q5_1 (1 block): as Q4_0, Q5_0, then f16 m[16] after the scales (F16Affine): the file's size
//   IQ4_XS (a super-block, 8 blocks): nibbles[8][4][16][4] as Q4_0's | ls - 32 int8[8][16] | d f16[16]:
//         2208 bytes for the file's 2176; block j's scale d * (ls - 32) is formed as IQ4_XSUnpack::scale
//         forms it (one f32 product), so the bits are still the prefill panels'
// Panels follow each other, units in order inside a panel; rows past the matrix's end are zeros.
// P::pack(row, u, unit, i) writes unit u of a weight row as row i of `unit`; P::unpack(unit, j, wv) gives
// block j's codes as the dpbusd (AVX2: maddubs) takes them, P::scales(unit, j) its 16 (AVX2: 8) scales.

// One f16 scale per block and row, after the codes.
template <size_t kCodes>
struct F16Scales {
  static constexpr int kBlocks = 1;
  static constexpr size_t kUnitBytes = kCodes + 2 * kPanelRows;
  // Row i's scale: the f16 that starts the file's block wb.
  static void pack_scale(const std::byte* wb, std::byte* unit, int i) { std::memcpy(unit + kCodes + 2 * i, wb, 2); }
#if SPECULA_WIDE
  static __m512 scales(const std::byte* unit, int) {
    return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(unit + kCodes)));
  }
#else
  static __m256 scales(const std::byte* unit, int, int h) {
    return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(unit + kCodes + 16 * h)));
  }
#endif
};

// Affine blocks (Q4_1, Q5_1: w = d q + m): the 16 f16 d, then the 16 f16 m, after the codes. The m meet
// each block's sum of its rounded activations, appended to the affine record (quantize_x32_sums), as the
// packed MLX panels' biases do.
template <size_t kCodes>
struct F16Affine : F16Scales<kCodes> {
  static constexpr bool kAffine = true;
  static constexpr size_t kBias = kCodes + 2 * kPanelRows, kUnitBytes = kBias + 2 * kPanelRows;
  static constexpr bool kAffineRecord = true;
  static size_t sums_at(int64_t cols) { return x32_bytes<true>(cols); }
  static void pack_scale(const std::byte* wb, std::byte* unit, int i) {
    std::memcpy(unit + kCodes + 2 * i, wb, 2);
    std::memcpy(unit + kBias + 2 * i, wb + 2, 2);
  }
#if SPECULA_WIDE
  static __m512 biases(const std::byte* unit) {
    return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(unit + kBias)));
  }
#else
  static __m256 biases(const std::byte* unit, int h) {
    return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(unit + kBias + 16 * h)));
  }
#endif
};

struct PackedQ8_0 : F16Scales<512> {
  using Unpack = Q8_0Unpack;
  static void pack(const std::byte* row, int64_t u, std::byte* out, int i) {
    const std::byte* wb = Unpack::at(row, u);
    alignas(32) uint8_t c[32];
    _mm256_store_si256(reinterpret_cast<__m256i*>(c), Unpack::panel_codes(wb));
    for (int g = 0; g < 8; ++g) std::memcpy(out + 64 * g + 4 * i, c + 4 * g, 4);
    pack_scale(wb, out, i);
  }
#if SPECULA_WIDE
  static void unpack(const std::byte* blk, int, __m512i* wv) {
    for (int g = 0; g < 8; ++g) wv[g] = _mm512_loadu_si512(blk + 64 * g);
  }
#else
  static void unpack(const std::byte* blk, int, int h, __m256i* wv) {
    for (int g = 0; g < 8; ++g) wv[g] = loadu256(blk + 64 * g + 32 * h);
  }
#endif
};

// Four lines of nibbles at p (values 4g.. low, 16 + 4g.. high) to the 8 code vectors, through `look`
// (the identity for Q4_0, IQ4's table).
#if SPECULA_WIDE
template <class Look>
inline void unpack_nibbles(const std::byte* p, __m512i* wv, Look look) {
  const __m512i m = _mm512_set1_epi8(0x0f);
  for (int g = 0; g < 4; ++g) {
    const __m512i z = _mm512_loadu_si512(p + 64 * g);
    wv[g] = look(_mm512_and_si512(z, m));
    wv[g + 4] = look(_mm512_and_si512(_mm512_srli_epi16(z, 4), m));
  }
}
#else
template <class Look>
inline void unpack_nibbles(const std::byte* p, int h, __m256i* wv, Look look) {
  const __m256i m = _mm256_set1_epi8(0x0f);
  for (int g = 0; g < 4; ++g) {
    const __m256i z = loadu256(p + 64 * g + 32 * h);
    wv[g] = look(_mm256_and_si256(z, m));
    wv[g + 4] = look(_mm256_and_si256(_mm256_srli_epi16(z, 4), m));
  }
}
#endif

// IQ4's table as the packed panels' unpacking looks codes up in it: AVX-512 the values + 128 (unsigned, as
// IQ4Codes::codes gives them on this set), AVX2 the signed values (|w| against sign(x, w)).
#if SPECULA_WIDE
inline __m512i iq4_panel_table() {
  return _mm512_broadcast_i32x4(_mm_xor_si128(IQ4Codes<0>::table(), _mm_set1_epi8(-128)));
}
#else
inline __m256i iq4_panel_table() { return _mm256_broadcastsi128_si256(IQ4Codes<0>::table()); }
#endif

// Q4_0, Q4_1 and IQ4_NL: the file's 16 bytes of nibbles a block (values 4g.. low, 16 + 4g.. high), codes
// as they are (Q4_0, Q4_1) or through IQ4's table (IQ4_NL).
template <class Scales, class U>
struct PackedNibbles : Scales {
  using Unpack = U;
  static constexpr bool kTable = std::is_same_v<U, IQ4_NLUnpack>;
  static void pack(const std::byte* row, int64_t u, std::byte* out, int i) {
    const std::byte* wb = Unpack::at(row, u);
    for (int g = 0; g < 4; ++g) std::memcpy(out + 64 * g + 4 * i, wb + Unpack::kCodesAt + 4 * g, 4);
    Scales::pack_scale(wb, out, i);
  }
#if SPECULA_WIDE
  static void unpack(const std::byte* blk, int, __m512i* wv) {
    if constexpr (kTable) {
      const __m512i table = iq4_panel_table();
      unpack_nibbles(blk, wv, [&](__m512i v) { return _mm512_shuffle_epi8(table, v); });
    } else {
      unpack_nibbles(blk, wv, [](__m512i v) { return v; });
    }
  }
#else
  static void unpack(const std::byte* blk, int, int h, __m256i* wv) {
    if constexpr (kTable) {
      const __m256i table = iq4_panel_table();
      unpack_nibbles(blk, h, wv, [&](__m256i v) { return _mm256_shuffle_epi8(table, v); });
    } else {
      unpack_nibbles(blk, h, wv, [](__m256i v) { return v; });
    }
  }
#endif
};
using PackedQ4_0 = PackedNibbles<F16Scales<256>, Q4_0Unpack>;
using PackedQ4_1 = PackedNibbles<F16Affine<256>, Q4_1Unpack>;
using PackedIQ4_NL = PackedNibbles<F16Scales<256>, IQ4_NLUnpack>;

// Q5_0 (Q5_1): Q4_0's nibbles, then the fifth bits rearranged so that one rotation (AVX2: one 16-bit
// shift) puts each where its code wants it: [16 rows][4 bytes], bit 2g + H of byte b the fifth bit of
// value 16H + 4g + b (the file's 4 qh bytes a row, so the panel is the file's size), then the f16 scales
// (Q5_1: and the f16 m, F16Affine).
template <class Scales, class U>
struct PackedFiveBits : Scales {
  using Unpack = U;
  static void pack(const std::byte* row, int64_t u, std::byte* out, int i) {
    const std::byte* wb = Unpack::at(row, u);  // f16 d (, f16 m), u32 qh (bit k: value k), 16 bytes of nibbles
    for (int g = 0; g < 4; ++g) std::memcpy(out + 64 * g + 4 * i, wb + Unpack::kCodesAt + 4 + 4 * g, 4);
    uint32_t qh;
    std::memcpy(&qh, wb + Unpack::kCodesAt, 4);
    for (int b = 0; b < 4; ++b) {
      unsigned v = 0;
      for (int g = 0; g < 4; ++g)
        for (int h = 0; h < 2; ++h) v |= ((qh >> (16 * h + 4 * g + b)) & 1u) << (2 * g + h);
      out[256 + 4 * i + b] = static_cast<std::byte>(v);
    }
    Scales::pack_scale(wb, out, i);
  }
#if SPECULA_WIDE
  static void unpack(const std::byte* blk, int, __m512i* wv) {
    const __m512i m4 = _mm512_set1_epi8(0x0f), m5 = _mm512_set1_epi8(0x10);
    const __m512i fb = _mm512_loadu_si512(blk + 256);
    // Bit 2g + h of each byte to bit 4: a rotation of its dword that keeps it inside its byte.
    auto fifth = [&](int bit) { return _mm512_and_si512(_mm512_rolv_epi32(fb, _mm512_set1_epi32((4 - bit) & 31)), m5); };
    for (int g = 0; g < 4; ++g) {
      const __m512i z = _mm512_loadu_si512(blk + 64 * g);
      wv[g] = _mm512_ternarylogic_epi32(z, fifth(2 * g), m4, 0xEC);  // (z & 15) | fifth
      wv[g + 4] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(z, 4), fifth(2 * g + 1), m4, 0xEC);
    }
  }
#else
  static void unpack(const std::byte* blk, int, int h, __m256i* wv) {
    const __m256i m4 = _mm256_set1_epi8(0x0f), m5 = _mm256_set1_epi8(0x10);
    const __m256i fb = loadu256(blk + 256 + 32 * h);
    // Bit 2g + h of each byte to bit 4: 16-bit shifts of at most 4 keep it inside its byte.
    auto fifth = [&](int bit) {
      const __m256i v = bit < 4 ? _mm256_sll_epi16(fb, _mm_cvtsi32_si128(4 - bit)) : _mm256_srl_epi16(fb, _mm_cvtsi32_si128(bit - 4));
      return _mm256_and_si256(v, m5);
    };
    for (int g = 0; g < 4; ++g) {
      const __m256i z = loadu256(blk + 64 * g + 32 * h);
      wv[g] = _mm256_or_si256(_mm256_and_si256(z, m4), fifth(2 * g));
      wv[g + 4] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(z, 4), m4), fifth(2 * g + 1));
    }
  }
#endif
};
using PackedQ5_0 = PackedFiveBits<F16Scales<320>, Q5_0Unpack>;
using PackedQ5_1 = PackedFiveBits<F16Affine<320>, Q5_1Unpack>;

struct PackedIQ4_XS {
  using Unpack = IQ4_XSUnpack;
  static constexpr int kBlocks = 8;
  // Streamed at 1-2 rows at half the bandwidth without the tile's own prefetches (AVX-512, Zen 5 VM, 2
  // threads, 65536 x 1536, 1 row: 1.15-1.36 -> 0.61-0.66 ms; 2 rows: 1.42-1.68 -> 0.64-0.71).
  static constexpr bool kPrefetchFewRows = true;
  static constexpr size_t kScale = 2048, kD = 2176, kUnitBytes = 2208;
  static void pack(const std::byte* row, int64_t u, std::byte* out, int i) {
    const std::byte* sb = row + 136 * u;
    for (int j = 0; j < 8; ++j) {
      for (int g = 0; g < 4; ++g) std::memcpy(out + 256 * j + 64 * g + 4 * i, sb + 8 + 16 * j + 4 * g, 4);
      out[kScale + 16 * j + i] = static_cast<std::byte>(static_cast<int8_t>(Unpack::scale_code(sb, j)));
    }
    std::memcpy(out + kD + 2 * i, sb, 2);
  }
#if SPECULA_WIDE
  static void unpack(const std::byte* unit, int j, __m512i* wv) {
    const __m512i table = iq4_panel_table();
    unpack_nibbles(unit + 256 * j, wv, [&](__m512i v) { return _mm512_shuffle_epi8(table, v); });
  }
  static __m512 scales(const std::byte* unit, int j) {
    const __m512 d = _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(unit + kD)));
    const __m128i ls = _mm_loadu_si128(reinterpret_cast<const __m128i*>(unit + kScale + 16 * j));
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(ls)));
  }
#else
  static void unpack(const std::byte* unit, int j, int h, __m256i* wv) {
    const __m256i table = iq4_panel_table();
    unpack_nibbles(unit + 256 * j, h, wv, [&](__m256i v) { return _mm256_shuffle_epi8(table, v); });
  }
  static __m256 scales(const std::byte* unit, int j, int h) {
    const __m256 d = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(unit + kD + 16 * h)));
    const __m128i ls = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(unit + kScale + 16 * j + 8 * h));
    return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(ls)));
  }
#endif
};

// MLX affine 4 bits (w = scale q + bias, q = 0..15, groups of 32 / 64 / 128 values; seed 003's format):
// a unit is a group, its blocks' nibbles laid out as Q4_0's (the file's order, byte m = values 2m and
// 2m + 1, rearranged when packed), then the 16 rows' scales and biases in the file's 16-bit type: the
// file's size. The codes dot the 8-bit activations exactly, the scale meets that sum as Q4_0's does, and
// the bias the sum of the group's rounded activations (quantize_mlx4): MLX's own form,
// scale * sum(q x) + bias * sum(x).
template <int kGroupBlocks, bool kBf16>
struct PackedMlx4 {
  using Unpack = Q4_1Unpack;  // unsigned codes, no offset
  static constexpr int kBlocks = kGroupBlocks;
  static constexpr bool kAffine = true;
  // quantize_mlx4: the plain record, then the block sums.
  static size_t sums_at(int64_t cols) { return x32_bytes<false>(cols); }
  static constexpr size_t kScale = 256 * kBlocks, kBias = kScale + 2 * kPanelRows, kUnitBytes = kBias + 2 * kPanelRows;
  // Group u of a row (codes: the row's u32 words; scale, bias: the row's) as row i of `unit`.
  static void pack(const std::byte* codes, const std::byte* scale, const std::byte* bias, int64_t u, std::byte* unit,
                   int i) {
    const auto* c = reinterpret_cast<const uint8_t*>(codes);
    auto code = [&](int64_t v) { return (c[v / 2] >> (4 * (v % 2))) & 15; };
    for (int j = 0; j < kBlocks; ++j) {
      const int64_t v0 = 32 * (u * kBlocks + j);
      for (int g = 0; g < 4; ++g)
        for (int b = 0; b < 4; ++b)
          unit[256 * j + 64 * g + 4 * i + b] =
              static_cast<std::byte>(code(v0 + 4 * g + b) | code(v0 + 16 + 4 * g + b) << 4);
    }
    std::memcpy(unit + kScale + 2 * i, scale + 2 * u, 2);
    std::memcpy(unit + kBias + 2 * i, bias + 2 * u, 2);
  }
#if SPECULA_WIDE
  static __m512 load16(const std::byte* p) {
    const __m256i h = _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
    return kBf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
  }
  static void unpack(const std::byte* unit, int j, __m512i* wv) {
    unpack_nibbles(unit + 256 * j, wv, [](__m512i v) { return v; });
  }
  static __m512 scales(const std::byte* unit, int) { return load16(unit + kScale); }
  static __m512 biases(const std::byte* unit) { return load16(unit + kBias); }
#else
  static __m256 load8(const std::byte* p) {
    const __m128i h = _mm_load_si128(reinterpret_cast<const __m128i*>(p));
    return kBf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)) : _mm256_cvtph_ps(h);
  }
  static void unpack(const std::byte* unit, int j, int h, __m256i* wv) {
    unpack_nibbles(unit + 256 * j, h, wv, [](__m256i v) { return v; });
  }
  static __m256 scales(const std::byte* unit, int, int h) { return load8(unit + kScale + 16 * h); }
  static __m256 biases(const std::byte* unit, int h) { return load8(unit + kBias + 16 * h); }
#endif
};

// The activation record of the packed MLX panels: the 8-bit record without offset, then each block's sum
// of its rounded activations (scale * the codes' sum): the bias meets the activations the codes meet, so
// their rounding moves the product by sum(w e), not sum(scale q e) (which the exact sum of x would leave:
// codes 0..15 are all positive, and the error was 2.5x Q4_0's). Q4_1 and Q5_1 (packed or not) take the
// affine record, which their unpacked tiles read, with the same block sums after it.
template <bool kAffine>
size_t x32_sums_bytes(int64_t cols) {
  return x32_bytes<kAffine>(cols) + align64(4 * static_cast<size_t>(cols / 32));
}
template <bool kAffine>
void quantize_x32_sums(const float* x, int64_t cols, std::byte* rec) {
  quantize_x32<0, kAffine>(x, cols, rec);
  const X32Layout lay(cols, kAffine);
  const auto* q = reinterpret_cast<const int8_t*>(rec);
  const auto* scale = reinterpret_cast<const float*>(rec + lay.scale());
  auto* sums = reinterpret_cast<float*>(rec + lay.bytes());
  for (int64_t b = 0; b < lay.nb; ++b) {
    int32_t s = 0;
    for (int g = 0; g < 8; ++g)
      for (int k = 0; k < 4; ++k) s += q[X32Layout::q(b, g) + k];
    sums[b] = scale[X32Layout::d(b)] * static_cast<float>(s);
  }
}
size_t mlx4_record_bytes(int64_t cols) { return x32_sums_bytes<false>(cols); }
void quantize_mlx4(const float* x, int64_t cols, std::byte* rec) { quantize_x32_sums<false>(x, cols, rec); }

template <class P>
size_t packed_panel_bytes(int64_t cols) {
  return P::kUnitBytes * static_cast<size_t>(cols / (32 * P::kBlocks));
}

// Weight rows [0, nw) (row_bytes apart) into ceil(nw / 16) panels at out (zeroed by the caller).
template <class P>
void pack_weights(const std::byte* w, size_t wrb, int64_t nw, int64_t cols, std::byte* out) {
  const int64_t units = cols / (32 * P::kBlocks);
  for (int64_t o = 0; o < nw; o += kPanelRows) {
    const int rows = static_cast<int>(nw - o < kPanelRows ? nw - o : kPanelRows);
    std::byte* panel = out + static_cast<size_t>(o / kPanelRows) * packed_panel_bytes<P>(cols);
    for (int64_t u = 0; u < units; ++u)
      for (int i = 0; i < rows; ++i) P::pack(w + (o + i) * wrb, u, panel + static_cast<size_t>(u) * P::kUnitBytes, i);
  }
}

// RX activation rows x one panel (`valid` of its rows are real) over all blocks.
template <class P, int RX>
[[gnu::always_inline]] inline void packed_tile(const std::byte* panel, int valid, const std::byte* x, size_t xs,
                                               int64_t cols, float* y, int64_t ldy) {
  const int64_t nb = cols / 32;
  // Each block prefetches its share of a unit's bytes, a unit at a time, 4 KB ahead. AVX-512: from 3 rows
  // on, where the tile is compute-bound and the hardware prefetcher alone left it waiting (packed Q4_0,
  // 6144 x 1536, 2 threads, 9 rows: 0.19-0.27 -> 0.18-0.20 ms); at 1-2 rows, which stream at the bandwidth
  // limit, only where a type asks for it (P::kPrefetchFewRows): others measured no faster, at times slower.
  // AVX2 (two passes over a panel, half its rows each): at every row count (the AVX2 set on the Zen 5 VM,
  // 2 threads, 1 row: Q4_0 0.14-0.15 -> 0.105 ms, IQ4_XS 0.22-0.23 -> 0.14; 2 rows: Q4_0 0.19-0.20 ->
  // 0.145-0.155).
  constexpr size_t kShare = P::kUnitBytes / P::kBlocks;
  constexpr bool kPrefetchAhead = !kWide || RX >= 3 || requires { requires P::kPrefetchFewRows; };
  constexpr ptrdiff_t kAhead = 4096;
  // Affine units (MLX, Q4_1, Q5_1): each unit's bias meets the sum of its rounded activations
  // (quantize_mlx4, quantize_x32_sums).
  constexpr bool kAffine = requires { P::kAffine; };
  constexpr bool kAffineRecord = requires { requires P::kAffineRecord; };
  const auto& [xq, xd, xi] = PanelRecords<RX>(x, xs, cols, kAffineRecord);
  const float* xsum[RX];
  if constexpr (kAffine)
    for (int r = 0; r < RX; ++r) xsum[r] = at<float>(x, r * xs + P::sums_at(cols));
  auto unit_sum = [&](int r, int64_t b0) {  // the unit of blocks b0.., in block order
    float s = xsum[r][b0];
    for (int k = 1; k < P::kBlocks; ++k) s += xsum[r][b0 + k];
    return s;
  };
#if SPECULA_WIDE
  __m512 acc[RX];
  for (int r = 0; r < RX; ++r) acc[r] = _mm512_setzero_ps();
  for (int64_t b0 = 0; b0 < nb; b0 += P::kBlocks) {
    const std::byte* unit = panel + static_cast<size_t>(b0 / P::kBlocks) * P::kUnitBytes;
    for (int j = 0; j < P::kBlocks; ++j) {
      const int64_t b = b0 + j;
      if constexpr (kPrefetchAhead) prefetch_ahead(unit + kShare * j, kShare, kAhead);
      __m512i wv[8];
      P::unpack(unit, j, wv);
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
      const __m512 dw = P::scales(unit, j);
      for (int r = 0; r < RX; ++r) {
        const __m512i s = kChains == 2 ? _mm512_add_epi32(sum[0][r], sum[kChains - 1][r]) : sum[0][r];
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(xd[r][X32Layout::d(b)])), acc[r]);
      }
    }
    if constexpr (kAffine) {
      const __m512 bias = P::biases(unit);
      for (int r = 0; r < RX; ++r) acc[r] = _mm512_fmadd_ps(bias, _mm512_set1_ps(unit_sum(r, b0)), acc[r]);
    }
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << valid) - 1);
  for (int r = 0; r < RX; ++r) _mm512_mask_storeu_ps(y + r * ldy, mask, acc[r]);
#else
  const __m256i ones = _mm256_set1_epi16(1);
  for (int h = 0; h < 2 && valid > 8 * h; ++h) {
    __m256 acc[RX];
    for (int r = 0; r < RX; ++r) acc[r] = _mm256_setzero_ps();
    for (int64_t b0 = 0; b0 < nb; b0 += P::kBlocks) {
      const std::byte* unit = panel + static_cast<size_t>(b0 / P::kBlocks) * P::kUnitBytes;
      for (int j = 0; j < P::kBlocks; ++j) {
        const int64_t b = b0 + j;
        if constexpr (kPrefetchAhead) prefetch_ahead(unit + kShare * j, kShare, kAhead);
        __m256i wv[8];
        P::unpack(unit, j, h, wv);
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
        const __m256 dw = P::scales(unit, j, h);
        for (int r = 0; r < RX; ++r)
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum[r]), _mm256_mul_ps(dw, _mm256_set1_ps(xd[r][X32Layout::d(b)])), acc[r]);
      }
      if constexpr (kAffine) {
        const __m256 bias = P::biases(unit, h);
        for (int r = 0; r < RX; ++r) acc[r] = _mm256_fmadd_ps(bias, _mm256_set1_ps(unit_sum(r, b0)), acc[r]);
      }
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
  // AVX-512: 8 unpacked codes, 9 sums and 9 accumulators in 32 registers: a verification of 8 drafts is one
  // pass over each panel, not 4 + 5 rows that read it twice (one thread, 6144 x 1536, 9 rows: Q4_0 0.53-0.55
  // -> 0.35-0.38 ms; E2B Q4_0, `--profile`: ffn_gate 17.2-18.8 -> 13.5-14.9 ms). Q8_0, Q5_0 and IQ4_XS measured
  // no faster at 9 rows until their tiles prefetched (2 threads, 9 rows, Q8_0 0.24-0.25 -> 0.21 ms, IQ4_XS
  // 0.20-0.21 -> 0.18, Q5_0 0.21-0.22 -> 0.19-0.20). MLX 4-bit's tiles are Q4_0's and a bias.
  constexpr int TX = kWide ? 9 : 2;
  for (int64_t o = 0; o < nw; o += kPanelRows) {
    const std::byte* panel = w + static_cast<size_t>(o / kPanelRows) * panel_bytes;
    const int valid = static_cast<int>(nw - o < kPanelRows ? nw - o : kPanelRows);
    over_x<TX>(nx, [&]<int RX>(int64_t r) __attribute__((always_inline)) {
      packed_tile<P, RX>(panel, valid, x + r * xs, xs, cols, y + r * ldy + o, ldy);
    });
  }
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
  using Unpack = typename Packed::Unpack;
  QuantKernel k;
  if constexpr (Unpack::kAffine) {  // no prefill panels: prompt chunks go to matmul_gemm
    k = x32<Unpack>(nullptr);
    k.quantize = &quantize_x32_sums<true>;
    k.record_bytes = &x32_sums_bytes<true>;
  } else {
    k = x32<Unpack>(&rows_panel<Unpack>);
  }
  k.panel_bytes = &packed_panel_bytes<Packed>;
  k.pack = &pack_weights<Packed>;
  k.packed = &packed_rows<Packed>;
  return k;
}

// Packed MLX affine 4 bits: f16 or bf16 scales (f32 ones keep the float tiles), by group size.
template <class F>
void with_mlx4(const AffineMatrix& m, F&& f) {
  const bool bf16 = m.scale_type == AffineMatrix::Scale::bf16;
  switch (m.group_size) {
    case 32: return bf16 ? f(PackedMlx4<1, true>{}) : f(PackedMlx4<1, false>{});
    case 64: return bf16 ? f(PackedMlx4<2, true>{}) : f(PackedMlx4<2, false>{});
    default: return bf16 ? f(PackedMlx4<4, true>{}) : f(PackedMlx4<4, false>{});
  }
}
size_t mlx4_panel_bytes(int64_t cols, int group_size) {
  return (256 * static_cast<size_t>(group_size / 32) + 4 * kPanelRows) * static_cast<size_t>(cols / group_size);
}
// Weight rows [0, nw) of m into ceil(nw / 16) panels at out (zeroed by the caller).
void pack_mlx4(const AffineMatrix& m, int64_t nw, int64_t cols, std::byte* out) {
  with_mlx4(m, [&]<class P>(P) {
    const int64_t units = cols / (32 * P::kBlocks);
    for (int64_t o = 0; o < nw; o += kPanelRows) {
      std::byte* panel = out + static_cast<size_t>(o / kPanelRows) * packed_panel_bytes<P>(cols);
      for (int64_t u = 0; u < units; ++u)
        for (int i = 0; i < kPanelRows && o + i < nw; ++i) {
          const size_t row = static_cast<size_t>(o + i);
          P::pack(m.codes + row * m.code_bytes, m.scales + row * m.scale_bytes, m.biases + row * m.scale_bytes, u,
                  panel + static_cast<size_t>(u) * P::kUnitBytes, i);
        }
    }
  });
}
// m.codes: the panels of weight rows [0, nw), m.code_bytes apart.
void packed_mlx4(const AffineMatrix& m, int64_t nw, const std::byte* x, size_t xs, int64_t nx, int64_t cols, float* y,
                 int64_t ldy) {
  with_mlx4(m, [&]<class P>(P) { packed_rows<P>(m.codes, m.code_bytes, nw, x, xs, nx, cols, y, ldy); });
}

}  // namespace

void add_x32_kernels(KernelSet& set) {
  set.q8_0 = x32_packed<PackedQ8_0>();
  set.q4_0 = x32_packed<PackedQ4_0>();
  set.q4_1 = x32_packed<PackedQ4_1>();
  set.q5_0 = x32_packed<PackedQ5_0>();
  set.q5_1 = x32_packed<PackedQ5_1>();
  set.iq4_nl = x32_packed<PackedIQ4_NL>();
  set.iq4_xs = x32_packed<PackedIQ4_XS>();
  set.mlx4.quantize = &quantize_mlx4;
  set.mlx4.quantized_bytes = &mlx4_record_bytes;
  set.mlx4.panel_bytes = &mlx4_panel_bytes;
  set.mlx4.pack = &pack_mlx4;
  set.mlx4.packed = &packed_mlx4;
}

}  // namespace specula::cpu::SPECULA_ISA_NS
