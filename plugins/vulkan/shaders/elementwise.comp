#version 450
// Add / Mul / Div with b right-aligned against a (stride 0 on broadcast axes), Scale, GeluTanh, Softcap,
// Clamp. Push constants: PC_EW_* (push_constants.h).
#include "common.glsl"
layout(local_size_x = 256) in;

void main() {
  uint i = wg_linear() * 256u + gl_LocalInvocationID.x;
  if (i >= pc.p[PC_EW_COUNT]) return;
  uint op = pc.p[PC_EW_OP];
  float a = uintBitsToFloat(b0.d[i]), y;
  if (op <= 1u || op == 5u) {
    uint rest = i, bi = 0u;
    for (int k = 5; k >= 0; --k) {
      uint dim = pc.p[PC_EW_A_DIMS + k], idx = rest % dim;
      rest /= dim;
      bi += idx * pc.p[PC_EW_B_STRIDES + k];
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
    y = a * pf(PC_EW_F0);
  } else if (op == 3u) {
    float t = 0.7978845608028654 * (a + 0.044715 * a * a * a);
    y = 0.5 * a * (1.0 + tanh(t));
  } else if (op == 4u) {
    y = pf(PC_EW_F0) * tanh(a / pf(PC_EW_F0));
  } else {
    y = a < pf(PC_EW_F0) ? pf(PC_EW_F0) : (a > pf(PC_EW_F1) ? pf(PC_EW_F1) : a);
  }
  bo.d[i] = floatBitsToUint(y);
}
