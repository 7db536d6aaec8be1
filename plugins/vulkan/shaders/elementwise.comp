#version 450
// Add / Mul with b right-aligned against a (stride 0 on broadcast axes), Scale, GeluTanh, Softcap.
// p: 0 op (0 add, 1 mul, 2 scale, 3 gelu, 4 softcap), 1 count, 2 rank, 3..8 a dims (outermost first,
//    padded to 6), 9..14 b strides, 15 f
#include "common.glsl"
layout(local_size_x = 256) in;

void main() {
  uint i = wg_linear() * 256u + gl_LocalInvocationID.x;
  if (i >= pc.p[1]) return;
  uint op = pc.p[0];
  float a = uintBitsToFloat(b0.d[i]), y;
  if (op <= 1u) {
    uint rest = i, bi = 0u;
    for (int k = 5; k >= 0; --k) {
      uint dim = pc.p[3 + k], idx = rest % dim;
      rest /= dim;
      bi += idx * pc.p[9 + k];
    }
    float b = uintBitsToFloat(b1.d[bi]);
    y = op == 0u ? a + b : a * b;
  } else if (op == 2u) {
    y = a * pf(15);
  } else if (op == 3u) {
    float t = 0.7978845608028654 * (a + 0.044715 * a * a * a);
    y = 0.5 * a * (1.0 + tanh(t));
  } else {
    y = pf(15) * tanh(a / pf(15));
  }
  bo.d[i] = floatBitsToUint(y);
}
