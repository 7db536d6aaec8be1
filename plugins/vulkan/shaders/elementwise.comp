#version 450
// Add / Mul / Div with b right-aligned against a (stride 0 on broadcast axes), Scale, GeluTanh, Softcap,
// Clamp. Push constants: PC_EW_* (push_constants.h).
#include "common.glsl"
layout(local_size_x = 256) in;

// tanh to within about 4e-7 relative everywhere: a 13/6 rational in x (Eigen's float tanh), clamped where
// tanh rounds to +-1. GLSL's tanh is specified only through exp and a quotient, which lose most digits
// near 0 (lavapipe: 2.5e-6 relative at x = 0.03).
float tanh_rational(float x) {
  if (abs(x) < 0.0004) return x;
  x = clamp(x, -7.90531110763549805, 7.90531110763549805);
  float x2 = x * x;
  float p = -2.76076847742355e-16;
  p = p * x2 + 2.00018790482477e-13;
  p = p * x2 - 8.60467152213735e-11;
  p = p * x2 + 5.12229709037114e-08;
  p = p * x2 + 1.48572235717979e-05;
  p = p * x2 + 6.37261928875436e-04;
  p = p * x2 + 4.89352455891786e-03;
  float q = 1.19825839466702e-06;
  q = q * x2 + 1.18534705686654e-04;
  q = q * x2 + 2.26843463243900e-03;
  q = q * x2 + 4.89352518554385e-03;
  return x * p / q;
}

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
    // 0.5 (1 + tanh t) as 1 / (1 + e^-2t): no cancellation where tanh t is near -1 (x below about -4).
    float t = 0.7978845608028654 * (a + 0.044715 * a * a * a);
    y = a / (1.0 + exp(-2.0 * t));
  } else if (op == 4u) {
    y = pf(PC_EW_F0) * tanh_rational(a / pf(PC_EW_F0));
  } else {
    y = a < pf(PC_EW_F0) ? pf(PC_EW_F0) : (a > pf(PC_EW_F1) ? pf(PC_EW_F1) : a);
  }
  bo.d[i] = floatBitsToUint(y);
}
