#version 450
// MatMul and MatMulId: a workgroup covers 64 / p[11] output columns o and a group of up to 8 activation
// rows; p[11] (a power of two, about the row's 32-value chunk count) threads share a weight row, striding
// over its chunks and decoding each chunk once for all rows of the group, then reduce in shared memory.
// p: 0 weight type, 1 O, 2 I, 3 N (activation rows), 4 mode (0 matmul, 1 matmul_id), 5 K,
//    6 x_shared (x has one row per token for all K), 7 E, 8 node, 9..10 the window bound at binding 0
//    (weights above maxStorageBufferRange are split in windows, one dispatch each): matmul: first output
//    column and count; matmul_id: experts [first, end); 11 threads per weight row; 24..26 MLX parameters
//    (common.glsl; scales and biases then at bindings 3 and 4)
#include "common.glsl"
layout(local_size_x = 64) in;
const uint NR = 8u;  // activation rows per workgroup
shared float red[NR * 64u];

void main() {
  uint type = pc.p[0], O = pc.p[1], I = pc.p[2], N = pc.p[3], mode = pc.p[4], K = pc.p[5];
  uint Ow = mode == 0u ? pc.p[10] : O;
  uint tpr = pc.p[11], rpw = 64u / tpr, wgs = (Ow + rpw - 1u) / rpw;
  uint tid = gl_LocalInvocationID.x, lane = tid % tpr;
  uint id = wg_linear(), o = (id % wgs) * rpw + tid / tpr, g = id / wgs, n0 = g * NR;
  bool valid = o < Ow;
  uint wrow = o;  // row of the bound window
  if (mode == 0u) o += pc.p[9];
  if (n0 >= N) return;
  uint nr = min(NR, N - n0);
  uint chunks = (I + 31u) / 32u;
  float acc[NR];
  bool mine[NR];
  for (uint r = 0u; r < NR; ++r) {
    acc[r] = 0.0;
    mine[r] = valid;
  }
  if (!valid) {
  } else if (mode == 0u) {
    for (uint c = lane; c < chunks; c += tpr) {
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
        if (lane == 0u) report(pc.p[8], uint(e), row);
        mine[r] = false;
        continue;
      }
      if (uint(e) < pc.p[9] || uint(e) >= pc.p[10]) {
        mine[r] = false;
        continue;
      }
      uint xb = (pc.p[6] != 0u ? tok : row) * I;
      float s = 0.0;
      for (uint c = lane; c < chunks; c += tpr) {
        float w[32];
        decode_chunk(type, (uint(e) - pc.p[9]) * O + o, I, c, w);
        uint e0 = c * 32u, ne = min(32u, I - e0);
        for (uint j = 0u; j < ne; ++j) s += w[j] * uintBitsToFloat(b1.d[xb + e0 + j]);
      }
      acc[r] = s;
    }
  }
  for (uint r = 0u; r < NR; ++r) red[r * 64u + tid] = acc[r];
  barrier();
  for (uint s = tpr / 2u; s > 0u; s >>= 1) {
    if (lane < s)
      for (uint r = 0u; r < nr; ++r) red[r * 64u + tid] += red[r * 64u + tid + s];
    barrier();
  }
  if (lane == 0u)
    for (uint r = 0u; r < nr; ++r)
      if (mine[r]) bo.d[(n0 + r) * O + o] = floatBitsToUint(red[r * 64u + tid]);
}
