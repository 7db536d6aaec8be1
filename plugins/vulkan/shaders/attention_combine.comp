#version 450
// The second pass of attention split into chunks of slots (attention.comp with PC_ATT_CHUNK): one
// workgroup per (query, head) merges the chunks' partial softmax states in chunk order,
//   M = max m_c,  L = sum l_c e^(m_c - M),  out = sum acc_c e^(m_c - M) / L,
// skipping chunks that saw no slot (l_c = 0); zeros when no chunk saw one, as the one-pass shader.
// b0 partials [rows, chunks, 2 + Dv] (m, l, unnormalised output) -> bo F32 [rows, Dv].
// Push constants: PC_ATT_DV, PC_ATT_CHUNKS (push_constants.h).
#include "common.glsl"
layout(local_size_x = 64) in;
const uint kMaxChunks = 512u;  // vk_lower.cpp's kAttentionWorkgroups
shared float weight[kMaxChunks];  // e^(m_c - M), 0 for a chunk that saw no slot

void main() {
  uint Dv = pc.p[PC_ATT_DV], chunks = pc.p[PC_ATT_CHUNKS], row = wg_linear(), tid = gl_LocalInvocationID.x;
  uint pb = row * chunks * (Dv + 2u);
  const float neg_inf = -1.0 / 0.0;
  float M = neg_inf;
  for (uint c = 0u; c < chunks; ++c)
    if (uintBitsToFloat(b0.d[pb + c * (Dv + 2u) + 1u]) > 0.0) M = max(M, uintBitsToFloat(b0.d[pb + c * (Dv + 2u)]));
  // Each chunk's weight once, shared by every output dimension.
  for (uint c = tid; c < chunks; c += 64u) {
    uint cb = pb + c * (Dv + 2u);
    weight[c] = uintBitsToFloat(b0.d[cb + 1u]) > 0.0 ? exp(uintBitsToFloat(b0.d[cb]) - M) : 0.0;
  }
  barrier();
  float L = 0.0;
  for (uint c = 0u; c < chunks; ++c)
    if (weight[c] > 0.0) L += uintBitsToFloat(b0.d[pb + c * (Dv + 2u) + 1u]) * weight[c];
  for (uint d = tid; d < Dv; d += 64u) {
    float a = 0.0;
    for (uint c = 0u; c < chunks; ++c)
      if (weight[c] > 0.0) a += uintBitsToFloat(b0.d[pb + c * (Dv + 2u) + 2u + d]) * weight[c];
    bo.d[row * Dv + d] = floatBitsToUint(L > 0.0 ? a / L : 0.0);
  }
}
