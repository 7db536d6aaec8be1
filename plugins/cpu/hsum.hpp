// A vector's 8 lanes summed in one fixed order (the halves, then pairs, then pairs of pairs): dot_f32's
// sums and attention's scores. In an unnamed namespace, so each file built for its own instruction set keeps
// its own copy (see qkernels.cpp).
#pragma once

#include <immintrin.h>

namespace specula::cpu {
namespace {
inline float hsum_pairs(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_hadd_ps(lo, lo);
  lo = _mm_hadd_ps(lo, lo);
  return _mm_cvtss_f32(lo);
}
}  // namespace
}  // namespace specula::cpu
