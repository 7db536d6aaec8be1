#version 450
// Attention, one workgroup per (query t, head j), or per (query, head, chunk of slots) with
// attention_combine.comp merging the chunks, over the slots in use only (operand 5, when the graph
// gives it) in tiles of 64: each thread scores one slot of a tile, then the tile's weights rescale and
// update a running maximum, sum and output (online softmax). No T x Hq x S buffer of scores is needed,
// and a decode step costs the live context, not the allocated one.
// A tile's scores are computed eight slots at a time by eight threads each: a thread reads two adjacent
// values of a key row in every 16, so eight threads read 32 (F16) or 64 (F32) contiguous bytes of it and
// a GPU's loads coalesce; each thread keeps its partial sums and one barrier later each slot's eight
// partials are added in lane order (the same bits on every device).
// Bindings: 0 q (F32), 1 K, 2 V (F32/F16/BF16), 3 key positions I32, 4 query positions I32, 5 out,
// 7 (operand 5) slots in use I32 [1].
// The inner loops go eight at a time (their constant inner loops unrolled): llvmpipe (lavapipe) stops
// a shader's loops after 65535 iterations in all, which a tile of 64 slots at head dim 512 otherwise
// reaches after 4000 slots; the lowering refuses contexts past the limit on such a device (vk_lower.cpp).
#include "common.glsl"
layout(local_size_x = 64) in;
shared float red[64];
shared float prob[64];
shared float qs[1024];       // the query row (head dims up to 1024: the host checks)
shared float part[64 * 8];   // per slot of the tile, its eight threads' partial dot products
const uint kMaxDvPerThread = 16u;  // V head dims up to 1024 (the host checks)

float wg_reduce(float v, bool is_max) {
  uint tid = gl_LocalInvocationID.x;
  red[tid] = v;
  barrier();
  for (uint s = 32u; s > 0u; s >>= 1) {
    if (tid < s) red[tid] = is_max ? max(red[tid], red[tid + s]) : red[tid] + red[tid + s];
    barrier();
  }
  float r = red[0];
  barrier();
  return r;
}

// Push constants: PC_ATT_* (push_constants.h).
void main() {
  uint T = pc.p[PC_ATT_T], Hq = pc.p[PC_ATT_HQ], D = pc.p[PC_ATT_D], S = pc.p[PC_ATT_S], Hkv = pc.p[PC_ATT_HKV], Dv = pc.p[PC_ATT_DV];
  int window = int(pc.p[PC_ATT_WINDOW]);
  bool causal = pc.p[PC_ATT_CAUSAL] != 0u;
  uint kt = pc.p[PC_ATT_K_TYPE], vt = pc.p[PC_ATT_V_TYPE];
  uint n = pc.p[PC_ATT_IN_USE] != 0u ? min(S, uint(max(int(b5.d[0]), 0))) : S;
  // Split into chunks (decode over a long context: more workgroups than queries x heads), a workgroup
  // takes slots [s0, s1) and leaves its running maximum, sum and unnormalised output for
  // attention_combine.comp; otherwise it takes them all and writes the output.
  uint chunk = pc.p[PC_ATT_CHUNK], chunks = max(pc.p[PC_ATT_CHUNKS], 1u), wg = wg_linear();
  uint row = wg / chunks, part_id = wg % chunks;
  uint s0 = chunk == 0u ? 0u : min(n, part_id * chunk), s1 = chunk == 0u ? n : min(n, s0 + chunk);
  uint t = row / Hq, j = row % Hq, kvh = j / (Hq / Hkv), tid = gl_LocalInvocationID.x;
  uint lane = tid % 8u, grp = tid / 8u;
  int qp = int(b4.d[t]);
  uint qb = (t * Hq + j) * D;
  for (uint d = tid; d < D; d += 64u) qs[d] = uintBitsToFloat(b0.d[qb + d]);
  barrier();
  const float neg_inf = -1.0 / 0.0;
  float m = neg_inf, l = 0.0;
  float acc[kMaxDvPerThread];
  for (uint k = 0u; k < kMaxDvPerThread; ++k) acc[k] = 0.0;
  bool pairs = (D & 1u) == 0u;
  for (uint base = s0; base < s1; base += 64u) {
    // Scores: slot base + 8 g + grp by the eight threads of group grp, for g = 0..7.
    for (uint g = 0u; g < 8u; ++g) {
      uint s = base + g * 8u + grp;
      float dot = 0.0;
      if (s < s1) {
        int kp = int(b3.d[s]);
        if (kp >= 0 && (!causal || kp <= qp) && (window <= 0 || abs(qp - kp) < window)) {
          uint kb = (s * Hkv + kvh) * D;
          if (pairs) {
            uint d = 2u * lane;
            for (; d + 48u < D; d += 64u)  // four steps of 16 at a time (fewer loop iterations: see the header)
              for (uint u = 0u; u < 64u; u += 16u)
                dot += qs[d + u] * load1(kt, kb + d + u) + qs[d + u + 1u] * load1(kt, kb + d + u + 1u);
            for (; d < D; d += 16u) dot += qs[d] * load1(kt, kb + d) + qs[d + 1u] * load1(kt, kb + d + 1u);
          } else {
            for (uint d = lane; d < D; d += 8u) dot += qs[d] * load1(kt, kb + d);
          }
        } else {
          dot = neg_inf;  // not visible: the sum below stays -inf
        }
      } else {
        dot = neg_inf;
      }
      part[(g * 8u + grp) * 8u + lane] = dot;
    }
    barrier();
    float sc = 0.0;
    for (uint u = 0u; u < 8u; ++u) sc += part[tid * 8u + u];
    sc = sc == neg_inf ? neg_inf : sc * pf(PC_ATT_SCALE);
    float tile_max = wg_reduce(sc, true);  // its barriers also end the reads of part[]
    if (tile_max == neg_inf) continue;  // nothing visible in this tile (the same on every thread)
    float m_new = max(m, tile_max);
    float c = exp(m - m_new);  // 0 for the first visible tile
    float e = sc == neg_inf ? 0.0 : exp(sc - m_new);
    prob[tid] = e;
    l = l * c + wg_reduce(e, false);  // its barriers also publish prob[]
    m = m_new;
    uint count = min(64u, s1 - base);
    for (uint k = 0u; k * 64u < Dv; ++k) {
      uint d = tid + 64u * k;
      if (d >= Dv) break;
      float a = acc[k] * c;
      uint i = 0u;
      for (; i + 8u <= count; i += 8u)
        for (uint u = 0u; u < 8u; ++u) {
          float p = prob[i + u];
          if (p != 0.0) a += p * load2(vt, ((base + i + u) * Hkv + kvh) * Dv + d);
        }
      for (; i < count; ++i) {
        float p = prob[i];
        if (p != 0.0) a += p * load2(vt, ((base + i) * Hkv + kvh) * Dv + d);
      }
      acc[k] = a;
    }
    barrier();  // prob[] is the next tile's
  }
  if (chunk != 0u) {  // partial: [m, l, acc[Dv]] per (row, part)
    uint pb = (row * chunks + part_id) * (Dv + 2u);
    if (tid == 0u) {
      bo.d[pb] = floatBitsToUint(m);
      bo.d[pb + 1u] = floatBitsToUint(l);
    }
    for (uint k = 0u; k * 64u < Dv; ++k) {
      uint d = tid + 64u * k;
      if (d >= Dv) break;
      bo.d[pb + 2u + d] = floatBitsToUint(acc[k]);
    }
    return;
  }
  uint ob = (t * Hq + j) * Dv;
  for (uint k = 0u; k * 64u < Dv; ++k) {
    uint d = tid + 64u * k;
    if (d >= Dv) break;
    bo.d[ob + d] = floatBitsToUint(l > 0.0 ? acc[k] / l : 0.0);  // no visible slot: zeros
  }
}
