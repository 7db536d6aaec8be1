// Matrix kernels for float weights (F32, F16, BF16) and MLX affine 4 / 8 bits, against float activations.
// Compiled once per instruction set (qkernels.hpp, isa.hpp).
#include "qkernels.hpp"

namespace specula::cpu::SPECULA_ISA_NS {
namespace {

// ---- F32 / F16 / BF16 weights against F32 activations ---------------------------------------------------
// Two 8-lane accumulators take alternate groups of 8 values (AVX-512: one register's halves); the last
// cols % 16 values are added one by one after the reduction. (Float and its loads: qkernels.hpp.)
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
// MLX's own numerics: each weight is dequantized, w = scale q + bias (one fma, per group of 32 / 64 / 128
// values), and meets the float activation in a float fma. 4 bits hold value 2m in the low nibble of byte
// m and 2m + 1 in the high one, so the activation record keeps each block of 32 values' even values
// first, then its odd ones, and lane j of a block pairs byte j's two codes with them. AVX-512 looks the
// 4-bit weights up in a 16-float table of the group's values (vpermps takes an index's low 4 bits);
// AVX2 computes the same fma per value. Even and odd values go to separate accumulators (two chains),
// summed at the end in the same order on both sets: the same bits, and the same whatever the tile.
// Record: x: float[cols] (4 bits: reordered within each block of 32)
size_t xmlx_bytes(int64_t cols) { return align64(4 * static_cast<size_t>(cols)); }

template <int kBits>
void prepare_xmlx(const float* x, int64_t cols, std::byte* rec) {
  auto* xr = reinterpret_cast<float*>(rec);
  for (int64_t b = 0; b < cols / 32; ++b)
    for (int m = 0; m < 16; ++m) {
      xr[32 * b + m] = kBits == 4 ? x[32 * b + 2 * m] : x[32 * b + m];
      xr[32 * b + 16 + m] = kBits == 4 ? x[32 * b + 2 * m + 1] : x[32 * b + 16 + m];
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

// The dequantized weights of one block: a = the values lane j pairs with the record's first 16, b = the
// second 16.
#if SPECULA_WIDE
struct MlxGroup {
  __m512 scale, bias, table;  // table[k] = scale k + bias (4 bits)
  void set(float s, float bi, int bits) {
    scale = _mm512_set1_ps(s);
    bias = _mm512_set1_ps(bi);
    if (bits == 4)
      table = _mm512_fmadd_ps(scale, _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), bias);
  }
};
template <int kBits>
inline void mlx_weights(const std::byte* block, const MlxGroup& g, __m512& a, __m512& b) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block));
  if constexpr (kBits == 4) {
    const __m512i c = _mm512_cvtepu8_epi32(lo);
    a = _mm512_permutexvar_ps(c, g.table);
    b = _mm512_permutexvar_ps(_mm512_srli_epi32(c, 4), g.table);
  } else {
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 16));
    a = _mm512_fmadd_ps(g.scale, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), g.bias);
    b = _mm512_fmadd_ps(g.scale, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)), g.bias);
  }
}
#else
struct MlxGroup {
  __m256 scale, bias;
  void set(float s, float bi, int) {
    scale = _mm256_set1_ps(s);
    bias = _mm256_set1_ps(bi);
  }
};
// Half h (lanes 8h..8h+7) of a block's a and b.
template <int kBits>
inline void mlx_weights(const std::byte* block, int h, const MlxGroup& g, __m256& a, __m256& b) {
  const __m128i lo = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + 8 * h));
  __m256i ca = _mm256_cvtepu8_epi32(lo), cb;
  if constexpr (kBits == 4) {
    cb = _mm256_srli_epi32(ca, 4);
    ca = _mm256_and_si256(ca, _mm256_set1_epi32(15));
  } else {
    cb = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + 16 + 8 * h)));
  }
  a = _mm256_fmadd_ps(g.scale, _mm256_cvtepi32_ps(ca), g.bias);
  b = _mm256_fmadd_ps(g.scale, _mm256_cvtepi32_ps(cb), g.bias);
}
#endif

// RW weight rows x RX activation rows; each (weight row, activation row) pair runs the same operations
// whatever the tile, so the tiling never changes a result.
template <int kBits, int kPer, int RW, int RX>
void tile_mlx(const AffineMatrix& m, int64_t o, const std::byte* x, size_t xs, int64_t cols, float* y, int64_t ldy) {
  constexpr int64_t kBytes = 4 * kBits;  // a block's codes
  const int64_t nb = cols / 32;  // blocks of 32 values, kPer to a group
  const std::byte *row[RW], *sc[RW], *bi[RW];
  for (int w = 0; w < RW; ++w) {
    row[w] = m.codes + static_cast<size_t>(o + w) * m.code_bytes;
    sc[w] = m.scales + static_cast<size_t>(o + w) * m.scale_bytes;
    bi[w] = m.biases + static_cast<size_t>(o + w) * m.scale_bytes;
  }
  const float* xr[RX];
  for (int r = 0; r < RX; ++r) xr[r] = at<float>(x, r * xs);
  MlxGroup g[RW];
#if SPECULA_WIDE
  __m512 acc[RW][RX][2];
  for (int w = 0; w < RW; ++w)
    for (int r = 0; r < RX; ++r) acc[w][r][0] = acc[w][r][1] = _mm512_setzero_ps();
#else
  __m256 acc[RW][RX][2][2];  // [..][even / odd][half]
  for (int w = 0; w < RW; ++w)
    for (int r = 0; r < RX; ++r)
      for (int e = 0; e < 2; ++e) acc[w][r][e][0] = acc[w][r][e][1] = _mm256_setzero_ps();
#endif
  // Groups outside, their kPer blocks unrolled inside (a division per block, or a loop of one to four
  // blocks, cost more than the block).
  for (int64_t group = 0; group < nb / kPer; ++group) {
    for (int w = 0; w < RW; ++w) g[w].set(mlx_scale(m, sc[w], group), mlx_scale(m, bi[w], group), kBits);
    for (int64_t b = group * kPer; b < (group + 1) * kPer; ++b) {
      if (b % (64 / kBytes) == 0)  // one prefetch per cache line of codes
        for (int w = 0; w < RW; ++w) prefetch_ahead(row[w] + kBytes * b, 64);
#if SPECULA_WIDE
      __m512 wa[RW], wb[RW];
      for (int w = 0; w < RW; ++w) mlx_weights<kBits>(row[w] + kBytes * b, g[w], wa[w], wb[w]);
      for (int r = 0; r < RX; ++r) {  // each activation load serves RW weight rows
        __m512 xa = _mm512_loadu_ps(xr[r] + 32 * b), xb = _mm512_loadu_ps(xr[r] + 32 * b + 16);
        __asm__("" : "+v"(xa), "+v"(xb));  // one load each, not one per weight row folded into the fmas
        for (int w = 0; w < RW; ++w) {
          acc[w][r][0] = _mm512_fmadd_ps(wa[w], xa, acc[w][r][0]);
          acc[w][r][1] = _mm512_fmadd_ps(wb[w], xb, acc[w][r][1]);
        }
      }
#else
      for (int w = 0; w < RW; ++w)
        for (int h = 0; h < 2; ++h) {
          __m256 wa, wb;
          mlx_weights<kBits>(row[w] + kBytes * b, h, g[w], wa, wb);
          for (int r = 0; r < RX; ++r) {
            const float* xb = xr[r] + 32 * b + 8 * h;
            acc[w][r][0][h] = _mm256_fmadd_ps(wa, _mm256_loadu_ps(xb), acc[w][r][0][h]);
            acc[w][r][1][h] = _mm256_fmadd_ps(wb, _mm256_loadu_ps(xb + 16), acc[w][r][1][h]);
          }
        }
#endif
    }
  }
  for (int w = 0; w < RW; ++w)
    for (int r = 0; r < RX; ++r) {
#if SPECULA_WIDE
      y[r * ldy + w] = hsum8(fold(_mm512_add_ps(acc[w][r][0], acc[w][r][1])));
#else
      y[r * ldy + w] = hsum8(_mm256_add_ps(_mm256_add_ps(acc[w][r][0][0], acc[w][r][1][0]),
                                           _mm256_add_ps(acc[w][r][0][1], acc[w][r][1][1])));
#endif
    }
}

template <int kBits, int kPer>
void rows_mlx_per(const AffineMatrix& m, int64_t nw, const std::byte* x, size_t xs, int64_t nx, int64_t cols, float* y,
                  int64_t ldy) {
  // Decode: several weight rows, for independent chains (unlike rows() for the other types, 4 rows beat 1
  // on a mapped file too: 6144 x 1536 and 1536 x 6144, 2 threads, 0.16-0.23 against 0.22-0.27 ms).
  // Several activation rows: each block's weights are dequantized once for TX of them and each activation
  // load serves TW weight rows, as far as the registers hold them (2 x TW x TX accumulators; loads from
  // L1, not the fmas, bounded the 2 x 4 tiles tried first).
  const auto over_w = [&]<int TW, int TX>() {
    const auto pass = [&]<int RW>(int64_t o) {
      over_x<TX>(nx, [&]<int RX>(int64_t r) { tile_mlx<kBits, kPer, RW, RX>(m, o, x + r * xs, xs, cols, y + r * ldy + o, ldy); });
    };
    int64_t o = 0;
    for (; o + TW <= nw; o += TW) pass.template operator()<TW>(o);
    for (; o < nw; ++o) pass.template operator()<1>(o);
  };
  if (nx == 1) return over_w.template operator()<kWide ? 4 : 2, 1>();
  over_w.template operator()<kWide ? 4 : 1, kWide ? 2 : 3>();
}

// MLX's group sizes are 32, 64 and 128 (mlx_params_valid): one, two or four blocks.
template <int kBits>
void rows_mlx(const AffineMatrix& m, int64_t nw, const std::byte* x, size_t xs, int64_t nx, int64_t cols, float* y,
              int64_t ldy) {
  switch (m.group_size) {
    case 32: return rows_mlx_per<kBits, 1>(m, nw, x, xs, nx, cols, y, ldy);
    case 64: return rows_mlx_per<kBits, 2>(m, nw, x, xs, nx, cols, y, ldy);
    default: return rows_mlx_per<kBits, 4>(m, nw, x, xs, nx, cols, y, ldy);
  }
}
}  // namespace

void add_float_kernels(KernelSet& set) {
  // Tiles of W weight rows x X activation rows. AVX-512: 4 x 5 (20 accumulators): a 5-row verification is
  // one tile, not 2 + 3, each of which read the weights again and all activation rows (bench_matvec, 2
  // threads, F32 8960 x 1536, E2B's per-layer projection: 5 rows 1.96-2.06 -> 1.17-1.24 ms, 9 rows
  // 2.77-2.92 -> 2.01; BF16 9 rows 1.41-1.44 -> 1.06-1.09; 1 and 2 rows unchanged).
  constexpr int W = kWide ? 4 : 2, X = kWide ? 5 : 2;
  set.f32 = &rows<FloatTiles<Float::f32>::Tile, W, X>;
  set.f16 = &rows<FloatTiles<Float::f16>::Tile, W, X>;
  set.bf16 = &rows<FloatTiles<Float::bf16>::Tile, W, X>;
  set.mlx4.prepare = &prepare_xmlx<4>;  // its packed panels: qkernels_x32.cpp
  set.mlx4.record_bytes = &xmlx_bytes;
  set.mlx4.rows = &rows_mlx<4>;
  set.mlx8.prepare = &prepare_xmlx<8>;
  set.mlx8.record_bytes = &xmlx_bytes;
  set.mlx8.rows = &rows_mlx<8>;
}

}  // namespace specula::cpu::SPECULA_ISA_NS
