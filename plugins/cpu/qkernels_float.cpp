// Matrix kernels for float weights (F32, F16, BF16) and MLX affine 4 / 8 bits, against float activations.
// Compiled once per instruction set (qkernels.hpp, isa.hpp).
#include "qkernels.hpp"

namespace specula::cpu::SPECULA_ISA_NS {
namespace {

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
}  // namespace

void add_float_kernels(KernelSet& set) {
  constexpr int W = kWide ? 4 : 2, X = kWide ? 4 : 2;  // tiles of W weight rows x X activation rows
  set.f32 = &rows<FloatTiles<Float::f32>::Tile, W, X>;
  set.f16 = &rows<FloatTiles<Float::f16>::Tile, W, X>;
  set.bf16 = &rows<FloatTiles<Float::bf16>::Tile, W, X>;
  set.mlx4 = {&prepare_xmlx<4>, &xmlx_bytes, &rows_mlx<4>};
  set.mlx8 = {&prepare_xmlx<8>, &xmlx_bytes, &rows_mlx<8>};
}

}  // namespace specula::cpu::SPECULA_ISA_NS
