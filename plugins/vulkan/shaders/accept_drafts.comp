#version 450
// AcceptDrafts (a sampled speculative round) by the SDK's rule, as the CPU backend computes it
// (plugins/cpu/draw.cpp: RowSet, accept_drafts; sdk/src/sampling_rule.cpp: top_p_set, pick_by_weight,
// speculative_verdict): one thread, float32, sums left to right, every product and sum `precise`, no
// division and no built-in exp, so the verdict is the CPU's bit for bit. Weights are recomputed where
// needed (each time the same value) instead of being stored.
// b0 target logits F32 [n + 1, V], b1 their TopK I32 [n + 1, K], b2 the drafter's logits F32 [n, V],
// b3 their TopK I32 [n, Kq], b4 drafts I32 [n], b5 uniforms F32 [2n + 1] -> bo I32 [n + 2] =
// [a, t_0 .. t_a, -1 ...]. A draft outside [0, V) is reported (err) and nothing is decided.
// Push constants: PC_AD_* (push_constants.h). The lowering bounds the loop iterations for CPU devices
// (vk_lower.cpp); keep the two in step.
#include "common.glsl"
#include "sampling_rule.glsl"
layout(local_size_x = 1) in;

uint V, K, KQ;
float TOP_P, MIN_P, IT;

// Row i of the target's (q = false) or the drafter's (q = true) logits and TopK.
float logit(bool q, uint i, uint t) { return uintBitsToFloat(q ? b2.d[i * V + t] : b0.d[i * V + t]); }
uint top_id(bool q, uint i, uint k) { return q ? b3.d[i * KQ + k] : b1.d[i * K + k]; }

// A row's distribution: specula::top_p_set over its TopK prefix (keep, mass), and what weight() needs.
struct RowSet {
  bool q;
  uint row;
  float top;     // x_0 * inv_t
  uint keep;     // candidates kept (>= 1)
  float mass;    // running sum of the kept weights
  uint last;     // the last kept candidate's token
  float x_last;  // and its logit
};

// Weight of TopK candidate k of the row (top_p_set's w_k).
float cand(RowSet s, uint k) { return scaled_weight(logit(s.q, s.row, top_id(s.q, s.row, k)), s.top, IT); }

RowSet row_set(bool q, uint i) {
  uint width = q ? KQ : K;
  RowSet s;
  s.q = q;
  s.row = i;
  precise float top = logit(q, i, top_id(q, i, 0u)) * IT;
  s.top = top;
  uint n = width;
  if (MIN_P > 0.0) {
    n = 1u;
    while (n < width && cand(s, n) >= MIN_P) ++n;
  }
  uint keep = n;
  if (TOP_P < 1.0) {
    precise float total = 0.0;
    for (uint k = 0u; k < n; ++k) total += cand(s, k);
    precise float target = TOP_P * total;
    precise float cum = 0.0;
    for (uint k = 0u; k < n; ++k) {
      cum += cand(s, k);
      if (cum >= target) {
        keep = k + 1u;
        break;
      }
    }
  }
  precise float mass = 0.0;
  for (uint k = 0u; k < keep; ++k) mass += cand(s, k);
  s.keep = keep;
  s.mass = mass;
  s.last = top_id(q, i, keep - 1u);
  s.x_last = logit(q, i, s.last);
  return s;
}

// Token t's weight under the row: kept iff it ranks (by logit, then lower id) at or before the last
// kept candidate; 0 otherwise.
float weight(RowSet s, uint t) {
  float x = logit(s.q, s.row, t);
  bool kept = x > s.x_last || (x == s.x_last && t <= s.last);
  return kept ? scaled_weight(x, s.top, IT) : 0.0;
}

// r_k of the residual max(p - q, 0), both scaled by the other's mass: p_w[k] q_mass - q(p's k) p_mass,
// 0 below FLT_MIN (no subnormal enters a sum).
float residual(RowSet p, RowSet q, uint k) {
  precise float a = cand(p, k) * q.mass;
  precise float b = weight(q, top_id(false, p.row, k)) * p.mass;
  precise float r = a - b;
  return r >= uintBitsToFloat(0x00800000u) ? r : 0.0;
}

// specula::pick_by_weight over p's kept candidates, with weights r_k (res) or p's own, summing to total.
uint pick(RowSet p, RowSet q, bool res, float total, float u) {
  precise float target = clamp(u, 0.0, 1.0) * total;
  precise float cum = 0.0;
  uint last = 0u;
  for (uint k = 0u; k < p.keep; ++k) {
    float w = res ? residual(p, q, k) : cand(p, k);
    cum += w;
    if (cum > target) return k;
    if (w > 0.0) last = k;
  }
  return last;
}

float uniform_at(uint k) { return uintBitsToFloat(b5.d[k]); }

void main() {
  uint N = pc.p[PC_AD_N];
  V = pc.p[PC_AD_V];
  K = pc.p[PC_AD_K];
  KQ = pc.p[PC_AD_KQ];
  TOP_P = pf(PC_AD_TOP_P);
  MIN_P = pf(PC_AD_MIN_P);
  IT = pf(PC_AD_INV_T);
  for (uint j = 0u; j < N + 2u; ++j) bo.d[j] = 0xFFFFFFFFu;  // -1
  for (uint i = 0u; i < N; ++i) {
    int d = int(b4.d[i]);
    if (d < 0 || d >= int(V)) {
      report(pc.p[PC_AD_NODE], uint(d), i);
      return;
    }
  }
  uint accepted = 0u;
  for (uint i = 0u; i <= N; ++i) {
    RowSet p = row_set(false, i);
    if (i == N) {  // every draft accepted: the bonus from the last row
      bo.d[1u + i] = top_id(false, i, pick(p, p, false, p.mass, uniform_at(2u * N)));
      break;
    }
    RowSet q = row_set(true, i);
    uint d = b4.d[i];
    float pd = weight(p, d), qd = weight(q, d);
    // speculative_verdict: accepted when (qd * p_mass) * u_accept < pd * q_mass.
    precise float lhs = qd * p.mass;
    lhs = lhs * uniform_at(2u * i);
    precise float rhs = pd * q.mass;
    if (lhs < rhs) {
      bo.d[1u + i] = d;
      ++accepted;
      continue;
    }
    precise float total = 0.0;
    for (uint k = 0u; k < p.keep; ++k) total += residual(p, q, k);
    float u = uniform_at(2u * i + 1u);
    uint v = total > 0.0 ? pick(p, q, true, total, u) : pick(p, q, false, p.mass, u);
    bo.d[1u + i] = top_id(false, i, v);
    break;
  }
  bo.d[0] = accepted;
}
