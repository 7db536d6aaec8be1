#version 450
// TopPDraw by the SDK's sampling rule (sdk/src/sampling_rule.cpp, which the host sampler follows): one
// thread, float32, sums left to right, every product and sum `precise` (rounded on its own: Vulkan
// rounds +, -, * correctly), no division and no built-in exp, so the token is the host's bit for bit.
// b0 logits F32 [K] highest first, b1 uniform F32 [1], b2 ids I32 [K] -> bo I32 [1].
// Push constants: PC_DRAW_* (push_constants.h).
#include "common.glsl"
layout(local_size_x = 1) in;

float lg(uint k) { return uintBitsToFloat(b0.d[k]); }

// The constants as the C++ rule's float literals round (bit patterns: no decimal parsing to differ).
const uint kLog2eBits = 0x3FB8AA3Bu, kLn2HiBits = 0x3F317200u, kLn2LoBits = 0x35BFBE8Eu, kC6Bits = 0x3AB60B61u,
           kC5Bits = 0x3C088889u, kC4Bits = 0x3D2AAAABu, kC3Bits = 0x3E2AAAABu;

float rule_exp(float d) {
  if (!(d > -87.0)) return 0.0;
  float kLog2e = uintBitsToFloat(kLog2eBits), kLn2Hi = uintBitsToFloat(kLn2HiBits), kLn2Lo = uintBitsToFloat(kLn2LoBits);
  float kC6 = uintBitsToFloat(kC6Bits), kC5 = uintBitsToFloat(kC5Bits), kC4 = uintBitsToFloat(kC4Bits),
        kC3 = uintBitsToFloat(kC3Bits);
  precise float t = d * kLog2e;
  precise float n = floor(t + 0.5);
  if (n < -125.0) return 0.0;
  precise float r = d - n * kLn2Hi;
  r = r - n * kLn2Lo;
  precise float p = kC6;
  p = p * r + kC5;
  p = p * r + kC4;
  p = p * r + kC3;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  precise float e = p * uintBitsToFloat(uint(int(n) + 127) << 23);
  return e;
}

float weight(uint k, float top, float it) {
  precise float a = lg(k) * it;
  precise float d = a - top;
  return rule_exp(d);
}

void main() {
  uint K = pc.p[PC_DRAW_K];
  float top_p = pf(PC_DRAW_TOP_P), min_p = pf(PC_DRAW_MIN_P), it = pf(PC_DRAW_INV_T);
  precise float top = lg(0u) * it;
  uint n = K;
  if (min_p > 0.0) {
    n = 1u;
    while (n < K && weight(n, top, it) >= min_p) ++n;
  }
  uint keep = n;
  if (top_p < 1.0) {
    precise float total = 0.0;
    for (uint k = 0u; k < n; ++k) total += weight(k, top, it);
    precise float target = top_p * total;
    precise float cum = 0.0;
    for (uint k = 0u; k < n; ++k) {
      cum += weight(k, top, it);
      if (cum >= target) {
        keep = k + 1u;
        break;
      }
    }
  }
  precise float mass = 0.0;
  for (uint k = 0u; k < keep; ++k) mass += weight(k, top, it);
  precise float target = clamp(uintBitsToFloat(b1.d[0]), 0.0, 1.0) * mass;
  precise float cum = 0.0;
  uint pick = keep - 1u;
  for (uint k = 0u; k < keep; ++k) {
    cum += weight(k, top, it);
    if (cum > target) {
      pick = k;
      break;
    }
  }
  bo.d[0] = b2.d[pick];
}
