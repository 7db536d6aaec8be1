// The top-p draw (Op::TopPDraw) as one rule that a host and any device compute bit for bit: float32,
// sums in a fixed order, and only operations IEEE and Vulkan both round correctly (+, -, *, floor, and
// scaling by a power of two): no division, no library exp. The standard sampler (its host form and
// Sampler::distribution), the CPU backend and the Vulkan shader top_p_draw.comp all follow it, so a
// sampled step gives the same token wherever it runs. docs/sampling.md, "The draw".
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace specula {

// e^d for d <= 0: round-half-up n = floor(d * log2(e) + 0.5), Cody-Waite r = d - n ln2_hi - n ln2_lo,
// a degree-6 Taylor polynomial in Horner form (no fused multiply-add), times 2^n. 0 when d <= -87 or
// n < -125 (no subnormals, which GPUs may flush); exactly 1 at d = 0. Within a few ulp of e^d.
float rule_exp(float d);

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

// The index drawn from a set: the first k whose running sum exceeds clamp(u, 0, 1) * mass, else the last
// kept.
size_t top_p_pick(const TopPSet& set, float uniform);

}  // namespace specula
