// ggml block layouts (gemma4-formats-spec §2.3): decoders written so that every float operation
// happens in the same order as llama.cpp's reference `dequantize_row_*`, which makes them bit-exact,
// plus reference encoders.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "quant_internal.hpp"
#include "specula/quant.hpp"

// Bit-exactness needs each multiply and add rounded separately: forbid fused multiply-add contraction
// (GCC contracts across statements by default in C++, clang within expressions).
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace specula::detail {
namespace {

constexpr int8_t kIq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

float half_at(const unsigned char* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}
void put_half(unsigned char* p, float v) {
  const uint16_t h = fp32_to_fp16(v);
  std::memcpy(p, &h, 2);
}
uint32_t u32_at(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Round half to even, like ggml's nearest_int (valid for |v| < 2^22).
int nearest(float v) { return static_cast<int>(std::nearbyint(v)); }

// Q4_K / Q5_K pack eight 6-bit scales and eight 6-bit mins into 12 bytes.
void scale_min_k4(int j, const unsigned char* q, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4));
    *mn = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}
void pack_scale_min_k4(const uint8_t* sc, const uint8_t* mn, unsigned char* q) {
  for (int j = 0; j < 4; ++j) {
    q[j] = static_cast<unsigned char>(sc[j] | ((sc[j + 4] >> 4) << 6));
    q[j + 4] = static_cast<unsigned char>(mn[j] | ((mn[j + 4] >> 4) << 6));
    q[j + 8] = static_cast<unsigned char>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
}

// Largest |x| and the signed value that has it.
void abs_max(const float* x, int n, float* amax, float* max) {
  *amax = 0.0f;
  *max = 0.0f;
  for (int j = 0; j < n; ++j) {
    const float a = std::fabs(x[j]);
    if (*amax < a) {
      *amax = a;
      *max = x[j];
    }
  }
}

// Nearest table entry (the lower one on a tie): the number of midpoints strictly below v. Midpoints of
// the integer table are exact in float.
uint8_t iq4_index(float v) {
  static constexpr float kMid[15] = {-115.5f, -93.5f, -74.0f, -57.0f, -42.0f, -28.5f, -16.0f, -4.5f,
                                     7.0f,    19.0f,  31.5f,  45.5f,  61.0f,  79.0f,  101.0f};
  int idx = 0;
  for (float m : kMid) idx += v > m;
  return static_cast<uint8_t>(idx);
}

// Best IQ4_NL scale for 32 values: several starting scales, each refined by least squares.
float iq4_fit(const float* x, uint8_t* idx) {
  float amax, max;
  abs_max(x, 32, &amax, &max);
  if (amax < 1e-15f) {
    std::fill(idx, idx + 32, uint8_t{8});
    return 0.0f;
  }
  float best_d = 0.0f, best_score = -1.0f;
  uint8_t cand[32];
  for (int itry = -7; itry <= 7; ++itry) {
    const float id = (static_cast<float>(itry) + kIq4nl[0]) / max;
    float sumqx = 0.0f, sumq2 = 0.0f;
    for (int j = 0; j < 32; ++j) {
      cand[j] = iq4_index(id * x[j]);
      const float q = kIq4nl[cand[j]];
      sumqx += q * x[j];
      sumq2 += q * q;
    }
    // Least-squares error is sum x^2 - sumqx^2/sumq2: maximise sumqx^2/sumq2.
    if (sumq2 > 0.0f && sumqx * sumqx / sumq2 > best_score) {
      best_score = sumqx * sumqx / sumq2;
      best_d = sumqx / sumq2;
      std::copy(cand, cand + 32, idx);
    }
  }
  return best_d;
}

void pack_nibbles32(const uint8_t* l, unsigned char* qs) {
  for (int j = 0; j < 16; ++j) qs[j] = static_cast<unsigned char>(l[j] | (l[j + 16] << 4));
}

// One asymmetric 32-value sub-block for Q4_K/Q5_K: y = scale*q - min with q in [0, nmax], min >= 0.
void sub_scale_min(const float* x, int nmax, float* scale, float* min) {
  float lo = x[0], hi = x[0];
  for (int j = 1; j < 32; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
  lo = std::min(lo, 0.0f);
  *scale = (hi - lo) / static_cast<float>(nmax);
  *min = -lo;
}

// Shared by Q4_K (nmax 15) and Q5_K (nmax 31): super-block scales, 6-bit sub-block scales, codes.
void quant_k_asym(const float* x, int nmax, float* d_out, float* dmin_out, uint8_t* sc, uint8_t* mn,
                  uint8_t* q) {
  float scale[8], min[8], max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    sub_scale_min(x + 32 * j, nmax, &scale[j], &min[j]);
    max_scale = std::max(max_scale, scale[j]);
    max_min = std::max(max_min, min[j]);
  }
  // Round the super-block scales to f16 first so sub-block scales are chosen against stored values.
  const float d = fp16_to_fp32(fp32_to_fp16(max_scale / 63.0f));
  const float dmin = fp16_to_fp32(fp32_to_fp16(max_min / 63.0f));
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(d > 0.0f ? std::clamp(nearest(scale[j] / d), 0, 63) : 0);
    mn[j] = static_cast<uint8_t>(dmin > 0.0f ? std::clamp(nearest(min[j] / dmin), 0, 63) : 0);
    const float ds = d * sc[j], dm = dmin * mn[j];
    for (int l = 0; l < 32; ++l) {
      const int v = ds > 0.0f ? nearest((x[32 * j + l] + dm) / ds) : 0;
      q[32 * j + l] = static_cast<uint8_t>(std::clamp(v, 0, nmax));
    }
  }
  *d_out = d;
  *dmin_out = dmin;
}

}  // namespace

// ---- decoders (same operation order as ggml's dequantize_row_*) ----

void dequant_q8_0(const unsigned char* b, float* y) {
  const float d = half_at(b);
  const auto* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = qs[j] * d;
}

void dequant_q4_0(const unsigned char* b, float* y) {
  const float d = half_at(b);
  const unsigned char* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    const int x0 = (qs[j] & 0x0F) - 8;
    const int x1 = (qs[j] >> 4) - 8;
    y[j] = x0 * d;
    y[j + 16] = x1 * d;
  }
}

void dequant_q4_1(const unsigned char* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  const unsigned char* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    const int x0 = qs[j] & 0x0F;
    const int x1 = qs[j] >> 4;
    y[j] = x0 * d + m;
    y[j + 16] = x1 * d + m;
  }
}

void dequant_q5_0(const unsigned char* b, float* y) {
  const float d = half_at(b);
  const uint32_t qh = u32_at(b + 2);
  const unsigned char* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int x0 = static_cast<int>((qs[j] & 0x0F) | (((qh >> j) & 1u) << 4)) - 16;
    const int x1 = static_cast<int>((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4)) - 16;
    y[j] = x0 * d;
    y[j + 16] = x1 * d;
  }
}

void dequant_q5_1(const unsigned char* b, float* y) {
  const float d = half_at(b), m = half_at(b + 2);
  const uint32_t qh = u32_at(b + 4);
  const unsigned char* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const int x0 = static_cast<int>((qs[j] & 0x0F) | (((qh >> j) & 1u) << 4));
    const int x1 = static_cast<int>((qs[j] >> 4) | (((qh >> (j + 16)) & 1u) << 4));
    y[j] = x0 * d + m;
    y[j + 16] = x1 * d + m;
  }
}

void dequant_q4_k(const unsigned char* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const unsigned char* scales = b + 4;
  const unsigned char* q = b + 16;
  for (int c = 0; c < 4; ++c, q += 32, y += 64) {
    uint8_t sc, m;
    scale_min_k4(2 * c, scales, &sc, &m);
    const float d1 = d * sc, m1 = dmin * m;
    scale_min_k4(2 * c + 1, scales, &sc, &m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) y[l] = d1 * (q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) y[32 + l] = d2 * (q[l] >> 4) - m2;
  }
}

void dequant_q5_k(const unsigned char* b, float* y) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const unsigned char* scales = b + 4;
  const unsigned char* qh = b + 16;
  const unsigned char* q = b + 48;
  for (int c = 0; c < 4; ++c, q += 32, y += 64) {
    uint8_t sc, m;
    scale_min_k4(2 * c, scales, &sc, &m);
    const float d1 = d * sc, m1 = dmin * m;
    scale_min_k4(2 * c + 1, scales, &sc, &m);
    const float d2 = d * sc, m2 = dmin * m;
    const unsigned lo_bit = 1u << (2 * c), hi_bit = 1u << (2 * c + 1);
    for (int l = 0; l < 32; ++l) y[l] = d1 * ((q[l] & 0xF) + (qh[l] & lo_bit ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) y[32 + l] = d2 * ((q[l] >> 4) + (qh[l] & hi_bit ? 16 : 0)) - m2;
  }
}

void dequant_q6_k(const unsigned char* b, float* y) {
  const float d = half_at(b + 208);
  const unsigned char* ql = b;
  const unsigned char* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  for (int n = 0; n < 2; ++n, ql += 64, qh += 32, sc += 8, y += 128) {
    for (int l = 0; l < 32; ++l) {
      const int s = l / 16;
      const int q1 = static_cast<int8_t>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = static_cast<int8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * sc[s] * q1;
      y[l + 32] = d * sc[s + 2] * q2;
      y[l + 64] = d * sc[s + 4] * q3;
      y[l + 96] = d * sc[s + 6] * q4;
    }
  }
}

void dequant_iq4_nl(const unsigned char* b, float* y) {
  const float d = half_at(b);
  const unsigned char* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = d * kIq4nl[qs[j] & 0xF];
    y[j + 16] = d * kIq4nl[qs[j] >> 4];
  }
}

void dequant_iq4_xs(const unsigned char* b, float* y) {
  const float d = half_at(b);
  uint16_t scales_h;
  std::memcpy(&scales_h, b + 2, 2);
  const unsigned char* scales_l = b + 4;
  const unsigned char* qs = b + 8;
  for (int ib = 0; ib < 8; ++ib, qs += 16, y += 32) {
    const int ls = ((scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | (((scales_h >> 2 * ib) & 3) << 4);
    const float dl = d * (ls - 32);
    for (int j = 0; j < 16; ++j) {
      y[j] = dl * kIq4nl[qs[j] & 0xF];
      y[j + 16] = dl * kIq4nl[qs[j] >> 4];
    }
  }
}

// ---- encoders ----
// Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1 follow ggml's reference quantizers step for step (so they reproduce
// llama.cpp's bytes; tests/formats check this against golden files). The K and IQ4 encoders are
// Specula's own simpler searches: valid blocks with small error, not llama.cpp's bytes.

void quant_q8_0(const float* x, unsigned char* b) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_half(b, d);
  auto* qs = reinterpret_cast<int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) qs[j] = static_cast<int8_t>(std::round(x[j] * id));
}

void quant_q4_0(const float* x, unsigned char* b) {
  float amax, max;
  abs_max(x, 32, &amax, &max);
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_half(b, d);
  unsigned char* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    const int x0 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
    const int x1 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 8.5f)));
    qs[j] = static_cast<unsigned char>(x0 | (x1 << 4));
  }
}

void quant_q4_1(const float* x, unsigned char* b) {
  float lo = x[0], hi = x[0];
  for (int j = 1; j < 32; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
  const float d = (hi - lo) / 15.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_half(b, d);
  put_half(b + 2, lo);
  unsigned char* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    const int x0 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - lo) * id + 0.5f)));
    const int x1 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j + 16] - lo) * id + 0.5f)));
    qs[j] = static_cast<unsigned char>(x0 | (x1 << 4));
  }
}

void quant_q5_0(const float* x, unsigned char* b) {
  float amax, max;
  abs_max(x, 32, &amax, &max);
  const float d = max / -16.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_half(b, d);
  uint32_t qh = 0;
  unsigned char* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    const int x0 = std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f)));
    const int x1 = std::min(31, static_cast<int>(static_cast<int8_t>(x[j + 16] * id + 16.5f)));
    qs[j] = static_cast<unsigned char>((x0 & 0xF) | ((x1 & 0xF) << 4));
    qh |= ((static_cast<uint32_t>(x0) & 0x10u) >> 4) << j;
    qh |= ((static_cast<uint32_t>(x1) & 0x10u) >> 4) << (j + 16);
  }
  std::memcpy(b + 2, &qh, 4);
}

void quant_q5_1(const float* x, unsigned char* b) {
  float lo = x[0], hi = x[0];
  for (int j = 1; j < 32; ++j) {
    lo = std::min(lo, x[j]);
    hi = std::max(hi, x[j]);
  }
  const float d = (hi - lo) / 31.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  put_half(b, d);
  put_half(b + 2, lo);
  uint32_t qh = 0;
  unsigned char* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    const uint32_t x0 = static_cast<uint8_t>((x[j] - lo) * id + 0.5f);
    const uint32_t x1 = static_cast<uint8_t>((x[j + 16] - lo) * id + 0.5f);
    qs[j] = static_cast<unsigned char>((x0 & 0xF) | ((x1 & 0xF) << 4));
    qh |= ((x0 & 0x10u) >> 4) << j;
    qh |= ((x1 & 0x10u) >> 4) << (j + 16);
  }
  std::memcpy(b + 4, &qh, 4);
}

void quant_q4_k(const float* x, unsigned char* b) {
  float d, dmin;
  uint8_t sc[8], mn[8], q[256];
  quant_k_asym(x, 15, &d, &dmin, sc, mn, q);
  put_half(b, d);
  put_half(b + 2, dmin);
  pack_scale_min_k4(sc, mn, b + 4);
  unsigned char* qs = b + 16;
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l)
      qs[32 * c + l] = static_cast<unsigned char>(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
}

void quant_q5_k(const float* x, unsigned char* b) {
  float d, dmin;
  uint8_t sc[8], mn[8], q[256];
  quant_k_asym(x, 31, &d, &dmin, sc, mn, q);
  put_half(b, d);
  put_half(b + 2, dmin);
  pack_scale_min_k4(sc, mn, b + 4);
  unsigned char* qh = b + 16;
  unsigned char* qs = b + 48;
  std::memset(qh, 0, 32);
  for (int c = 0; c < 4; ++c) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t lo = q[64 * c + l], hi = q[64 * c + 32 + l];
      qs[32 * c + l] = static_cast<unsigned char>((lo & 0xF) | ((hi & 0xF) << 4));
      qh[l] |= static_cast<unsigned char>(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
    }
  }
}

void quant_q6_k(const float* x, unsigned char* b) {
  // 16 sub-blocks of 16 values, symmetric codes -32..31, int8 sub-block scales times an f16 d.
  float scale[16], max_scale = 0.0f;
  for (int j = 0; j < 16; ++j) {
    float amax, max;
    abs_max(x + 16 * j, 16, &amax, &max);
    scale[j] = amax / 31.0f;
    max_scale = std::max(max_scale, scale[j]);
  }
  const float d = fp16_to_fp32(fp32_to_fp16(max_scale / 127.0f));
  int8_t sc[16];
  uint8_t q[256];
  for (int j = 0; j < 16; ++j) {
    sc[j] = static_cast<int8_t>(d > 0.0f ? std::clamp(nearest(scale[j] / d), 0, 127) : 0);
    const float ds = d * sc[j];
    for (int l = 0; l < 16; ++l) {
      const int v = ds > 0.0f ? nearest(x[16 * j + l] / ds) : 0;
      q[16 * j + l] = static_cast<uint8_t>(std::clamp(v, -32, 31) + 32);
    }
  }
  unsigned char* ql = b;
  unsigned char* qh = b + 128;
  std::memset(b, 0, 192);
  for (int n = 0; n < 2; ++n) {
    const uint8_t* h = q + 128 * n;
    for (int l = 0; l < 32; ++l) {
      ql[64 * n + l] = static_cast<unsigned char>((h[l] & 0xF) | ((h[l + 64] & 0xF) << 4));
      ql[64 * n + l + 32] = static_cast<unsigned char>((h[l + 32] & 0xF) | ((h[l + 96] & 0xF) << 4));
      qh[32 * n + l] = static_cast<unsigned char>((h[l] >> 4) | ((h[l + 32] >> 4) << 2) |
                                                  ((h[l + 64] >> 4) << 4) | ((h[l + 96] >> 4) << 6));
    }
  }
  std::memcpy(b + 192, sc, 16);
  put_half(b + 208, d);
}

void quant_iq4_nl(const float* x, unsigned char* b) {
  uint8_t idx[32];
  const float d = iq4_fit(x, idx);
  put_half(b, d);
  // Re-pick codes against the stored (f16) scale.
  const float ds = fp16_to_fp32(fp32_to_fp16(d));
  if (ds != 0.0f)
    for (int j = 0; j < 32; ++j) idx[j] = iq4_index(x[j] / ds);
  pack_nibbles32(idx, b + 2);
}

void quant_iq4_xs(const float* x, unsigned char* b) {
  float scale[8], max_scale = 0.0f, amax_scale = 0.0f;
  uint8_t idx[256];
  for (int ib = 0; ib < 8; ++ib) {
    scale[ib] = iq4_fit(x + 32 * ib, idx + 32 * ib);
    if (std::fabs(scale[ib]) > amax_scale) {
      amax_scale = std::fabs(scale[ib]);
      max_scale = scale[ib];
    }
  }
  const float d = fp16_to_fp32(fp32_to_fp16(-max_scale / 32.0f));
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  uint16_t scales_h = 0;
  unsigned char* scales_l = b + 4;
  std::memset(scales_l, 0, 4);
  for (int ib = 0; ib < 8; ++ib) {
    const int l = std::clamp(nearest(id * scale[ib]), -32, 31);
    const float dl = d * l;
    if (dl != 0.0f)
      for (int j = 0; j < 32; ++j) idx[32 * ib + j] = iq4_index(x[32 * ib + j] / dl);
    const int u = l + 32;
    scales_l[ib / 2] |= static_cast<unsigned char>((u & 0xF) << (4 * (ib % 2)));
    scales_h |= static_cast<uint16_t>((u >> 4) << (2 * ib));
    pack_nibbles32(idx + 32 * ib, b + 8 + 16 * ib);
  }
  put_half(b, d);
  std::memcpy(b + 2, &scales_h, 2);
}

}  // namespace specula::detail
