#version 450
// Rope (NeoX halves), one thread per (t, h, k < D/2). b2 holds the F32 inverse frequencies computed on
// the host exactly as the CPU backend does; the angle is reduced to [-pi, pi] before sin/cos so large
// positions keep F32 accuracy. Push constants: PC_ROPE_*
#include "common.glsl"
layout(local_size_x = 64) in;

void main() {
  uint T = pc.p[PC_ROPE_T], H = pc.p[PC_ROPE_H], D = pc.p[PC_ROPE_D], pairs = pc.p[PC_ROPE_PAIRS], half_d = D / 2u;
  uint i = wg_linear() * 64u + gl_LocalInvocationID.x;
  if (i >= T * H * half_d) return;
  uint k = i % half_d, th = i / half_d, t = th / H;
  uint base = th * D;
  float x0 = uintBitsToFloat(b0.d[base + k]), x1 = uintBitsToFloat(b0.d[base + k + half_d]);
  if (k < pairs) {
    float angle = float(int(b1.d[t])) * uintBitsToFloat(b2.d[k]);
    // Cody-Waite reduction by 2 pi in two parts (n * 6.28125 is exact for |n| < 2^15).
    float n = roundEven(angle * 0.15915494309189535);
    precise float r = angle - n * 6.28125;
    r = r - n * 1.9353071795864769e-3;
    float c = cos(r), s = sin(r);
    bo.d[base + k] = floatBitsToUint(x0 * c - x1 * s);
    bo.d[base + k + half_d] = floatBitsToUint(x1 * c + x0 * s);
  } else {
    bo.d[base + k] = floatBitsToUint(x0);
    bo.d[base + k + half_d] = floatBitsToUint(x1);
  }
}
