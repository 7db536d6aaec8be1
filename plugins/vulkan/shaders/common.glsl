// Shared declarations of every Specula Vulkan shader: eight storage buffers seen as uint words
// (operands 0-4, the result, the run's error record, operand 5), 32 words of push constants, and the dtype codecs.
// Values are addressed by element index; 16-bit and byte-packed types are unpacked with integer ops so
// no 8/16-bit storage feature is needed and conversions round exactly as the SDK codecs do.
#extension GL_GOOGLE_include_directive : require

layout(std430, set = 0, binding = 0) buffer B0 { uint d[]; } b0;
layout(std430, set = 0, binding = 1) buffer B1 { uint d[]; } b1;
layout(std430, set = 0, binding = 2) buffer B2 { uint d[]; } b2;
layout(std430, set = 0, binding = 3) buffer B3 { uint d[]; } b3;
layout(std430, set = 0, binding = 4) buffer B4 { uint d[]; } b4;
layout(std430, set = 0, binding = 5) buffer BO { uint d[]; } bo;
// err.d[0] = 1 when a run-time value was out of range; d[1] = node, d[2] = value, d[3] = position.
layout(std430, set = 0, binding = 6) buffer BE { uint d[]; } err;
layout(std430, set = 0, binding = 7) buffer B5 { uint d[]; } b5;  // operand 5

#include "push_constants.h"
layout(push_constant) uniform PC { uint p[32]; } pc;

// ggml type ids (specula::DType)
const uint T_F32 = 0u, T_F16 = 1u, T_Q4_0 = 2u, T_Q4_1 = 3u, T_Q5_0 = 6u, T_Q5_1 = 7u, T_Q8_0 = 8u,
           T_Q4_K = 12u, T_Q5_K = 13u, T_Q6_K = 14u, T_IQ4_NL = 20u, T_IQ4_XS = 23u, T_I32 = 26u, T_BF16 = 30u;
// MLX affine (specula::DType::MLX_AFFINE), decoded by get_rows and matmul: codes at binding 0, scales and
// biases at bindings 3 and 4, bits, group size and scale type (F32, F16 or BF16) in PC_MLX_*.
const uint T_MLX = 1100u;

// IQ4_NL / IQ4_XS code book (ggml's kvalues_iq4nl).
const int kIq4nl[16] = int[16](-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);

uint wg_linear() { return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x; }

float pf(uint k) { return uintBitsToFloat(pc.p[k]); }

void report(uint node, uint value, uint pos) {
  err.d[1] = node;
  err.d[2] = value;
  err.d[3] = pos;
  err.d[0] = 1u;
}

float half_bits(uint h) {
  // IEEE binary16 -> binary32, exact (subnormals, infinities, NaN).
  uint s = (h & 0x8000u) << 16, e = (h >> 10) & 0x1Fu, m = h & 0x3FFu;
  if (e == 0u) {
    float v = float(m) * (1.0 / 16777216.0);
    return s != 0u ? -v : v;
  }
  if (e == 31u) return uintBitsToFloat(s | 0x7F800000u | (m << 13));
  return uintBitsToFloat(s | ((e + 112u) << 23) | (m << 13));
}

uint f32_to_f16(float f) {
  // Round to nearest even, as specula::fp32_to_fp16.
  uint x = floatBitsToUint(f);
  uint sign = (x >> 16) & 0x8000u;
  x &= 0x7FFFFFFFu;
  if (x >= 0x7F800000u) return sign | 0x7C00u | (x > 0x7F800000u ? 0x200u : 0u);
  if (x >= 0x477FF000u) return sign | 0x7C00u;
  if (x < 0x38800000u) return sign | uint(roundEven(uintBitsToFloat(x) * 16777216.0));
  uint h = (((x >> 23) - 112u) << 10) | ((x & 0x7FFFFFu) >> 13);
  uint rest = x & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0u)) h += 1u;
  return sign | h;
}

uint f32_to_bf16(float f) {
  uint x = floatBitsToUint(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return ((x >> 16) | 0x40u) & 0xFFFFu;
  return ((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16) & 0xFFFFu;
}

// A plain (F32, F16, BF16, I32 as float) value at element i of a buffer.
#define DEFINE_LOAD(NAME, BUF)                                                   \
  float NAME(uint type, uint i) {                                                \
    if (type == T_F32) return uintBitsToFloat(BUF.d[i]);                         \
    uint w = BUF.d[i >> 1];                                                      \
    uint h = (i & 1u) != 0u ? (w >> 16) : (w & 0xFFFFu);                         \
    if (type == T_F16) return half_bits(h);                                      \
    return uintBitsToFloat(h << 16);                                             \
  }
DEFINE_LOAD(load0, b0)
DEFINE_LOAD(load1, b1)
DEFINE_LOAD(load2, b2)
DEFINE_LOAD(load3, b3)
DEFINE_LOAD(load4, b4)

// Bytes of binding 0 (weights, which may be byte-packed blocks).
uint byte0(uint off) { return (b0.d[off >> 2] >> ((off & 3u) * 8u)) & 0xFFu; }
float half0(uint off) { return half_bits(byte0(off) | (byte0(off + 1u) << 8)); }
int sbyte0(uint off) { return int(byte0(off) << 24) >> 24; }

uint word0(uint off) { return byte0(off) | (byte0(off + 1u) << 8) | (byte0(off + 2u) << 16) | (byte0(off + 3u) << 24); }

// Bytes of one row of `cols` values of `type`.
uint row_bytes(uint type, uint cols) {
  if (type == T_F32) return cols * 4u;
  if (type == T_F16 || type == T_BF16) return cols * 2u;
  if (type == T_Q8_0) return cols / 32u * 34u;
  if (type == T_Q4_0 || type == T_IQ4_NL) return cols / 32u * 18u;
  if (type == T_Q4_1) return cols / 32u * 20u;
  if (type == T_Q5_0) return cols / 32u * 22u;
  if (type == T_Q5_1) return cols / 32u * 24u;
  if (type == T_Q4_K) return cols / 256u * 144u;
  if (type == T_Q5_K) return cols / 256u * 176u;
  if (type == T_IQ4_XS) return cols / 256u * 136u;
  return cols / 256u * 210u;  // Q6_K
}

// Q4_K / Q5_K: the 6-bit scale and min of sub-block j (of 8) from the 12 bytes at s.
void scale_min_k4(uint s, uint j, out uint sc, out uint m) {
  if (j < 4u) {
    sc = byte0(s + j) & 63u;
    m = byte0(s + j + 4u) & 63u;
  } else {
    sc = (byte0(s + j + 4u) & 0xFu) | ((byte0(s + j - 4u) >> 6) << 4);
    m = (byte0(s + j + 4u) >> 4) | ((byte0(s + j) >> 6) << 4);
  }
}

// Values [32 c, 32 c + 32) of the weight row `row` (binding 0) as F32, exactly as the SDK decodes them;
// values past `cols` (plain types only) are 0.
void decode_chunk(uint type, uint row, uint cols, uint c, out float w[32]) {
  if (type == T_F32 || type == T_F16 || type == T_BF16) {
    uint base = row * cols, e0 = c * 32u;
    for (uint j = 0u; j < 32u; ++j) w[j] = e0 + j < cols ? load0(type, base + e0 + j) : 0.0;
    return;
  }
  if (type == T_MLX) {
    // A row is cols / 32 * bits words of `bits`-bit codes, a little-endian bit stream (as the SDK's
    // mlx_dequantize_row), so the chunk's 32 codes are the `bits` words from c * bits, within one group.
    // scale * code + bias, rounded twice as the SDK does.
    uint bits = pc.p[PC_MLX_BITS], mask = (1u << bits) - 1u, st = pc.p[PC_MLX_SCALE_TYPE];
    uint g = row * (cols / pc.p[PC_MLX_GROUP]) + c * 32u / pc.p[PC_MLX_GROUP];
    float s = load3(st, g), bias = load4(st, g);
    uint base = row * (cols / 32u * bits) + c * bits;
    for (uint j = 0u; j < 32u; ++j) {
      uint p = j * bits, wd = base + (p >> 5), sh = p & 31u;
      uint v = b0.d[wd] >> sh;
      if (sh + bits > 32u) v |= b0.d[wd + 1u] << (32u - sh);
      precise float y = s * float(v & mask);
      w[j] = y + bias;
    }
    return;
  }
  uint rb = row_bytes(type, cols), off = row * rb;
  if (type == T_Q8_0) {
    uint b = off + c * 34u;
    float d = half0(b);
    for (uint j = 0u; j < 32u; ++j) w[j] = float(sbyte0(b + 2u + j)) * d;
  } else if (type == T_Q4_0) {
    uint b = off + c * 18u;
    float d = half0(b);
    for (uint j = 0u; j < 16u; ++j) {
      uint q = byte0(b + 2u + j);
      w[j] = float(int(q & 0xFu) - 8) * d;
      w[j + 16u] = float(int(q >> 4) - 8) * d;
    }
  } else if (type == T_Q4_1 || type == T_Q5_1) {
    // d * q + m, rounded twice as the SDK does (precise: no fused multiply-add).
    bool five = type == T_Q5_1;
    uint b = off + c * (five ? 24u : 20u), qs = b + (five ? 8u : 4u);
    float d = half0(b), m = half0(b + 2u);
    uint qh = five ? word0(b + 4u) : 0u;
    for (uint j = 0u; j < 16u; ++j) {
      uint q = byte0(qs + j);
      precise float y0 = float((q & 0xFu) | (((qh >> j) & 1u) << 4)) * d;
      precise float y1 = float((q >> 4) | (((qh >> (j + 16u)) & 1u) << 4)) * d;
      w[j] = y0 + m;
      w[j + 16u] = y1 + m;
    }
  } else if (type == T_Q5_0) {
    uint b = off + c * 22u;
    float d = half0(b);
    uint qh = word0(b + 2u);
    for (uint j = 0u; j < 16u; ++j) {
      uint q = byte0(b + 6u + j);
      w[j] = float(int((q & 0xFu) | (((qh >> j) & 1u) << 4)) - 16) * d;
      w[j + 16u] = float(int((q >> 4) | (((qh >> (j + 16u)) & 1u) << 4)) - 16) * d;
    }
  } else if (type == T_IQ4_NL) {
    uint b = off + c * 18u;
    float d = half0(b);
    for (uint j = 0u; j < 16u; ++j) {
      uint q = byte0(b + 2u + j);
      w[j] = d * float(kIq4nl[q & 0xFu]);
      w[j + 16u] = d * float(kIq4nl[q >> 4]);
    }
  } else if (type == T_IQ4_XS) {
    uint b = off + (c / 8u) * 136u, ib = c % 8u;
    uint high = byte0(b + 2u) | (byte0(b + 3u) << 8);  // the 2-bit high parts of the 8 scales
    uint ls = ((byte0(b + 4u + ib / 2u) >> (4u * (ib % 2u))) & 0xFu) | (((high >> (2u * ib)) & 3u) << 4);
    precise float dl = half0(b) * float(int(ls) - 32);
    uint qs = b + 8u + ib * 16u;
    for (uint j = 0u; j < 16u; ++j) {
      uint q = byte0(qs + j);
      w[j] = dl * float(kIq4nl[q & 0xFu]);
      w[j + 16u] = dl * float(kIq4nl[q >> 4]);
    }
  } else if (type == T_Q4_K || type == T_Q5_K) {
    // Sub-block `sub` of a 256-value super-block: d1 * q - m1 (Q5_K adds the fifth bit from qh).
    bool five = type == T_Q5_K;
    uint b = off + (c / 8u) * (five ? 176u : 144u), sub = c % 8u, pair = sub / 2u;
    float d = half0(b), dmin = half0(b + 2u);
    uint sc, m;
    scale_min_k4(b + 4u, sub, sc, m);
    precise float d1 = d * float(sc), m1 = dmin * float(m);
    uint q = b + (five ? 48u : 16u) + pair * 32u, qh = b + 16u;
    for (uint l = 0u; l < 32u; ++l) {
      uint v = byte0(q + l);
      v = (sub & 1u) != 0u ? (v >> 4) : (v & 0xFu);
      if (five && (byte0(qh + l) & (1u << sub)) != 0u) v += 16u;
      precise float y = d1 * float(v);
      w[l] = y - m1;
    }
  } else {  // Q6_K
    uint b = off + (c / 8u) * 210u, sub = c % 8u, n = sub / 4u, qq = sub % 4u;
    float d = half0(b + 208u);
    uint ql = b + n * 64u, qh = b + 128u + n * 32u, scb = b + 192u + n * 8u;
    for (uint l = 0u; l < 32u; ++l) {
      uint lo = (qq & 1u) != 0u ? byte0(ql + l + 32u) : byte0(ql + l);
      lo = qq >= 2u ? (lo >> 4) : (lo & 0xFu);
      uint hi = (byte0(qh + l) >> (2u * qq)) & 3u;
      int q = int(lo | (hi << 4)) - 32;
      int scale = int(byte0(scb + l / 16u + 2u * qq) << 24) >> 24;
      precise float y = d * float(scale);
      w[l] = y * float(q);
    }
  }
}
