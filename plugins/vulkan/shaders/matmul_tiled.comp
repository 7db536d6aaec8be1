#version 450
// MatMul of many activation rows (prefill): a workgroup computes a tile of 64 output columns (one per
// thread) by TN activation rows. For each 32-value chunk of the inputs the workgroup stages the TN rows'
// chunk in shared memory, and each thread decodes its weight row's chunk once, in registers, for all TN
// rows: a weight is decoded N / TN times in all (N / 8 in matmul.comp) and no reduction is needed.
// Push constants: PC_MM_* (mode 0 only) and PC_MLX_*, windows as in matmul.comp.
#include "common.glsl"
layout(local_size_x = 64) in;
const uint TN = 32u;  // activation rows per workgroup
shared float xs[TN * 32u];

void main() {
  uint type = pc.p[PC_MM_TYPE], O = pc.p[PC_MM_O], I = pc.p[PC_MM_I], N = pc.p[PC_MM_N];
  uint Ow = pc.p[PC_MM_WIN_COUNT], wgs = (Ow + 63u) / 64u;
  uint tid = gl_LocalInvocationID.x, id = wg_linear();
  uint wrow = (id % wgs) * 64u + tid, n0 = (id / wgs) * TN;  // wrow: the row of the bound window
  if (n0 >= N) return;
  bool valid = wrow < Ow;
  uint nr = min(TN, N - n0), chunks = (I + 31u) / 32u;
  float acc[TN];
  for (uint r = 0u; r < TN; ++r) acc[r] = 0.0;
  for (uint c = 0u; c < chunks; ++c) {
    uint e0 = c * 32u, ne = min(32u, I - e0);
    barrier();  // the previous chunk's reads are done
    for (uint k = tid; k < TN * 32u; k += 64u) {
      uint r = k / 32u, j = k % 32u;
      xs[k] = r < nr && j < ne ? uintBitsToFloat(b1.d[(n0 + r) * I + e0 + j]) : 0.0;
    }
    barrier();
    if (!valid) continue;
    float w[32];
    decode_chunk(type, wrow, I, c, w);
    for (uint r = 0u; r < nr; ++r) {
      float s = 0.0;
      for (uint j = 0u; j < ne; ++j) s += w[j] * xs[r * 32u + j];
      acc[r] += s;
    }
  }
  if (!valid) return;
  uint o = wrow + pc.p[PC_MM_WIN_FIRST];
  for (uint r = 0u; r < nr; ++r) bo.d[(n0 + r) * O + o] = floatBitsToUint(acc[r]);
}
