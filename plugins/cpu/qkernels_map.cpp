// Element-wise maps of the CPU backend (GELU with tanh, softcap, exp), compiled once per instruction set like the
// matrix kernels: 16 lanes on AVX-512, 8 on AVX2. Each lane runs the same operations in the same order on
// both sets (min / max, floor, fma, a true division, a compare and blend), so the bits do not depend on
// the set, on the lane a value lands in, or on where a thread's share ends: a partial last vector goes
// through a padded register, not a scalar formula (a scalar tail with std::tanh once flipped near-tied
// argmaxes between a verification's rows and a decode step's).
#include "qkernels.hpp"

namespace specula::cpu::SPECULA_ISA_NS {
namespace {

#if SPECULA_WIDE
struct Vec {
  using T = __m512;
  static constexpr int kLanes = 16;
  static T set1(float v) { return _mm512_set1_ps(v); }
  static T load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, T v) { _mm512_storeu_ps(p, v); }
  static T min(T a, T b) { return _mm512_min_ps(a, b); }
  static T max(T a, T b) { return _mm512_max_ps(a, b); }
  static T floor(T a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
  static T fmadd(T a, T b, T c) { return _mm512_fmadd_ps(a, b, c); }
  static T fnmadd(T a, T b, T c) { return _mm512_fnmadd_ps(a, b, c); }
  static T add(T a, T b) { return _mm512_add_ps(a, b); }
  static T sub(T a, T b) { return _mm512_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm512_mul_ps(a, b); }
  static T div(T a, T b) { return _mm512_div_ps(a, b); }
  static T abs(T a) { return _mm512_andnot_ps(set1(-0.0f), a); }
  static T copy_sign(T magnitude, T sign) { return _mm512_or_ps(magnitude, _mm512_and_ps(set1(-0.0f), sign)); }
  // 2^n for the integral floats n (|n| <= 127).
  static T pow2(T n) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  // a where x > limit, else b.
  static T above(T x, float limit, T a, T b) { return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, set1(limit), _CMP_GT_OQ), b, a); }
};
#else
struct Vec {
  using T = __m256;
  static constexpr int kLanes = 8;
  static T set1(float v) { return _mm256_set1_ps(v); }
  static T load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, T v) { _mm256_storeu_ps(p, v); }
  static T min(T a, T b) { return _mm256_min_ps(a, b); }
  static T max(T a, T b) { return _mm256_max_ps(a, b); }
  static T floor(T a) { return _mm256_floor_ps(a); }
  static T fmadd(T a, T b, T c) { return _mm256_fmadd_ps(a, b, c); }
  static T fnmadd(T a, T b, T c) { return _mm256_fnmadd_ps(a, b, c); }
  static T add(T a, T b) { return _mm256_add_ps(a, b); }
  static T sub(T a, T b) { return _mm256_sub_ps(a, b); }
  static T mul(T a, T b) { return _mm256_mul_ps(a, b); }
  static T div(T a, T b) { return _mm256_div_ps(a, b); }
  static T abs(T a) { return _mm256_andnot_ps(set1(-0.0f), a); }
  static T copy_sign(T magnitude, T sign) { return _mm256_or_ps(magnitude, _mm256_and_ps(set1(-0.0f), sign)); }
  static T pow2(T n) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  static T above(T x, float limit, T a, T b) { return _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, set1(limit), _CMP_GT_OQ)); }
};
#endif
using V = Vec::T;

// exp for x <= 88 (Cephes expf: x = n ln 2 + r, a degree-6 polynomial in r, times 2^n); ~1 ulp.
inline V exp_v(V x) {
  x = Vec::min(x, Vec::set1(88.3762626647949f));
  x = Vec::max(x, Vec::set1(-88.3762626647949f));
  const V n = Vec::floor(Vec::fmadd(x, Vec::set1(1.44269504088896341f), Vec::set1(0.5f)));
  x = Vec::fnmadd(n, Vec::set1(0.693359375f), x);
  x = Vec::fnmadd(n, Vec::set1(-2.12194440e-4f), x);
  V y = Vec::set1(1.9875691500e-4f);
  for (float c : {1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f})
    y = Vec::fmadd(y, x, Vec::set1(c));
  y = Vec::fmadd(y, Vec::mul(x, x), Vec::add(x, Vec::set1(1.0f)));
  return Vec::mul(y, Vec::pow2(n));
}

// tanh (Cephes tanhf): an odd polynomial below |x| = 0.625, 1 - 2 / (exp(2|x|) + 1) above; ~2 ulp.
inline V tanh_v(V x) {
  const V ax = Vec::abs(x);
  const V z = Vec::mul(x, x);
  V p = Vec::set1(-5.70498872745e-3f);
  for (float c : {2.06390887954e-2f, -5.37397155531e-2f, 1.33314422036e-1f, -3.33332819422e-1f})
    p = Vec::fmadd(p, z, Vec::set1(c));
  const V small = Vec::fmadd(Vec::mul(p, z), x, x);
  const V e = exp_v(Vec::add(ax, ax));
  const V large = Vec::sub(Vec::set1(1.0f), Vec::div(Vec::set1(2.0f), Vec::add(e, Vec::set1(1.0f))));
  return Vec::above(ax, 0.625f, Vec::copy_sign(large, x), small);
}

// f over x[0, n) into out, a vector at a time.
template <class F>
inline void map(const float* x, int64_t n, float* out, F f) {
  int64_t i = 0;
  for (; i + Vec::kLanes <= n; i += Vec::kLanes) Vec::store(out + i, f(Vec::load(x + i)));
  if (i < n) {
    float buf[Vec::kLanes] = {};
    std::memcpy(buf, x + i, static_cast<size_t>(n - i) * 4);
    Vec::store(buf, f(Vec::load(buf)));
    std::memcpy(out + i, buf, static_cast<size_t>(n - i) * 4);
  }
}

void gelu_tanh(const float* x, int64_t n, float* out) {
  map(x, n, out, [](V v) {
    const V inner = Vec::mul(Vec::set1(0.7978845608028654f),  // sqrt(2 / pi)
                             Vec::fmadd(Vec::mul(Vec::set1(0.044715f), v), Vec::mul(v, v), v));
    return Vec::mul(Vec::mul(Vec::set1(0.5f), v), Vec::add(Vec::set1(1.0f), tanh_v(inner)));
  });
}

void softcap(const float* x, int64_t n, float cap, float* out) {
  const V c = Vec::set1(cap);
  map(x, n, out, [&](V v) { return Vec::mul(c, tanh_v(Vec::div(v, c))); });
}

void exp(const float* x, int64_t n, float* out) {
  map8(x, n, out, [](__m256 v) { return exp8(v); });
}

}  // namespace

void add_map_kernels(KernelSet& set) {
  set.gelu_tanh = &gelu_tanh;
  set.softcap = &softcap;
  set.exp = &exp;
}

}  // namespace specula::cpu::SPECULA_ISA_NS
