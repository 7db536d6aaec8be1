#version 450
// MatMul and MatMulId: one workgroup per (output column o, group of up to 4 activation rows); threads
// stride over 32-value chunks of the weight row, decoding each chunk once for all rows of the group.
// p: 0 weight type, 1 O, 2 I, 3 N (activation rows), 4 mode (0 matmul, 1 matmul_id), 5 K,
//    6 x_shared (x has one row per token for all K), 7 E, 8 node, 9..10 the window bound at binding 0
//    (weights above maxStorageBufferRange are split in windows, one dispatch each): matmul: first output
//    column and count; matmul_id: experts [first, end)
#include "common.glsl"
layout(local_size_x = 64) in;
shared vec4 red[64];

void main() {
  uint type = pc.p[0], O = pc.p[1], I = pc.p[2], N = pc.p[3], mode = pc.p[4], K = pc.p[5];
  uint Ow = mode == 0u ? pc.p[10] : O;
  uint id = wg_linear(), o = id % Ow, g = id / Ow, n0 = g * 4u, tid = gl_LocalInvocationID.x;
  uint wrow = o;  // row of the bound window
  if (mode == 0u) o += pc.p[9];
  if (n0 >= N) return;
  uint nr = min(4u, N - n0);
  uint chunks = (I + 31u) / 32u;
  vec4 acc = vec4(0.0);
  bvec4 mine = bvec4(true);
  if (mode == 0u) {
    for (uint c = tid; c < chunks; c += 64u) {
      float w[32];
      decode_chunk(type, wrow, I, c, w);
      uint e0 = c * 32u, ne = min(32u, I - e0);
      for (uint r = 0u; r < nr; ++r) {
        uint xb = (n0 + r) * I + e0;
        float s = 0.0;
        for (uint j = 0u; j < ne; ++j) s += w[j] * uintBitsToFloat(b1.d[xb + j]);
        acc[r] += s;
      }
    }
  } else {
    // Rows n0..n0+nr of the flattened [N*K] output; each has its own expert, so decode per row.
    for (uint r = 0u; r < nr; ++r) {
      uint row = n0 + r, tok = row / K, k = row % K;
      int e = int(b2.d[row]);
      if (e < 0 || uint(e) >= pc.p[7]) {
        if (tid == 0u) report(pc.p[8], uint(e), row);
        mine[r] = false;
        continue;
      }
      if (uint(e) < pc.p[9] || uint(e) >= pc.p[10]) {
        mine[r] = false;
        continue;
      }
      uint xb = (pc.p[6] != 0u ? tok : row) * I;
      float s = 0.0;
      for (uint c = tid; c < chunks; c += 64u) {
        float w[32];
        decode_chunk(type, (uint(e) - pc.p[9]) * O + o, I, c, w);
        uint e0 = c * 32u, ne = min(32u, I - e0);
        for (uint j = 0u; j < ne; ++j) s += w[j] * uintBitsToFloat(b1.d[xb + e0 + j]);
      }
      acc[r] = s;
    }
  }
  red[tid] = acc;
  barrier();
  for (uint s = 32u; s > 0u; s >>= 1) {
    if (tid < s) red[tid] += red[tid + s];
    barrier();
  }
  if (tid == 0u)
    for (uint r = 0u; r < nr; ++r)
      if (mine[r]) bo.d[(n0 + r) * O + o] = floatBitsToUint(red[0][r]);
}
