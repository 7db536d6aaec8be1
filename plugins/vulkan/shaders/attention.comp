#version 450
// Attention, one workgroup per (query t, head j): the scores of every slot go to a scratch row that
// the host places in the output binding past the T * Hq * Dv results, softmax with shared reductions,
// then each thread accumulates its output dimensions over the slots.
// Bindings: 0 q (F32), 1 K, 2 V (F32/F16/BF16), 3 key positions I32, 4 query positions I32, 5 out.
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

// p: 0 T, 1 Hq, 2 D, 3 S, 4 Hkv, 5 Dv, 6 scale, 7 window, 8 causal, 9 K type, 10 V type,
//    11 scores offset (in words, inside the output binding, past T * Hq * Dv)
void main() {
  uint T = pc.p[0], Hq = pc.p[1], D = pc.p[2], S = pc.p[3], Hkv = pc.p[4], Dv = pc.p[5];
  int window = int(pc.p[7]);
  bool causal = pc.p[8] != 0u;
  uint kt = pc.p[9], vt = pc.p[10], sc0 = pc.p[11];
  uint row = wg_linear(), t = row / Hq, j = row % Hq, kvh = j / (Hq / Hkv), tid = gl_LocalInvocationID.x;
  int qp = int(b4.d[t]);
  uint qb = (t * Hq + j) * D, sb = sc0 + row * S;
  float m = -1.0 / 0.0;
  for (uint s = tid; s < S; s += 64u) {
    int kp = int(b3.d[s]);
    bool vis = kp >= 0 && (!causal || kp <= qp) &&
               (window <= 0 || abs(qp - kp) < window);
    float sc = -1.0 / 0.0;
    if (vis) {
      uint kb = (s * Hkv + kvh) * D;
      float dot = 0.0;
      for (uint d = 0u; d < D; ++d) dot += uintBitsToFloat(b0.d[qb + d]) * load1(kt, kb + d);
      sc = dot * pf(6);
      m = max(m, sc);
    }
    bo.d[sb + s] = floatBitsToUint(sc);
  }
  m = wg_reduce(m, true);
  uint ob = (t * Hq + j) * Dv;
  if (isinf(m) && m < 0.0) {  // no visible slot
    for (uint d = tid; d < Dv; d += 64u) bo.d[ob + d] = 0u;
    return;
  }
  float sum = 0.0;
  for (uint s = tid; s < S; s += 64u) {
    float e = exp(uintBitsToFloat(bo.d[sb + s]) - m);
    bo.d[sb + s] = floatBitsToUint(e);
    sum += e;
  }
  float inv = 1.0 / wg_reduce(sum, false);
  memoryBarrierBuffer();
  barrier();
  for (uint d = tid; d < Dv; d += 64u) {
    float acc = 0.0;
    for (uint s = 0u; s < S; ++s) {
      float p = uintBitsToFloat(bo.d[sb + s]);
      if (p != 0.0) acc += p * load2(vt, (s * Hkv + kvh) * Dv + d);
    }
    bo.d[ob + d] = floatBitsToUint(acc * inv);
  }
}
