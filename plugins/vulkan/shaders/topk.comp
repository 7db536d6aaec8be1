#version 450
// TopK / Argmax, one workgroup per row: k rounds, each picking the best value that ranks after the
// previous pick in the order (value descending, index ascending), so ties go to the lower index.
// Push constants: PC_TOPK_* (push_constants.h).
#include "common.glsl"
layout(local_size_x = 64) in;
shared float rv[64];
shared uint ri[64];

// Whether (v, i) ranks before (w, j).
bool before(float v, uint i, float w, uint j) { return v > w || (v == w && i < j); }

void main() {
  uint C = pc.p[PC_TOPK_COLS], K = pc.p[PC_TOPK_K], row = wg_linear(), tid = gl_LocalInvocationID.x, base = row * C;
  float pv = 1.0 / 0.0;
  uint pi = 0xFFFFFFFFu;
  bool first = true;
  for (uint r = 0u; r < K; ++r) {
    float bv = 0.0;
    uint bi = 0xFFFFFFFFu;
    for (uint c = tid; c < C; c += 64u) {
      float v = uintBitsToFloat(b0.d[base + c]);
      if (!first && !before(pv, pi, v, c)) continue;  // already picked
      if (bi == 0xFFFFFFFFu || before(v, c, bv, bi)) {
        bv = v;
        bi = c;
      }
    }
    rv[tid] = bv;
    ri[tid] = bi;
    barrier();
    for (uint s = 32u; s > 0u; s >>= 1) {
      if (tid < s && ri[tid + s] != 0xFFFFFFFFu &&
          (ri[tid] == 0xFFFFFFFFu || before(rv[tid + s], ri[tid + s], rv[tid], ri[tid]))) {
        rv[tid] = rv[tid + s];
        ri[tid] = ri[tid + s];
      }
      barrier();
    }
    pv = rv[0];
    pi = ri[0];
    first = false;
    barrier();
    if (tid == 0u) bo.d[row * K + r] = pi;
  }
}
