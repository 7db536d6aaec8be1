#version 450
// Row reductions, one workgroup per row: RmsNorm (op 0; b1 = weight when p[3] != 0) and Softmax (op 1).
// Push constants: PC_ROWS_* (push_constants.h).
#include "common.glsl"
layout(local_size_x = 64) in;
shared float red[64];

float wg_reduce(float v, bool is_max) {
  uint tid = gl_LocalInvocationID.x;
  red[tid] = v;
  barrier();
  for (uint s = 32u; s > 0u; s >>= 1) {
    if (tid < s) red[tid] = is_max ? max(red[tid], red[tid + s]) : red[tid] + red[tid + s];
    barrier();
  }
  float r = red[0];
  barrier();
  return r;
}

void main() {
  uint C = pc.p[PC_ROWS_COLS], row = wg_linear(), tid = gl_LocalInvocationID.x, base = row * C;
  if (pc.p[PC_ROWS_OP] == 0u) {
    float s = 0.0;
    for (uint c = tid; c < C; c += 64u) {
      float x = uintBitsToFloat(b0.d[base + c]);
      s += x * x;
    }
    float ms = wg_reduce(s, false) / float(C);
    float inv = 1.0 / sqrt(ms + pf(PC_ROWS_EPS));
    for (uint c = tid; c < C; c += 64u) {
      float y = uintBitsToFloat(b0.d[base + c]) * inv;
      if (pc.p[PC_ROWS_HAS_WEIGHT] != 0u) y *= uintBitsToFloat(b1.d[c]);
      bo.d[base + c] = floatBitsToUint(y);
    }
  } else {
    float m = -1.0 / 0.0;
    for (uint c = tid; c < C; c += 64u) m = max(m, uintBitsToFloat(b0.d[base + c]));
    m = wg_reduce(m, true);
    float s = 0.0;
    for (uint c = tid; c < C; c += 64u) {
      float e = exp(uintBitsToFloat(b0.d[base + c]) - m);
      bo.d[base + c] = floatBitsToUint(e);
      s += e;
    }
    float inv = 1.0 / wg_reduce(s, false);
    for (uint c = tid; c < C; c += 64u) bo.d[base + c] = floatBitsToUint(uintBitsToFloat(bo.d[base + c]) * inv);
  }
}
