// The SDK's float32 sampling rule (sdk/src/sampling_rule.cpp) for the one-thread sampler shaders
// (top_p_draw.comp, accept_drafts.comp): rule_exp with every product and sum `precise` (rounded on its
// own: Vulkan rounds +, -, * correctly; no fused multiply-add), no division and no built-in exp.

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

// A candidate's weight: rule_exp(x * inv_t - top), the product rounded before the difference (top is
// the row's highest logit times inv_t, rounded once).
float scaled_weight(float x, float top, float inv_t) {
  precise float a = x * inv_t;
  precise float d = a - top;
  return rule_exp(d);
}
