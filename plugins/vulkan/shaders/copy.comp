#version 450
// Data movement and conversion, one thread per output word:
//  op 0 Slice   out[r, j] = a[r, start + j]                         (32-bit values)
//  op 1 Concat  out[r, j] = j < ca ? a[r, j] : b[r, j - ca]           (32-bit values)
//  op 2 Copy    F32 -> dst type (F32, F16, BF16), flat
//  op 3 WriteRows: rows b0 [N, C] into dst bo at rows ids b2 [N] (dst type F32/I32/F16/BF16)
//  op 4 Scatter (after a copy of a into bo): bo[ids b1[m]] = values b2[m], one thread per m; p[3] = N
//  op 5 Gather (GetRows of an I32 table): out[r, j] = b0[ids b1[r], j]; p[2] = C, p[3] = R
// Push constants: PC_COPY_* (push_constants.h).
#include "common.glsl"
layout(local_size_x = 256) in;

uint encode(uint type, float v) { return type == T_F16 ? f32_to_f16(v) : f32_to_bf16(v); }

void main() {
  uint w = wg_linear() * 256u + gl_LocalInvocationID.x;
  if (w >= pc.p[PC_COPY_WORDS]) return;
  uint op = pc.p[PC_COPY_OP];
  if (op == 0u) {
    uint len = pc.p[PC_COPY_OUT_COLS], r = w / len, j = w % len;
    bo.d[w] = b0.d[r * pc.p[PC_COPY_COLS] + pc.p[PC_COPY_ARG] + j];
  } else if (op == 1u) {
    uint ca = pc.p[PC_COPY_COLS], cb = pc.p[PC_COPY_ARG], cc = ca + cb, r = w / cc, j = w % cc;
    bo.d[w] = j < ca ? b0.d[r * ca + j] : b1.d[r * cb + j - ca];
  } else if (op == 2u) {
    uint type = pc.p[PC_COPY_TYPE];
    if (type == T_F32) {
      bo.d[w] = b0.d[w];
    } else {
      uint n = pc.p[PC_COPY_COUNT], i = 2u * w;
      uint lo = encode(type, uintBitsToFloat(b0.d[i]));
      uint hi = i + 1u < n ? encode(type, uintBitsToFloat(b0.d[i + 1u])) : 0u;
      bo.d[w] = lo | (hi << 16);
    }
  } else if (op == 4u) {
    int id = int(b1.d[w]);
    if (id < 0 || uint(id) >= pc.p[PC_COPY_ARG]) {
      report(pc.p[PC_COPY_NODE], uint(id), w);
      return;
    }
    bo.d[uint(id)] = b2.d[w];
  } else if (op == 5u) {
    uint C = pc.p[PC_COPY_COLS], r = w / C, j = w % C;
    int id = int(b1.d[r]);
    if (id < 0 || uint(id) >= pc.p[PC_COPY_ARG]) {
      if (j == 0u) report(pc.p[PC_COPY_NODE], uint(id), r);
      return;
    }
    bo.d[w] = b0.d[uint(id) * C + j];
  } else {
    uint type = pc.p[PC_COPY_TYPE], C = pc.p[PC_COPY_COLS], R = pc.p[PC_COPY_ARG];
    bool wide = type == T_F32 || type == T_I32;
    uint per_row = wide ? C : C / 2u;
    uint r = w / per_row, j = w % per_row;
    int id = int(b2.d[r]);
    if (id < 0 || uint(id) >= R) {
      if (j == 0u) report(pc.p[PC_COPY_NODE], uint(id), r);
      return;
    }
    if (wide) {
      bo.d[uint(id) * C + j] = b0.d[r * C + j];
    } else {
      float a = uintBitsToFloat(b0.d[r * C + 2u * j]), b = uintBitsToFloat(b0.d[r * C + 2u * j + 1u]);
      bo.d[(uint(id) * C) / 2u + j] = encode(type, a) | (encode(type, b) << 16);
    }
  }
}
