#version 450
// GetRows (and the conversion of any stored operand to F32: ids = identity): one thread per 32-value
// chunk of an output row. p: 0 type, 1 R, 2 C, 3 rows out, 4 identity, 5 node, 6..7 the table rows
// [first, end) bound at binding 0 (a table above maxStorageBufferRange is bound in windows, one dispatch
// each; ids outside the window are another dispatch's), 24..26 MLX parameters (common.glsl; scales and
// biases then at bindings 3 and 4)
#include "common.glsl"
layout(local_size_x = 64) in;

void main() {
  uint type = pc.p[0], R = pc.p[1], C = pc.p[2], rows = pc.p[3];
  uint chunks = (C + 31u) / 32u;
  uint gid = wg_linear() * 64u + gl_LocalInvocationID.x;
  if (gid >= rows * chunks) return;
  uint r = gid / chunks, c = gid % chunks;
  uint src = r;
  if (pc.p[4] == 0u) {
    int id = int(b1.d[r]);
    if (id < 0 || uint(id) >= R) {
      report(pc.p[5], uint(id), r);
      return;
    }
    if (uint(id) < pc.p[6] || uint(id) >= pc.p[7]) return;
    src = uint(id) - pc.p[6];
  }
  float w[32];
  decode_chunk(type, src, C, c, w);
  uint e0 = c * 32u, ne = min(32u, C - e0);
  for (uint j = 0u; j < ne; ++j) bo.d[r * C + e0 + j] = floatBitsToUint(w[j]);
}
