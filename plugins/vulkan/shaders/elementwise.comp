#version 450
// Add / Mul / Div with b right-aligned against a (stride 0 on broadcast axes), Scale, GeluTanh, Softcap,
// Clamp. p: 0 op (0 add, 1 mul, 2 scale, 3 gelu, 4 softcap, 5 div, 6 clamp), 1 count, 2 rank, 3..8 a dims (outermost first,
//    padded to 6), 9..14 b strides, 15 f (clamp: lo), 16 clamp: hi
#include "common.glsl"
layout(local_size_x = 256) in;

void main() {
  uint i = wg_linear() * 256u + gl_LocalInvocationID.x;
  if (i >= pc.p[1]) return;
  uint op = pc.p[0];
  float a = uintBitsToFloat(b0.d[i]), y;
  if (op <= 1u || op == 5u) {
    uint rest = i, bi = 0u;
    for (int k = 5; k >= 0; --k) {
      uint dim = pc.p[3 + k], idx = rest % dim;
      rest /= dim;
      bi += idx * pc.p[9 + k];
    }
    float b = uintBitsToFloat(b1.d[bi]);
    if (op == 5u) {
      // IEEE division: Vulkan's '/' may be 2.5 ulp off (and fma need not be fused), so the residual
      // a - q * b is formed exactly with Dekker's product and the quotient corrected once.
      precise float q = a / b;
      y = q;
      if (b != 0.0 && q != 0.0 && abs(q) < 1e30 && abs(b) < 1e30 && abs(b) > 1e-30 && !isnan(q)) {
        precise float ph = q * b;
        precise float cq = 4097.0 * q, qh = cq - (cq - q), ql = q - qh;
        precise float cb = 4097.0 * b, bh = cb - (cb - b), bl = b - bh;
        precise float pl = ((qh * bh - ph) + qh * bl + ql * bh) + ql * bl;
        precise float r = (a - ph) - pl;
        precise float yq = q + r / b;
        y = yq;
      }
    } else {
      y = op == 0u ? a + b : a * b;
    }
  } else if (op == 2u) {
    y = a * pf(15);
  } else if (op == 3u) {
    float t = 0.7978845608028654 * (a + 0.044715 * a * a * a);
    y = 0.5 * a * (1.0 + tanh(t));
  } else if (op == 4u) {
    y = pf(15) * tanh(a / pf(15));
  } else {
    y = a < pf(15) ? pf(15) : (a > pf(16) ? pf(16) : a);
  }
  bo.d[i] = floatBitsToUint(y);
}
