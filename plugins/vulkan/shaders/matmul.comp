#version 450
// MatMul and MatMulId of a few activation rows: a workgroup covers 64 / tpr output columns o and a group of
// up to 8 activation rows; tpr (PC_MM_TPR, a power of two, about the row's 32-value chunk count) threads
// share a weight row, striding over its chunks and decoding each chunk once for all rows of the group,
// then sum their partial dot products.
// Push constants: PC_MM_* and PC_MLX_* (push_constants.h). Weights above maxStorageBufferRange are split
// in windows, one dispatch each; MLX scales and biases are at bindings 3 and 4.
// Built twice: with SUBGROUP_REDUCE (matmul_subgroup) the last strides of a row's reduction, those within
// a subgroup, are shuffles instead of shared-memory steps with barriers. Lane 0 adds the same partial
// sums in the same order either way, so both give the same bits. It assumes subgroups are runs of
// gl_SubgroupSize consecutive invocations, as on every driver of a one-dimensional workgroup.
#ifdef SUBGROUP_REDUCE
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#include "common.glsl"
layout(local_size_x = 64) in;
const uint NR = 8u;  // activation rows per workgroup
shared float red[NR * 64u];

void main() {
  uint type = pc.p[PC_MM_TYPE], O = pc.p[PC_MM_O], I = pc.p[PC_MM_I], N = pc.p[PC_MM_N], mode = pc.p[PC_MM_MODE], K = pc.p[PC_MM_K];
  uint Ow = mode == 0u ? pc.p[PC_MM_WIN_COUNT] : O;
  uint tpr = pc.p[PC_MM_TPR], rpw = 64u / tpr, wgs = (Ow + rpw - 1u) / rpw;
  uint tid = gl_LocalInvocationID.x, lane = tid % tpr;
  uint id = wg_linear(), o = (id % wgs) * rpw + tid / tpr, g = id / wgs, n0 = g * NR;
  bool valid = o < Ow;
  uint wrow = o;  // row of the bound window
  if (mode == 0u) o += pc.p[PC_MM_WIN_FIRST];
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
      if (e < 0 || uint(e) >= pc.p[PC_MM_E]) {
        if (lane == 0u) report(pc.p[PC_MM_NODE], uint(e), row);
        mine[r] = false;
        continue;
      }
      if (uint(e) < pc.p[PC_MM_WIN_FIRST] || uint(e) >= pc.p[PC_MM_WIN_COUNT]) {
        mine[r] = false;
        continue;
      }
      uint xb = (pc.p[PC_MM_X_SHARED] != 0u ? tok : row) * I;
      float s = 0.0;
      for (uint c = lane; c < chunks; c += tpr) {
        float w[32];
        decode_chunk(type, (uint(e) - pc.p[PC_MM_WIN_FIRST]) * O + o, I, c, w);
        uint e0 = c * 32u, ne = min(32u, I - e0);
        for (uint j = 0u; j < ne; ++j) s += w[j] * uintBitsToFloat(b1.d[xb + e0 + j]);
      }
      acc[r] = s;
    }
  }
  // Strides tpr/2 .. lo in shared memory, then lo/2 .. 1 by shuffles: the same additions in the same order.
  uint lo = 1u;
#ifdef SUBGROUP_REDUCE
  lo = min(tpr, gl_SubgroupSize);
#endif
  if (tpr > lo) {
    for (uint r = 0u; r < NR; ++r) red[r * 64u + tid] = acc[r];
    barrier();
    for (uint s = tpr / 2u; s >= lo; s >>= 1) {
      if (lane < s)
        for (uint r = 0u; r < nr; ++r) red[r * 64u + tid] += red[r * 64u + tid + s];
      barrier();
    }
    for (uint r = 0u; r < nr; ++r) acc[r] = red[r * 64u + tid];
  }
#ifdef SUBGROUP_REDUCE
  for (uint s = lo / 2u; s > 0u; s >>= 1)
    for (uint r = 0u; r < nr; ++r) acc[r] += subgroupShuffleXor(acc[r], s);
#endif
  if (lane == 0u)
    for (uint r = 0u; r < nr; ++r)
      if (mine[r]) bo.d[(n0 + r) * O + o] = floatBitsToUint(acc[r]);
}
