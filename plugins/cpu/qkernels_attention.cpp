// Attention's inner kernel (kernels.cpp's attention() splits the work and calls it): G query heads that
// share one KV head, for R query rows, over the union of the rows' visible cache slots. Compiled once per
// instruction set like the matrix kernels; the sets give the same bits (below).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "hsum.hpp"
#include "qkernels.hpp"

namespace specula::cpu::SPECULA_ISA_NS {
namespace {

// The output pass's vector steps for either width.
struct Ymm {
  using V = __m256;
  static constexpr int W = 8;
};
inline __m256 vzero(Ymm) { return _mm256_setzero_ps(); }
template <Float T>
inline __m256 vload(Ymm, const std::byte* p, int64_t i) { return load8<T>(p, i); }
inline __m256 vfmadd(float w, __m256 v, __m256 acc) { return _mm256_fmadd_ps(_mm256_set1_ps(w), v, acc); }
inline void vstore(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
#if SPECULA_WIDE
struct Zmm {
  using V = __m512;
  static constexpr int W = 16;
};
inline __m512 vzero(Zmm) { return _mm512_setzero_ps(); }
template <Float T>
inline __m512 vload(Zmm, const std::byte* p, int64_t i) { return load16<T>(p, i); }
inline __m512 vfmadd(float w, __m512 v, __m512 acc) { return _mm512_fmadd_ps(_mm512_set1_ps(w), v, acc); }
inline void vstore(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
#endif

// The scores of U cache rows k[u] against G query heads q[h] (out[u * G + h]): per pair two 8-lane sums over
// 16 values at a time (lanes 0-7 and 8-15 of one 16-lane sum with AVX-512: the same additions), then 8, then
// the tail, then the lanes summed pairwise, times the scale.
template <Float kType, int G, int U>
[[gnu::always_inline]] inline void scores(const std::byte* const* k, const float* const* q, int64_t D, float scale,
                                          float* out) {
  int64_t i = 0;
  __m256 lo[U][G], hi[U][G];
#if SPECULA_WIDE
  __m512 s[U][G];
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u)
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) s[u][h] = _mm512_setzero_ps();
  for (; i + 16 <= D; i += 16) {
    __m512 qv[G];
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) qv[h] = _mm512_loadu_ps(q[h] + i);
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) {
      const __m512 k16 = load16<kType>(k[u], i);
#pragma GCC unroll 8
      for (int h = 0; h < G; ++h) s[u][h] = _mm512_fmadd_ps(k16, qv[h], s[u][h]);
    }
  }
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u)
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) {
      lo[u][h] = _mm512_castps512_ps256(s[u][h]);
      hi[u][h] = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s[u][h]), 1));
    }
#else
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u)
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) lo[u][h] = hi[u][h] = _mm256_setzero_ps();
  for (; i + 16 <= D; i += 16) {
#pragma GCC unroll 8
    for (int u = 0; u < U; ++u) {
      const __m256 k0 = load8<kType>(k[u], i), k1 = load8<kType>(k[u], i + 8);
#pragma GCC unroll 8
      for (int h = 0; h < G; ++h) {
        lo[u][h] = _mm256_fmadd_ps(k0, _mm256_loadu_ps(q[h] + i), lo[u][h]);
        hi[u][h] = _mm256_fmadd_ps(k1, _mm256_loadu_ps(q[h] + i + 8), hi[u][h]);
      }
    }
  }
#endif
  const bool eight = i + 8 <= D;
#pragma GCC unroll 8
  for (int u = 0; u < U; ++u)
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) {
      if (eight) lo[u][h] = _mm256_fmadd_ps(load8<kType>(k[u], i), _mm256_loadu_ps(q[h] + i), lo[u][h]);
      float sum = hsum_pairs(_mm256_add_ps(lo[u][h], hi[u][h]));
      for (int64_t c = i + (eight ? 8 : 0); c < D; ++c) sum += scalar_weight<kType>(k[u], c) * q[h][c];
      out[u * G + h] = scale * sum;
    }
}

// Each cache row is loaded once for all G heads and R rows (it stays in L1 for the block's other rows);
// seen[r * n + j] says whether row r sees slot j. Each score is summed as scores() says, and the softmax and
// the output run over the row's own visible slots in order, so neither the heads and rows grouped nor the
// vector width change any bits: each row gets what it gets alone, on every set. p holds the scores as
// [row][slot][head].
template <Float kType, Float vType, int G>
void attend_heads(const AttendCache& a, int64_t R, const float* const* q, const int32_t* slots, const uint8_t* seen,
                  int64_t n, size_t k_row, size_t v_row, int64_t hk, float* p, float* const* out) {
  const int64_t D = a.D, Dv = a.Dv;
  float max[kMaxAttentionRows][G];
  for (int64_t r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) max[r][h] = -std::numeric_limits<float>::infinity();
  // U slots at a time for a row where it sees them all: U * G independent sums keep both FMA pipes busy
  // (G = 4 alone left them waiting on each sum's latency). AVX2's 16 registers hold one slot's.
  constexpr int U = !SPECULA_WIDE ? 1 : G >= 8 ? 2 : G == 4 ? 4 : 8;
  for (int64_t j0 = 0; j0 < n; j0 += U) {
    const int64_t un = std::min<int64_t>(U, n - j0);
    const std::byte* k[U];
    for (int64_t u = 0; u < un; ++u) k[u] = a.k + (static_cast<size_t>(slots[j0 + u]) * a.Hkv + hk) * k_row;
    for (int64_t r = 0; r < R; ++r) {
      const uint8_t* sr = seen + r * n + j0;
      const float* const* qr = q + r * G;
      float* pr = p + (r * n + j0) * G;
      bool all = un == U;
      for (int64_t u = 0; u < un && all; ++u) all = sr[u] != 0;
      if (all) {
        scores<kType, G, U>(k, qr, D, a.scale, pr);
      } else {
        for (int64_t u = 0; u < un; ++u)
          if (sr[u]) scores<kType, G, 1>(k + u, qr, D, a.scale, pr + u * G);
      }
      for (int64_t u = 0; u < un; ++u)
        if (sr[u])
#pragma GCC unroll 8
          for (int h = 0; h < G; ++h) max[r][h] = std::max(max[r][h], pr[u * G + h]);
    }
  }
  // The softmax: the exps 8 scores at a time with std::exp's bits (G divides 8, so lane l is head l % G; the
  // slots a row does not see get one too, never read), then each head's sum over its visible slots in order.
  for (int64_t r = 0; r < R; ++r) {
    const uint8_t* sr = seen + r * n;
    float* pr = p + r * n * G;
    alignas(32) float lane_max[8];
    for (int l = 0; l < 8; ++l) lane_max[l] = max[r][l % G];
    const __m256 m = _mm256_load_ps(lane_max);
    map8(pr, n * G, pr, [&](__m256 s) { return exp8(_mm256_sub_ps(s, m)); });
    float sum[G] = {}, inv[G];
    for (int64_t j = 0; j < n; ++j)
      if (sr[j])
#pragma GCC unroll 8
        for (int h = 0; h < G; ++h) sum[h] += pr[j * G + h];
#pragma GCC unroll 8
    for (int h = 0; h < G; ++h) inv[h] = 1.0f / sum[h];
    for (int64_t j = 0; j < n; ++j)
#pragma GCC unroll 8
      for (int h = 0; h < G; ++h) pr[j * G + h] *= inv[h];
  }
  // Each output value sums the row's visible slots in order, in a register (the order of a load-add-store
  // per slot, without the stores), W values a chunk, CC chunks a pass. A pass's values of all n slots stay
  // in L2 for the block's other rows.
  int64_t i = 0;
  auto pass = [&]<class Tag, int CC>(Tag, std::integral_constant<int, CC>) {
    using Vec = typename Tag::V;
    constexpr int W = Tag::W;
    for (int64_t r = 0; r < R; ++r) {
      const uint8_t* sr = seen + r * n;
      const float* pr = p + r * n * G;
      Vec acc[G][CC];
#pragma GCC unroll 8
      for (int h = 0; h < G; ++h)
#pragma GCC unroll 16
        for (int c = 0; c < CC; ++c) acc[h][c] = vzero(Tag{});
      for (int64_t j = 0; j < n; ++j) {
        if (!sr[j]) continue;
        const std::byte* v = a.v + (static_cast<size_t>(slots[j]) * a.Hkv + hk) * v_row;
        Vec vv[CC];
#pragma GCC unroll 16
        for (int c = 0; c < CC; ++c) vv[c] = vload<vType>(Tag{}, v, i + W * c);
#pragma GCC unroll 8
        for (int h = 0; h < G; ++h) {
          const float w = pr[j * G + h];
#pragma GCC unroll 16
          for (int c = 0; c < CC; ++c) acc[h][c] = vfmadd(w, vv[c], acc[h][c]);
        }
      }
#pragma GCC unroll 8
      for (int h = 0; h < G; ++h)
#pragma GCC unroll 16
        for (int c = 0; c < CC; ++c) vstore(out[r * G + h] + i + W * c, acc[h][c]);
    }
    i += W * CC;
  };
#if SPECULA_WIDE
  constexpr int C16 = G >= 8 ? 2 : 16 / G;  // 16 accumulators
  while (i + 16 * C16 <= Dv)
    pass(Zmm{}, std::integral_constant<int, C16>{});
  while (i + 16 <= Dv) pass(Zmm{}, std::integral_constant<int, 1>{});
#endif
  constexpr int C8 = G >= 8 ? 1 : 8 / G;
  while (i + 8 * C8 <= Dv)
    pass(Ymm{}, std::integral_constant<int, C8>{});
  while (i + 8 <= Dv) pass(Ymm{}, std::integral_constant<int, 1>{});
  for (; i < Dv; ++i) {
    for (int64_t r = 0; r < R; ++r)
#pragma GCC unroll 8
      for (int h = 0; h < G; ++h) {
        float o = 0.0f;
        for (int64_t j = 0; j < n; ++j)
          if (seen[r * n + j])
            o += p[(r * n + j) * G + h] * scalar_weight<vType>(a.v + (static_cast<size_t>(slots[j]) * a.Hkv + hk) * v_row, i);
        out[r * G + h][i] = o;
      }
  }
}

template <Float kType, Float vType>
void fill(AttendHeads (&by_group)[4]) {
  by_group[0] = &attend_heads<kType, vType, 1>;
  by_group[1] = &attend_heads<kType, vType, 2>;
  by_group[2] = &attend_heads<kType, vType, 4>;
  by_group[3] = &attend_heads<kType, vType, 8>;
}
template <Float kType>
void fill(AttendHeads (&by_v)[3][4]) {
  fill<kType, Float::f32>(by_v[0]);
  fill<kType, Float::f16>(by_v[1]);
  fill<kType, Float::bf16>(by_v[2]);
}

}  // namespace

void add_attention_kernels(KernelSet& set) {
  fill<Float::f32>(set.attend_heads[0]);
  fill<Float::f16>(set.attend_heads[1]);
  fill<Float::bf16>(set.attend_heads[2]);
}

}  // namespace specula::cpu::SPECULA_ISA_NS
