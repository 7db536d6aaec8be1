#version 450
// GetRows (and the conversion of any stored operand to F32: ids = identity): one thread per 32-value
// chunk of an output row. Push constants: PC_GR_* and PC_MLX_* (push_constants.h). A table above
// maxStorageBufferRange is bound in windows, one dispatch each; ids outside the window are another
// dispatch's. MLX scales and biases are at bindings 3 and 4.
#include "common.glsl"
layout(local_size_x = 64) in;

void main() {
  uint type = pc.p[PC_GR_TYPE], R = pc.p[PC_GR_R], C = pc.p[PC_GR_C], rows = pc.p[PC_GR_ROWS];
  uint chunks = (C + 31u) / 32u;
  uint gid = wg_linear() * 64u + gl_LocalInvocationID.x;
  if (gid >= rows * chunks) return;
  uint r = gid / chunks, c = gid % chunks;
  uint src = r;
  if (pc.p[PC_GR_IDENTITY] == 0u) {
    int id = int(b1.d[r]);
    if (id < 0 || uint(id) >= R) {
      report(pc.p[PC_GR_NODE], uint(id), r);
      return;
    }
    if (uint(id) < pc.p[PC_GR_FIRST] || uint(id) >= pc.p[PC_GR_END]) return;
    src = uint(id) - pc.p[PC_GR_FIRST];
  }
  float w[32];
  decode_chunk(type, src, C, c, w);
  uint e0 = c * 32u, ne = min(32u, C - e0);
  for (uint j = 0u; j < ne; ++j) bo.d[r * C + e0 + j] = floatBitsToUint(w[j]);
}
