// The device sampler's ops on the CPU. top_p_draw repeats the host sampler's arithmetic step for step
// in double (plugins/sampler_standard), so the two agree bit for bit; this file is compiled with
// -ffp-contract=off so no multiply-add is fused differently from the host's.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels.hpp"
#include "specula/error.hpp"

namespace specula::cpu {

void clamp(const float* x, int64_t n, float lo, float hi, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] < lo ? lo : (x[i] > hi ? hi : x[i]);
}

void scatter(const float* a, int64_t n, const int32_t* ids, const float* values, int64_t m, float* out,
             const std::string& node_name) {
  for (int64_t j = 0; j < m; ++j)
    if (ids[j] < 0 || ids[j] >= n)
      fail("CPU backend: Scatter '{}': id {} at index {} is outside [0, {})", node_name, ids[j], j, n);
  std::memcpy(out, a, static_cast<size_t>(n) * sizeof(float));
  for (int64_t j = 0; j < m; ++j) out[ids[j]] = values[j];
}

int32_t top_p_draw(const float* logits, const int32_t* ids, int64_t k, float uniform, float temperature,
                   float top_p, float min_p) {
  const double inv_t = 1.0 / static_cast<double>(temperature);
  const float m = *std::max_element(logits, logits + k);
  const double top = static_cast<double>(m) * inv_t;
  std::vector<double> prob(static_cast<size_t>(k));
  double sum = 0.0;
  for (int64_t i = 0; i < k; ++i) sum += prob[i] = std::exp(static_cast<double>(logits[i]) * inv_t - top);
  for (double& q : prob) q /= sum;
  if (min_p > 0.0f) {
    // Probabilities are descending: min-p keeps a prefix, renormalised.
    const double floor = static_cast<double>(min_p) * prob[0];
    size_t n = 1;
    while (n < prob.size() && prob[n] >= floor) ++n;
    prob.resize(n);
    double kept = 0.0;
    for (double q : prob) kept += q;
    for (double& q : prob) q /= kept;
    k = static_cast<int64_t>(n);
  }
  int64_t keep = k;
  if (top_p < 1.0f) {
    double cum = 0.0;
    for (int64_t i = 0; i < k; ++i) {
      cum += prob[i];
      if (cum >= static_cast<double>(top_p)) {
        keep = i + 1;
        break;
      }
    }
  }
  double mass = 0.0;
  for (int64_t i = 0; i < keep; ++i) mass += prob[i];
  const double target = static_cast<double>(std::clamp(uniform, 0.0f, 1.0f)) * mass;
  double cum = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    cum += prob[i];
    if (cum > target) return ids[i];
  }
  return ids[keep - 1];
}

}  // namespace specula::cpu
