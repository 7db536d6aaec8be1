#version 450
// TopPDraw by the SDK's sampling rule (sdk/src/sampling_rule.cpp, which the host sampler follows): one
// thread, float32, sums left to right, every product and sum `precise` (rounded on its own: Vulkan
// rounds +, -, * correctly), no division and no built-in exp, so the token is the host's bit for bit.
// b0 logits F32 [K] highest first, b1 uniform F32 [1], b2 ids I32 [K] -> bo I32 [1].
// Push constants: PC_DRAW_* (push_constants.h).
#include "common.glsl"
#include "sampling_rule.glsl"
layout(local_size_x = 1) in;

float lg(uint k) { return uintBitsToFloat(b0.d[k]); }

float weight(uint k, float top, float it) { return scaled_weight(lg(k), top, it); }

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
  // No running sum above the target (u * mass rounded up to the mass): the last kept candidate with a
  // nonzero weight (specula::pick_by_weight).
  uint pick = 0u;
  for (uint k = 0u; k < keep; ++k) {
    float w = weight(k, top, it);
    cum += w;
    if (cum > target) {
      pick = k;
      break;
    }
    if (w > 0.0) pick = k;
  }
  bo.d[0] = b2.d[pick];
}
