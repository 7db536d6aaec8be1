#version 450
// MatMul of many activation rows (prefill) on cooperative matrices (VK_NV_cooperative_matrix: tensor
// cores): a workgroup of four subgroups computes a tile of 64 activation rows by 64 output columns. For
// each 64-value step along the inputs it decodes the 64 weight rows' values once (decode8.glsl: eight
// threads a row, 64 neighbouring values, so the loads coalesce) and stages them with the activations in
// shared memory as fp16 (rows padded to 72 values: fewer bank conflicts, 16-byte aligned tiles); each
// subgroup then multiplies its 16 rows by the 64 columns, summing in fp32 registers.
// The activations are rounded to fp16 (saturated at +-65504, never infinite) and the decoded weights too:
// products differ from the fp32 shaders by about 2^-11 relative per term, far below the weights'
// quantization (the Vulkan tests bound it against the CPU).
// Push constants: PC_MM_* (mode 0 only) and PC_MLX_*, windows as in matmul.comp. Built for tiles of
// CM_M x CM_N x 16 (defines, from the shapes the device lists; vk_backend.cpp picks one).
#extension GL_NV_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#extension GL_KHR_memory_scope_semantics : require
#include "common.glsl"
#include "decode8.glsl"
#ifndef CM_M
#define CM_M 16
#endif
#ifndef CM_N
#define CM_N 16
#endif
const uint CM_K = 16u;
layout(local_size_x = 128) in;
const uint BR = 64u, BC = 64u, BK = 64u;  // rows, columns and inputs per step
const uint LD = BK + 8u;                    // the staged rows' stride
const uint SUBGROUPS = 4u, ROWS_PER_SG = BR / SUBGROUPS;  // 16 rows a subgroup
const uint MT = ROWS_PER_SG / CM_M, NT = BC / CM_N;         // its tiles of CM_M x CM_N
shared float16_t xs[BR * LD];  // activations [row][k]
shared float16_t ws[BC * LD];  // weights [column][k]: B = W^T read column-major
shared float cs[BR * BC];      // the result tile [row][column], for a bounds-checked store

float16_t to_half(float v) { return float16_t(clamp(v, -65504.0, 65504.0)); }

void main() {
  uint O = pc.p[PC_MM_O], I = pc.p[PC_MM_I], N = pc.p[PC_MM_N], type = pc.p[PC_MM_TYPE];
  uint Ow = pc.p[PC_MM_WIN_COUNT], wgs = (Ow + BC - 1u) / BC;
  uint id = wg_linear(), c0 = (id % wgs) * BC, n0 = (id / wgs) * BR;  // c0: a row of the bound window
  if (n0 >= N) return;
  uint tid = gl_LocalInvocationID.x, sg = tid / 32u;
  uint chunks = (I + 31u) / 32u;
  fcoopmatNV<32, gl_ScopeSubgroup, CM_M, CM_N> acc[MT][NT];
  for (uint i = 0u; i < MT; ++i)
    for (uint j = 0u; j < NT; ++j) acc[i][j] = fcoopmatNV<32, gl_ScopeSubgroup, CM_M, CM_N>(0.0);
  for (uint c = 0u; c < chunks; c += BK / 32u) {
    barrier();  // the previous step's reads are done
    for (uint it = tid; it < BC * 8u; it += 128u) {  // weights: eight values of column c0 + it / 8
      uint col = it / 8u, sub = it % 8u, cc = c + sub / 4u;
      float w[8];
      if (c0 + col < Ow && cc < chunks) decode8(type, c0 + col, I, cc, sub % 4u, w);
      else for (uint j = 0u; j < 8u; ++j) w[j] = 0.0;
      for (uint j = 0u; j < 8u; ++j) ws[col * LD + sub * 8u + j] = to_half(w[j]);
    }
    for (uint k = tid; k < BR * BK; k += 128u) {  // activations, zero past N and I
      uint r = k / BK, e = c * 32u + k % BK;
      xs[r * LD + k % BK] = n0 + r < N && e < I ? to_half(uintBitsToFloat(b1.d[(n0 + r) * I + e])) : float16_t(0.0);
    }
    barrier();
    for (uint k0 = 0u; k0 < BK; k0 += CM_K) {
      for (uint i = 0u; i < MT; ++i) {
        fcoopmatNV<16, gl_ScopeSubgroup, CM_M, CM_K> a;
        coopMatLoadNV(a, xs, (sg * ROWS_PER_SG + i * CM_M) * LD + k0, LD, false);
        for (uint j = 0u; j < NT; ++j) {
          fcoopmatNV<16, gl_ScopeSubgroup, CM_K, CM_N> b;
          coopMatLoadNV(b, ws, (j * CM_N) * LD + k0, LD, true);
          acc[i][j] = coopMatMulAddNV(a, b, acc[i][j]);
        }
      }
    }
  }
  for (uint i = 0u; i < MT; ++i)
    for (uint j = 0u; j < NT; ++j)
      coopMatStoreNV(acc[i][j], cs, (sg * ROWS_PER_SG + i * CM_M) * BC + j * CM_N, BC, false);
  barrier();
  uint first = pc.p[PC_MM_WIN_FIRST];
  for (uint k = tid; k < BR * BC; k += 128u) {
    uint r = k / BC, col = k % BC;
    if (n0 + r < N && c0 + col < Ow) bo.d[(n0 + r) * O + first + c0 + col] = floatBitsToUint(cs[k]);
  }
}
