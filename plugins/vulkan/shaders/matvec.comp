#version 450
// MatMul of a few activation rows (decode, a verification): a workgroup of 128 threads covers four weight
// rows, one team of 32 threads each, and a group of up to eight activation rows. A team walks its weight
// row 256 values at a time: thread `lane` decodes the eight values of part lane % 4 of chunk lane / 4
// (decode8.glsl), so the team reads a contiguous stretch of the row and the loads coalesce, and
// multiplies them with every activation row of the group (each value decoded once for all of them). The
// team's 32 partial sums of a row are then added as a tree (strides 16 .. 1): by shuffles where
// subgroups hold whole teams (SUBGROUP_REDUCE, matvec_subgroup), else in shared memory; the same
// additions in the same order, so both give the same bits, and a row's result never depends on how many
// rows share the dispatch (a verification scores a token exactly as a decode step does).
// Push constants: PC_MM_* (mode 0) and PC_MLX_*, windows as in matmul.comp.
#ifdef SUBGROUP_REDUCE
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#include "common.glsl"
#include "decode8.glsl"
layout(local_size_x = 128) in;
layout(std430, set = 0, binding = 1) readonly buffer B1V { vec4 v[]; } xv;  // binding 1 as vec4 (I % 4 == 0)
const uint NR = 8u;  // activation rows per workgroup
#ifndef SUBGROUP_REDUCE
shared float red[NR * 128u];
#endif

void main() {
  uint type = pc.p[PC_MM_TYPE], O = pc.p[PC_MM_O], I = pc.p[PC_MM_I], N = pc.p[PC_MM_N];
  uint Ow = pc.p[PC_MM_WIN_COUNT], wgs = (Ow + 3u) / 4u;
  uint tid = gl_LocalInvocationID.x, lane = tid % 32u, team = tid / 32u;
  uint id = wg_linear(), wrow = (id % wgs) * 4u + team, n0 = (id / wgs) * NR;  // wrow: row of the window
  if (n0 >= N) return;
  uint nr = min(NR, N - n0);
  bool valid = wrow < Ow;
  uint chunks = (I + 31u) / 32u, part = lane % 4u;
  bool vec_x = (I & 3u) == 0u;
  float acc[NR];
  for (uint r = 0u; r < NR; ++r) acc[r] = 0.0;
  if (valid) {
    for (uint c = lane / 4u; c < chunks; c += 8u) {
      float w[8];
      decode8(type, wrow, I, c, part, w);
      uint e0 = c * 32u + part * 8u;
      for (uint r = 0u; r < nr; ++r) {
        uint xb = (n0 + r) * I + e0;
        float s = 0.0;
        if (vec_x) {
          vec4 a = xv.v[xb >> 2], b = xv.v[(xb >> 2) + 1u];
          s = w[0] * a.x + w[1] * a.y + w[2] * a.z + w[3] * a.w + w[4] * b.x + w[5] * b.y + w[6] * b.z + w[7] * b.w;
        } else {
          for (uint k = 0u; k < 8u && e0 + k < I; ++k) s += w[k] * uintBitsToFloat(b1.d[xb + k]);
        }
        acc[r] += s;
      }
    }
  }
#ifdef SUBGROUP_REDUCE
  for (uint s = 16u; s > 0u; s >>= 1)
    for (uint r = 0u; r < NR; ++r) acc[r] += subgroupShuffleXor(acc[r], s);
#else
  for (uint r = 0u; r < NR; ++r) red[r * 128u + tid] = acc[r];
  barrier();
  for (uint s = 16u; s > 0u; s >>= 1) {
    if (lane < s)
      for (uint r = 0u; r < nr; ++r) red[r * 128u + tid] += red[r * 128u + tid + s];
    barrier();
  }
  for (uint r = 0u; r < nr; ++r) acc[r] = red[r * 128u + tid];
#endif
  if (valid && lane == 0u) {
    uint o = wrow + pc.p[PC_MM_WIN_FIRST];
    for (uint r = 0u; r < nr; ++r) bo.d[(n0 + r) * O + o] = floatBitsToUint(acc[r]);
  }
}
