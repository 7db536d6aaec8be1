// Compiled with -ffp-contract=off (sdk/CMakeLists.txt): every product and sum rounds on its own, as the
// Vulkan shader's `precise` arithmetic does.
#include "specula/sampling_rule.hpp"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <vector>

#include "specula/error.hpp"

namespace specula {

void top_k_order(std::span<const float> x, int64_t k, int32_t* out) {
  const auto n = static_cast<int64_t>(x.size());
  if (k < 1 || k > n) fail("top-k of {} over {} values", k, n);
  // Ranked by value, then lower index: a total order, so both methods give the same list.
  const auto better = [&](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
  if (k * 8 > n) {
    std::vector<int32_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), better);
    std::copy(idx.begin(), idx.begin() + k, out);
    return;
  }
  // Candidates collect in a buffer of 2k; when it is full the best k stay and the k-th's value becomes the
  // bar. A later index only enters when strictly above it (an equal value ranks after it).
  std::vector<int32_t> idx(static_cast<size_t>(2 * k));
  size_t used = 0;
  bool barred = false;
  float bar = 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    if (barred && !(x[j] > bar)) continue;
    if (used == idx.size()) {
      std::nth_element(idx.begin(), idx.begin() + (k - 1), idx.end(), better);
      used = static_cast<size_t>(k);
      bar = x[idx[static_cast<size_t>(k - 1)]];
      barred = true;
      if (!(x[j] > bar)) continue;
    }
    idx[used++] = static_cast<int32_t>(j);
  }
  std::partial_sort(idx.begin(), idx.begin() + k, idx.begin() + static_cast<std::ptrdiff_t>(used), better);
  std::copy(idx.begin(), idx.begin() + k, out);
}

float rule_exp(float d) {
  if (!(d > -87.0f)) return 0.0f;
  const float n = std::floor(d * 1.44269504f + 0.5f);
  if (n < -125.0f) return 0.0f;
  float r = d - n * 0.693145751953125f;  // ln 2 high part: n * it is exact
  r = r - n * 1.42860677e-06f;          // ln 2 low part
  float p = 1.38888889e-3f;
  p = p * r + 8.33333333e-3f;
  p = p * r + 4.16666667e-2f;
  p = p * r + 1.66666667e-1f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const auto e = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(e);
}

float rule_weight(float x, float inv_temperature, float top) { return rule_exp(x * inv_temperature - top); }

TopPSet top_p_set(std::span<const float> x, float inv_temperature, float top_p, float min_p) {
  if (x.empty()) fail("top-p draw over no candidates");
  TopPSet s;
  s.w.resize(x.size());
  const float top = x[0] * inv_temperature;
  for (size_t k = 0; k < x.size(); ++k) s.w[k] = rule_weight(x[k], inv_temperature, top);
  size_t n = x.size();
  if (min_p > 0.0f) {
    n = 1;
    while (n < x.size() && s.w[n] >= min_p) ++n;
  }
  s.keep = n;
  if (top_p < 1.0f) {
    float total = 0.0f;
    for (size_t k = 0; k < n; ++k) total += s.w[k];
    const float target = top_p * total;
    float cum = 0.0f;
    for (size_t k = 0; k < n; ++k) {
      cum += s.w[k];
      if (cum >= target) {
        s.keep = k + 1;
        break;
      }
    }
  }
  for (size_t k = 0; k < s.keep; ++k) s.mass += s.w[k];
  return s;
}

size_t top_p_pick(const TopPSet& s, float uniform) {
  return pick_by_weight(std::span<const float>(s.w).first(s.keep), s.mass, uniform);
}

size_t pick_by_weight(std::span<const float> w, float total, float uniform) {
  const float target = std::clamp(uniform, 0.0f, 1.0f) * total;
  float cum = 0.0f;
  size_t last = 0;
  for (size_t k = 0; k < w.size(); ++k) {
    cum += w[k];
    if (cum > target) return k;
    if (w[k] > 0.0f) last = k;
  }
  return last;
}

int64_t speculative_verdict(std::span<const float> p_w, float p_mass, std::span<const float> q_w_of_p, float pd,
                            float qd, float q_mass, float u_accept, float u_residual) {
  if (p_w.empty() || q_w_of_p.size() != p_w.size())
    fail("speculative verdict: {} target weights and {} drafter weights of them", p_w.size(), q_w_of_p.size());
  // Weights are 0 or normal floats (rule_exp), masses >= 1: a product below FLT_MIN, which a GPU may
  // flush to 0, can only be the left side here, and then it is below the right side either way.
  if (qd * p_mass * u_accept < pd * q_mass) return -1;
  std::vector<float> r(p_w.size());
  float total = 0.0f;
  for (size_t k = 0; k < p_w.size(); ++k) {
    const float d = p_w[k] * q_mass - q_w_of_p[k] * p_mass;
    r[k] = d >= FLT_MIN ? d : 0.0f;  // a subnormal difference counts as 0 on every device
    total += r[k];
  }
  if (!(total > 0.0f)) return static_cast<int64_t>(pick_by_weight(p_w, p_mass, u_residual));
  return static_cast<int64_t>(pick_by_weight(r, total, u_residual));
}

}  // namespace specula
