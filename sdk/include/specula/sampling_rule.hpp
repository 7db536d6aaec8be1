// The top-p draw (Op::TopPDraw) as one rule that a host and any device compute bit for bit: float32,
// sums in a fixed order, and only operations IEEE and Vulkan both round correctly (+, -, *, floor, and
// scaling by a power of two): no division, no library exp. The standard sampler (its host form and
// Sampler::distribution), the CPU backend and the Vulkan shader top_p_draw.comp all follow it, so a
// sampled step gives the same token wherever it runs. docs/sampling.md, "The draw".
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace specula {

// The indices of the k highest values of x, highest first, ties by the lower index (TopK's order and the
// host sampler's), written to out[0..k). A small k (k <= n / 8, a sampler's top-k) is one pass against the
// k-th best so far; a larger one a partial sort.
void top_k_order(std::span<const float> x, int64_t k, int32_t* out);

// e^d for d <= 0: round-half-up n = floor(d * log2(e) + 0.5), Cody-Waite r = d - n ln2_hi - n ln2_lo,
// a degree-6 Taylor polynomial in Horner form (no fused multiply-add), times 2^n. 0 when d <= -87 or
// n < -125 (no subnormals, which GPUs may flush); exactly 1 at d = 0. Within a few ulp of e^d.
float rule_exp(float d);

// A candidate's weight: rule_exp(x * inv_temperature - top), the product rounded before the difference;
// top = (the row's highest logit) * inv_temperature, rounded once. top_p_set's w_k, and the weight any
// other reader of the same row (AcceptDrafts) gives a token.
float rule_weight(float x, float inv_temperature, float top);

// The kept candidates of logits `x` sorted descending (a top-K), in float32:
//   w_k = rule_exp(x_k * inv_temperature - x_0 * inv_temperature)   (w_0 = 1)
//   min_p > 0: keep the prefix with w_k >= min_p (at least one);
//   total = w_0 + w_1 + ... over it, left to right;
//   top_p < 1: keep the shortest prefix whose running sum reaches top_p * total;
//   mass = the running sum over the kept prefix.
// inv_temperature is 1.0f / temperature rounded once (Graph::top_p_draw stores it as f[3]).
struct TopPSet {
  std::vector<float> w;  // every candidate's weight
  size_t keep = 0;       // candidates kept (>= 1)
  float mass = 0;        // running sum of the kept weights
};
TopPSet top_p_set(std::span<const float> x, float inv_temperature, float top_p, float min_p);

// The index drawn from a set: the first k whose running sum exceeds clamp(u, 0, 1) * mass, else (u * mass
// rounded up to the mass) the last kept candidate with a nonzero weight.
size_t top_p_pick(const TopPSet& set, float uniform);

// The inverse-CDF draw over weights `w` whose left-to-right sum is `total`, as top_p_pick: the first k
// whose running sum exceeds clamp(u, 0, 1) * total, else the last k with w[k] > 0 (0 when there is none).
size_t pick_by_weight(std::span<const float> w, float total, float uniform);

// The speculative verdict on one draft d (docs/sampling.md, "Speculative sampling"), in float32 like the
// draw, so the host engine and a backend's AcceptDrafts decide alike. p: the target's kept candidates in
// order, weights p_w summing (left to right) to p_mass; q_w_of_p[k]: the drafter's weight of p's
// candidate k (0 where the drafter does not keep it); pd, qd: the draft's weight under p (0 when p does
// not keep it) and under q; q_mass: the drafter's kept mass. The rule u q(d) < p(d), times both masses:
//   accepted when (qd * p_mass) * u_accept < pd * q_mass; returns -1;
//   else r_k = p_w[k] * q_mass - q_w_of_p[k] * p_mass where that is >= FLT_MIN (else 0, so that no
//   subnormal, which a GPU may flush, enters a sum), and the replacement is
//   pick_by_weight(r, sum of r, u_residual), or pick_by_weight(p_w, p_mass, u_residual) when every r_k is
//   0 (p = q up to rounding); returns its index into p.
int64_t speculative_verdict(std::span<const float> p_w, float p_mass, std::span<const float> q_w_of_p, float pd,
                            float qd, float q_mass, float u_accept, float u_residual);

}  // namespace specula
